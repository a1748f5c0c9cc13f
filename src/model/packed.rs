//! Where the packed copies of a model's matrices lie in one buffer (`Bf16Weights`' tiles,
//! `F32Panels`): one allocation for all of them, so that the kernel may back it with huge
//! pages as it does the parameters (a lone decoding row streams a copy in 4 KiB pages at
//! 0.7× the speed), and the bytes a copy will take, counted before it is made.

use crate::config::params::{ParamLayout, ParamSpec};
use std::ops::Range;

/// Each matrix's place in the buffer, by its offset in the model's layout.
pub(crate) struct Places {
    /// (offset of the matrix in the layout, where its copy starts in the buffer, its length)
    places: Vec<(usize, usize, usize)>,
    /// values in the buffer
    pub total: usize,
}

impl Places {
    /// The places of the matrices of `layout` that `keep` picks, each `len(oc, c)` values,
    /// one after another in the order of their offsets; with the matrices' specs, in that order.
    pub fn new(
        layout: &ParamLayout,
        keep: impl Fn(&ParamSpec) -> bool,
        len: impl Fn(usize, usize) -> usize,
    ) -> (Self, Vec<&ParamSpec>) {
        let mut specs: Vec<_> = layout
            .specs
            .iter()
            .filter(|s| s.shape.len() == 2 && keep(s))
            .collect();
        specs.sort_by_key(|s| s.offset);
        let (mut places, mut total) = (Vec::with_capacity(specs.len()), 0);
        for s in &specs {
            let n = len(s.shape[0], s.shape[1]);
            places.push((s.offset, total, n));
            total += n;
        }
        (Places { places, total }, specs)
    }

    /// Where the copy of the matrix at `offset` lies in the buffer, if it has one.
    pub fn find(&self, offset: usize) -> Option<Range<usize>> {
        let i = self.places.binary_search_by_key(&offset, |p| p.0).ok()?;
        let (_, at, n) = self.places[i];
        Some(at..at + n)
    }

    /// Each matrix's place, in the order of `new`'s specs.
    pub fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.places.iter().map(|&(_, at, n)| at..at + n)
    }
}

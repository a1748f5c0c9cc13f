//! The f32 weights of a model's linear layers packed in panels (`kernels::gemm::panels`), which
//! cached forwards of a few rows a product read instead of the weights' rows: a server's
//! decoding batch, and batched generation.

use super::packed::Places;
use super::Model;
use crate::config::params::{ParamLayout, ParamSpec};
use crate::kernels::gemm::{panels, Weight};

pub struct F32Panels {
    /// parameters in the model's layout (to check the copy belongs to it)
    len: usize,
    /// every matrix's panels, one after another, in one buffer (`Places`)
    data: Vec<f32>,
    places: Places,
}

/// Every matrix a product reads: not an input embedding table that the LM head does not share.
fn places(l: &ParamLayout) -> (Places, Vec<&ParamSpec>) {
    let lookup = l.lm_head.map(|_| l.embed_tokens.offset);
    Places::new(l, |s| Some(s.offset) != lookup, panels::packed_len)
}

impl F32Panels {
    pub(crate) fn new(model: &Model) -> Self {
        let (places, specs) = places(&model.layout);
        let mut data = crate::kernels::zeroed(places.total);
        for (s, at) in specs.iter().zip(places.ranges()) {
            let (oc, c) = (s.shape[0], s.shape[1]);
            panels::pack_into(&mut data[at], &model.params[s.range()], oc, c);
        }
        F32Panels {
            len: model.params.len(),
            data,
            places,
        }
    }

    /// The bytes `new` takes for a model of this layout.
    pub(crate) fn bytes_for(l: &ParamLayout) -> usize {
        4 * places(l).0.total
    }

    /// Whether this copy was taken from parameters of `n` values.
    pub(crate) fn fits(&self, n: usize) -> bool {
        self.len == n
    }

    /// `w` with the panels of the matrix at `offset`, where it is read as f32.
    pub(crate) fn attach<'a>(copies: Option<&'a Self>, w: Weight<'a>, offset: usize) -> Weight<'a> {
        let plain = w.quant.is_none() && w.bf16.is_none() && w.tiles.is_none();
        let panels = copies
            .filter(|_| plain)
            .and_then(|p| Some(&p.data[p.places.find(offset)?]));
        Weight { panels, ..w }
    }

    pub(crate) fn bytes(&self) -> usize {
        4 * self.data.len()
    }
}

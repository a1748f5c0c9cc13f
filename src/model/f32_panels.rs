//! The f32 weights of a model's linear layers packed in panels (`kernels::gemm::panels`), which
//! cached forwards of a few rows a product read instead of the weights' rows: a server's
//! decoding batch, and batched generation.

use super::Model;
use crate::kernels::gemm::{panels, Weight};

pub struct F32Panels {
    /// parameters in the model's layout (to check the copy belongs to it)
    len: usize,
    /// every matrix's panels, one after another, in one buffer that the kernel may back with
    /// huge pages, as it does the model's parameters
    data: Vec<f32>,
    /// (offset of the matrix in the layout, where its panels start in `data`, their length),
    /// by offset
    mats: Vec<(usize, usize, usize)>,
}

impl F32Panels {
    pub(crate) fn new(model: &Model) -> Self {
        // every matrix a product reads: not an input embedding table the LM head does not share
        let l = &model.layout;
        let lookup = l.lm_head.map(|_| l.embed_tokens.offset);
        let mut specs: Vec<_> = l
            .specs
            .iter()
            .filter(|s| s.shape.len() == 2 && Some(s.offset) != lookup)
            .collect();
        specs.sort_by_key(|s| s.offset);
        let mut mats = Vec::with_capacity(specs.len());
        let mut start = 0;
        for s in &specs {
            let len = panels::packed_len(s.shape[0], s.shape[1]);
            mats.push((s.offset, start, len));
            start += len;
        }
        let mut data = crate::kernels::zeroed(start);
        for (s, &(_, at, len)) in specs.iter().zip(&mats) {
            let (oc, c) = (s.shape[0], s.shape[1]);
            panels::pack_into(&mut data[at..at + len], &model.params[s.range()], oc, c);
        }
        F32Panels {
            len: model.params.len(),
            data,
            mats,
        }
    }

    /// Whether this copy was taken from parameters of `n` values.
    pub(crate) fn fits(&self, n: usize) -> bool {
        self.len == n
    }

    /// `w` with the panels of the matrix at `offset`, where it is read as f32.
    pub(crate) fn attach<'a>(copies: Option<&'a Self>, w: Weight<'a>, offset: usize) -> Weight<'a> {
        let plain = w.quant.is_none() && w.bf16.is_none() && w.tiles.is_none();
        let panels = copies.filter(|_| plain).and_then(|p| {
            let i = p.mats.binary_search_by_key(&offset, |m| m.0).ok()?;
            let (_, at, len) = p.mats[i];
            Some(&p.data[at..at + len])
        });
        Weight { panels, ..w }
    }

    pub(crate) fn bytes(&self) -> usize {
        4 * self.data.len()
    }
}

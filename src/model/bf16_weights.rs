//! The bf16 copy of a model's weights that inference reads with `--bf16`, in one of two
//! forms: on AVX512_BF16 CPUs every matrix packed once as tiles, which prefill multiplies without
//! packing each weight again on every forward pass and decoding's matrix-vector products read
//! (half the bytes of f32); elsewhere every parameter as bf16 rows for decoding only.

use super::Model;
use crate::kernels::gemm::Weight;
use std::ops::Range;

pub struct Bf16Weights {
    /// parameters in the model's layout (to check the copy belongs to it)
    len: usize,
    /// without AVX512_BF16: every parameter rounded to bf16 (nearest even), in the model's layout
    rows: Vec<u16>,
    /// with AVX512_BF16: (offset of the matrix in the layout, its tiles), by offset
    tiles: Vec<(usize, Vec<u16>)>,
}

impl Bf16Weights {
    pub(crate) fn new(model: &Model) -> Self {
        let (mut rows, mut tiles) = (Vec::new(), Vec::new());
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::gemm::cpu::avx512_bf16() {
            for spec in model.layout.specs.iter().filter(|s| s.shape.len() == 2) {
                let (oc, c) = (spec.shape[0], spec.shape[1]);
                let w = &model.params[spec.range()];
                tiles.push((
                    spec.offset,
                    crate::kernels::gemm::bf16::pack_weight(w, oc, c),
                ));
            }
            tiles.sort_by_key(|t| t.0);
        }
        if tiles.is_empty() {
            rows = model
                .params
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
        }
        Bf16Weights {
            len: model.params.len(),
            rows,
            tiles,
        }
    }

    /// Whether this copy was taken from parameters of `n` values.
    pub(crate) fn fits(&self, n: usize) -> bool {
        self.len == n
    }

    /// The weight at `r` of `params` (the f32 values), with its bf16 rows and tiles.
    pub(crate) fn weight<'a>(&'a self, params: &'a [f32], r: Range<usize>) -> Weight<'a> {
        let tiles = self
            .tiles
            .binary_search_by_key(&r.start, |t| t.0)
            .ok()
            .map(|i| &self.tiles[i].1[..]);
        Weight {
            f32: &params[r.clone()],
            bf16: (!self.rows.is_empty()).then(|| &self.rows[r]),
            tiles,
            quant: None,
            panels: None,
        }
    }

    /// The weight at `r` of `params`, with the bf16 copies where `copies` holds them.
    pub(crate) fn weight_of<'a>(
        copies: Option<&'a Self>,
        params: &'a [f32],
        r: Range<usize>,
    ) -> Weight<'a> {
        match copies {
            Some(b) => b.weight(params, r),
            None => Weight::from(&params[r]),
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        2 * (self.rows.len() + self.tiles.iter().map(|t| t.1.len()).sum::<usize>())
    }
}

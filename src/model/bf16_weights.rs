//! The bf16 copy of a model's weights that inference reads with `--bf16`, in one of two
//! forms: on AVX512_BF16 CPUs every matrix packed once as tiles, which prefill multiplies without
//! packing each weight again on every forward pass and decoding's matrix-vector products read
//! (half the bytes of f32); elsewhere every parameter as bf16 rows for decoding only.

use super::packed::Places;
use super::Model;
use crate::config::params::{ParamLayout, ParamSpec};
use crate::kernels::gemm::Weight;
use std::ops::Range;

pub struct Bf16Weights {
    /// parameters in the model's layout (to check the copy belongs to it)
    len: usize,
    /// without AVX512_BF16: every parameter rounded to bf16 (nearest even), in the model's layout
    rows: Vec<u16>,
    /// with AVX512_BF16: every matrix's tiles, one after another, in one buffer (`Places`)
    data: Vec<u16>,
    tiles: Places,
}

/// Every matrix, in tiles, where the CPU multiplies bf16 (none elsewhere).
fn places(l: &ParamLayout) -> (Places, Vec<&ParamSpec>) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::gemm::cpu::avx512_bf16() {
        return Places::new(l, |_| true, crate::kernels::gemm::bf16::packed_len);
    }
    Places::new(l, |_| false, |_, _| 0)
}

impl Bf16Weights {
    pub(crate) fn new(model: &Model) -> Self {
        let (tiles, specs) = places(&model.layout);
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let mut data = crate::kernels::zeroed_u16(tiles.total);
        for (s, at) in specs.iter().zip(tiles.ranges()) {
            #[cfg(target_arch = "x86_64")]
            {
                let w = &model.params[s.range()];
                crate::kernels::gemm::bf16::pack_weight_into(
                    &mut data[at],
                    w,
                    s.shape[0],
                    s.shape[1],
                );
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (s, at);
        }
        let rows = match specs.is_empty() {
            true => model
                .params
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect(),
            false => Vec::new(),
        };
        Bf16Weights {
            len: model.params.len(),
            rows,
            data,
            tiles,
        }
    }

    /// The bytes `new` takes for a model of this layout on this CPU.
    pub(crate) fn bytes_for(l: &ParamLayout) -> usize {
        match places(l).0.total {
            0 => 2 * l.total,
            tiles => 2 * tiles,
        }
    }

    /// Whether this copy was taken from parameters of `n` values.
    pub(crate) fn fits(&self, n: usize) -> bool {
        self.len == n
    }

    /// The weight at `r` of `params` (the f32 values), with its bf16 rows and tiles.
    pub(crate) fn weight<'a>(&'a self, params: &'a [f32], r: Range<usize>) -> Weight<'a> {
        let tiles = self.tiles.find(r.start).map(|at| &self.data[at]);
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
        2 * (self.rows.len() + self.data.len())
    }
}

//! The precision of the matrix products, which the caller picks and passes in (a model's
//! `precision`, which its `Workspace` takes; the kernels' `precision` arguments).

use super::gemm::cpu::avx512_bf16;

/// The operands of the matrix products: f32, or bf16 (rounded to nearest even while they are
/// packed, multiplied and accumulated in f32; kernels/gemm/bf16.rs). Weights, gradients and every
/// other op stay f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32,
    /// Only where the CPU has AVX512_BF16 (`Precision::new` refuses it elsewhere; a `Bf16`
    /// built by hand on such a CPU runs f32 products).
    Bf16,
}

impl Precision {
    /// `Bf16` with `bf16`, else `F32`; `None` for bf16 on a CPU without AVX512_BF16.
    pub fn new(bf16: bool) -> Option<Precision> {
        match bf16 {
            false => Some(Precision::F32),
            true if avx512_bf16() => Some(Precision::Bf16),
            true => None,
        }
    }

    /// What bf16 products need, for the one-line refusal where `new(true)` is `None`.
    pub fn bf16_requirement() -> &'static str {
        if cfg!(target_arch = "aarch64") {
            "an x86-64 CPU with AVX512_BF16 (difftx has no ARM64 bf16 kernels yet)"
        } else {
            "a CPU with AVX512_BF16 (AMD Zen 4 or later, Intel Cooper Lake or later)"
        }
    }

    /// Whether the products run in bf16: asked for, and the CPU can.
    pub fn is_bf16(self) -> bool {
        self == Precision::Bf16 && avx512_bf16()
    }
}

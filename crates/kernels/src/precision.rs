//! The precision of the matrix products, which the caller picks and passes in (a model's
//! `precision`, which its `Workspace` takes; the kernels' `precision` arguments).

use super::gemm::cpu::bf16_products;

/// The operands of the matrix products: f32, or bf16 (rounded to nearest even while they are
/// packed, multiplied and accumulated in f32; kernels/gemm/bf16.rs, on ARM64 bf16_neon.rs).
/// Weights, gradients and every other op stay f32 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    #[default]
    F32,
    /// Only where the CPU has AVX512_BF16, or on ARM64 `bf16` (`Precision::new` refuses it
    /// elsewhere; a `Bf16` built by hand on another CPU runs f32 products). On ARM64 the
    /// linear layers' products run in bf16 and the attention's small ones stay f32.
    Bf16,
}

impl Precision {
    /// `Bf16` with `bf16`, else `F32`; `None` for bf16 on a CPU without bf16 products
    /// (`bf16_requirement`).
    pub fn new(bf16: bool) -> Option<Precision> {
        match bf16 {
            false => Some(Precision::F32),
            true if bf16_products() => Some(Precision::Bf16),
            true => None,
        }
    }

    /// What bf16 products need, for the one-line refusal where `new(true)` is `None`.
    pub fn bf16_requirement() -> &'static str {
        if cfg!(target_arch = "aarch64") {
            "an ARM64 CPU with the bf16 extension (BFMMLA: Apple M2 or later, Graviton 3 or later)"
        } else {
            "a CPU with AVX512_BF16 (AMD Zen 4 or later, Intel Cooper Lake or later)"
        }
    }

    /// Whether the products run in bf16: asked for, and the CPU can.
    pub fn is_bf16(self) -> bool {
        self == Precision::Bf16 && bf16_products()
    }
}

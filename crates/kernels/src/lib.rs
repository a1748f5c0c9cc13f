//! difftx's numeric core (re-exported by `difftx` as `difftx::kernels`): each file holds one op's forward and backward over flat f32 buffers.
//! Backward passes write an input's gradient where they make its first contribution and add
//! to it after that (`Grad`); parameter gradients accumulate over a step.
//!
//! The map:
//! - gemm/: every matrix product (the AVX-512 f32 and bf16 engines, the attention's small
//!   products) and the linear layers over them; `precision.rs` picks f32 or bf16;
//! - attention*.rs: the flash-style causal attention (training, prefill, decoding, low-bit);
//!   kv_rows.rs: what a KV cache keeps its rows in (f32, bf16, q8_0 blocks);
//! - rmsnorm, rope, swiglu, embedding, cross_entropy, adamw: one op each;
//! - simd.rs: vector helpers, fast exp; simd_neon.rs: ARM64's for decoding; scratch.rs:
//!   thread buffers, sizing, huge pages;
//!   shared.rs: `Grad`, `SharedMut`; pool.rs: running on the rayon pool.

pub mod adamw;
pub mod attention;
mod attention_decode;
pub mod attention_lowbit;
mod attention_parts;
#[cfg(target_arch = "x86_64")]
mod attention_scores;
pub mod cross_entropy;
pub mod embedding;
pub mod gemm;
mod kv_rows;
mod pool;
pub mod precision;
pub mod quant;
pub mod rmsnorm;
pub mod rope;
mod scratch;
mod shared;
mod simd;
#[cfg(target_arch = "aarch64")]
mod simd_neon;
pub mod swiglu;
#[doc(hidden)]
pub mod testutil;

pub use attention::attention_cached;
pub use kv_rows::{KvElem, Q8Block, Row};
pub use pool::{on_pool, on_pool_quiet};
pub use precision::Precision;
pub(crate) use scratch::{ensure, ensure_aligned, with_thread_buffer, ROW_CHUNK};
pub use scratch::{prepare_threads, zeroed, zeroed_u16};
pub use shared::Grad;
pub(crate) use shared::SharedMut;
pub(crate) use simd::prefetch;
#[cfg(target_arch = "x86_64")]
pub(crate) use simd::prefetch_stream;
pub use simd::{
    axpy, axpy_elems, bf16_to_f32, dot, dot3, dot_bf16, dot_elems, exp_nonpos, map_lanes,
    reduce_lanes, scale, sigmoid, sum_lanes, MAX, SUM,
};
#[cfg(target_arch = "x86_64")]
pub(crate) use simd::{
    dot_grid, dot_tree, dot_tree8, exp_nonpos16, lane_mask, transpose16, Lanes16, Lanes8,
};
pub(crate) use simd::{exp_sum, scale_max};
pub use simd::{Elem, NextLines};

/// Test inputs: `n` values uniform in [-scale, scale) from a linear congruential generator
/// whose state is `seed` (advanced), so that a test's draws follow one another.
#[cfg(test)]
pub(crate) fn lcg_values(n: usize, seed: &mut u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((*seed >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::gemm::cpu::{self, Isa};
    use crate::quant::Engine;

    /// The f32 products' kernel, the quantised products' engine and the bf16 products'
    /// kernel this CPU runs, as "f32=… quant=… bf16=…" (bf16=none: `--bf16` is refused).
    fn picked() -> String {
        let f32 = match Isa::detect() {
            Some(Isa::Avx512) => "avx512",
            Some(Isa::Avx2) => "avx2",
            Some(Isa::Neon) => "neon",
            None => "gemm-crate",
        };
        let bf16 = match () {
            _ if cpu::amx() => "amx",
            _ if cpu::avx512_bf16() => "avx512bf16",
            _ if cpu::arm_bf16() => "bfmmla",
            _ => "none",
        };
        let quant = Engine::detect().name();
        format!("f32={f32} quant={quant} bf16={bf16}")
    }

    /// Each kernel is picked where the CPU has its feature and the fallback where not: on
    /// ARM64 the NEON f32 kernel always, SDOT exactly where `dotprod` is (SMMLA where `i8mm`
    /// is too), the NEON integer engine where it is not (never the portable loops; on every
    /// ARM64 CPU among the engines tests run), BFMMLA (and `Precision::new(true)`) exactly
    /// where `bf16` is, else the one-line refusal naming it.
    /// Where the runner names what the (emulated) CPU calls for (`DIFFTX_EXPECT_KERNELS`, set
    /// by scripts/test_arm64.sh for each `qemu -cpu`), exactly that.
    #[test]
    fn picks_the_kernels_the_cpu_calls_for() {
        let got = picked();
        if let Ok(want) = std::env::var("DIFFTX_EXPECT_KERNELS") {
            assert_eq!(got, want, "kernels picked on this CPU");
        }
        if cfg!(target_arch = "aarch64") {
            let quant = match (cpu::dotprod(), cpu::i8mm()) {
                (true, true) => "smmla",
                (true, false) => "sdot",
                _ => "neon",
            };
            let bf16 = if cpu::arm_bf16() { "bfmmla" } else { "none" };
            assert_eq!(got, format!("f32=neon quant={quant} bf16={bf16}"));
            // and the NEON engine beside any faster one, which the engines' tests compare
            assert!(Engine::available().ends_with(&[Engine::Neon, Engine::Portable]));
            let refusal = crate::Precision::bf16_requirement();
            assert!(
                refusal.contains("bf16") && !refusal.contains('\n'),
                "{refusal}"
            );
        }
        let bf16 = crate::Precision::new(true);
        assert_eq!(bf16.is_some(), !got.ends_with("bf16=none"), "{got}");
        assert!(bf16.is_none_or(|p| p.is_bf16()));
        if cfg!(target_arch = "x86_64") && cpu::avx2_fma() {
            assert!(got.starts_with(if cpu::avx512f() {
                "f32=avx512"
            } else {
                "f32=avx2"
            }));
            assert!(!got.ends_with("portable"), "{got}");
        }
    }
}

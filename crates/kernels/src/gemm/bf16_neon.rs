//! The bf16 product's micro-kernel for ARM64 CPUs with the `bf16` extension (ARMv8.6's
//! BFMMLA: Apple M2 on, Neoverse V1/N2/V2 and Graviton 3 on), under `Precision::Bf16`: the
//! f32 driver's (f32.rs) tiles of 8 rows × 12 columns, its packing and its split of the work,
//! with both operands rounded to bf16 (nearest even, as on x86-64) as they are packed and
//! accumulated in f32, as the x86 engines (bf16.rs) do.
//!
//! BFMMLA multiplies a 2 × 4 block of A by a 4 × 2 block of B into a 2 × 2 block of f32 sums
//! (16 multiply-adds in one instruction, four times an `fmla`'s). A packed panel therefore
//! holds its depth in groups of four, each group R rows (or columns) × 4 depths, row-major in
//! bf16: a register of eight bf16 is two rows of the group, which is what BFMMLA takes. The
//! tile's 24 accumulators are 4 row pairs × 6 column pairs of 2 × 2 blocks; a group is 4 loads
//! of A and 6 of B for 24 BFMMLAs (384 multiply-adds), where the f32 kernel's 96 took 5.
//!
//! BFMMLA's sums are not IEEE's: without FEAT_EBF16 each step's four products are added with
//! round-to-odd and denormals flushed, so a sum differs from x86's in its last bits (within
//! the bf16 tests' tolerance, which the products of bf16 operands dwarf).

use super::f32_kernel::{pack_panels, CTile, Kernel};
use std::arch::aarch64::*;

/// Micro-tile: 8 rows × 12 columns, as the f32 NEON kernel (which packs by the same code).
const MR: usize = 8;
const NR: usize = 12;
/// Depths one BFMMLA takes, and a packed group's.
const KS: usize = 4;

/// The BFMMLA kernel.
pub(crate) struct NeonBf16;

impl Kernel for NeonBf16 {
    const MR: usize = MR;
    const NR: usize = NR;
    const KC: usize = 256;
    const MAX_MC: usize = 16 * MR;
    const DEPTH_STEP: usize = KS;

    unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: CTile) {
        // SAFETY: the trait's contract is `kernel`'s; `available` is bf16's.
        unsafe { kernel(kc, ap, bp, tile) }
    }

    unsafe fn transpose_rows<const R: usize>(panel: &mut [f32], rows: &[&[f32]; R], kc: usize) {
        // SAFETY: the same contract, for the f32 kernel's transpose (NEON alone).
        unsafe { <super::f32_neon::Neon as Kernel>::transpose_rows::<R>(panel, rows, kc) }
    }

    fn pack_a_panels(
        p: &mut [f32],
        stride: usize,
        x: &super::Mat,
        d: (usize, usize),
        c: (usize, usize),
    ) {
        pack::<MR>(p, stride, x, d, c)
    }

    fn pack_b_panels(
        p: &mut [f32],
        stride: usize,
        x: &super::Mat,
        d: (usize, usize),
        c: (usize, usize),
    ) {
        pack::<NR>(p, stride, x, d, c)
    }
}

/// The f32 panels of `pack_panels` (depth `kc` from `p0`, columns `j0..j0 + w`), each turned
/// into bf16 groups in place (`to_groups`).
fn pack<const R: usize>(
    panels: &mut [f32],
    stride: usize,
    x: &super::Mat,
    (p0, kc): (usize, usize),
    (j0, w): (usize, usize),
) {
    pack_panels::<R, NeonBf16>(panels, stride, x, (p0, kc), (j0, w));
    for q in 0..w.div_ceil(R) {
        to_groups::<R>(&mut panels[q * stride..][..kc.next_multiple_of(KS) * R], kc);
    }
}

/// An f32 panel (value (p, c) at p·R + c, p < kc) rewritten as bf16 groups of KS depths:
/// value (p, c) rounded to bf16 at u16 index (p / KS)·KS·R + KS·c + p % KS, zero past kc.
/// In place: group g is read whole before it is written, and writes only below where group
/// g + 1 starts (its u16 bytes end at 8R(g + 1), the next group's f32 begin at 16R(g + 1)).
fn to_groups<const R: usize>(panel: &mut [f32], kc: usize) {
    assert!(panel.len() >= kc.next_multiple_of(KS) * R);
    for g in 0..kc.div_ceil(KS) {
        let mut x = [[0f32; R]; KS];
        for (d, x) in x.iter_mut().enumerate().take(kc - KS * g) {
            x.copy_from_slice(&panel[(KS * g + d) * R..][..R]);
        }
        let bits = |d: usize, c: usize| half::bf16::from_f32(x[d][c]).to_bits() as u32;
        // two bf16 a slot, the lower depth in the lower half (little-endian: first in memory)
        for c in 0..R {
            let at = g * KS * R / 2 + 2 * c;
            panel[at] = f32::from_bits(bits(0, c) | bits(1, c) << 16);
            panel[at + 1] = f32::from_bits(bits(2, c) | bits(3, c) << 16);
        }
    }
}

/// acc + the 2 × 2 product of a's two rows of four bf16 by b's two (BFMMLA; through `asm!`:
/// Rust's bf16 vector types and their intrinsics are not stable).
#[target_feature(enable = "neon,bf16")]
#[inline]
fn bfmmla(mut acc: float32x4_t, a: float32x4_t, b: float32x4_t) -> float32x4_t {
    // SAFETY: one instruction of the `bf16` extension this fn requires, between registers.
    unsafe {
        std::arch::asm!(
            ".arch_extension bf16",
            "bfmmla {c:v}.4s, {a:v}.8h, {b:v}.8h",
            c = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

/// C[0..h, 0..w] (row stride ldc) = (or +=) Σ_p ap[p][r] · bp[p][c] over one packed A panel
/// and one packed B panel of depth kc, in bf16 groups (`to_groups`, zero-padded), their
/// products summed in f32.
///
/// # Safety
/// Needs NEON and bf16; the tile's `c` must be valid for h ≤ 8 rows of w ≤ 12 columns at ldc.
#[target_feature(enable = "neon,bf16")]
#[inline(never)]
unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: CTile) {
    let groups = kc.div_ceil(KS);
    // a group: KS·MR bf16 of A (KS·MR / 2 slots of f32), KS·NR of B
    let (ga, gb) = (KS * MR / 2, KS * NR / 2);
    assert!(ap.len() >= groups * ga && bp.len() >= groups * gb);
    let mut acc = [[vdupq_n_f32(0.0); NR / 2]; MR / 2];
    let (mut pa, mut pb) = (ap.as_ptr(), bp.as_ptr());
    for _ in 0..groups {
        // SAFETY: a group's loads stay inside the panels (asserted).
        unsafe {
            let a: [float32x4_t; MR / 2] = std::array::from_fn(|i| vld1q_f32(pa.add(4 * i)));
            for j in 0..NR / 2 {
                let b = vld1q_f32(pb.add(4 * j));
                for (acc, &a) in acc.iter_mut().zip(&a) {
                    acc[j] = bfmmla(acc[j], a, b);
                }
            }
            pa = pa.add(ga);
            pb = pb.add(gb);
        }
    }
    // row pair i's block j holds rows 2i, 2i + 1 of columns 2j, 2j + 1: pairs of blocks side
    // by side are four columns of each row
    let mut rows = [[vdupq_n_f32(0.0); NR / 4]; MR];
    for (i, acc) in acc.iter().enumerate() {
        for q in 0..NR / 4 {
            let (l, r) = (
                vreinterpretq_f64_f32(acc[2 * q]),
                vreinterpretq_f64_f32(acc[2 * q + 1]),
            );
            rows[2 * i][q] = vreinterpretq_f32_f64(vzip1q_f64(l, r));
            rows[2 * i + 1][q] = vreinterpretq_f32_f64(vzip2q_f64(l, r));
        }
    }
    // SAFETY: c valid for h rows of w columns at ldc (this fn's contract).
    unsafe { super::f32_neon::store_tile(&rows, tile) };
}

#[cfg(test)]
mod tests {
    use super::super::{cpu, gemm_on, Backend, Dims, Mat, Out};

    fn round(v: f32) -> f32 {
        half::bf16::from_f32(v).to_f32()
    }

    /// On a CPU with bf16 (`qemu -cpu max`): the product through `Backend::Bf16` against the
    /// exact product of the bf16-rounded operands, at the x86 bf16 tests' tolerance (1e-5 of
    /// Σ|a·b|), and against the f32 product of the rounded operands at the same: every layout,
    /// ragged edges in all three dimensions (depths that end inside a group of four, and past
    /// one packed slice of 256), accumulating, threaded and not. Operands with more bits than
    /// bf16 keeps, so that a product left in f32 would fail.
    #[test]
    fn product_equals_the_product_of_rounded_operands() {
        if !cpu::arm_bf16() {
            eprintln!("skipped: this CPU has no bf16");
            return;
        }
        for (m, n, k) in [
            (1, 1, 1),
            (13, 31, 7),
            (40, 17, 65),
            (64, 96, 64),
            (70, 33, 302),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.3) / 7.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 89) as f32 - 44.1) / 9.0)
                .collect();
            let at: Vec<f32> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|idx| b[(idx % k) * n + idx / k]).collect();
            let (ar, br): (Vec<f32>, Vec<f32>) = (
                a.iter().map(|&v| round(v)).collect(),
                b.iter().map(|&v| round(v)).collect(),
            );
            let mut f32_of_rounded = vec![0f32; m * n];
            let d = Dims::new(m, n, k);
            gemm_on(
                Backend::F32,
                d,
                Mat::rows(&ar, k),
                Mat::rows(&br, n),
                Out::set(&mut f32_of_rounded, n),
            );
            let lhs = [Mat::rows(&a, k), Mat::t(&at, m)];
            let rhs = [Mat::rows(&b, n), Mat::t(&bt, k)];
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                for (li, l) in lhs.iter().enumerate() {
                    for (ri, r) in rhs.iter().enumerate() {
                        let ld = n + 3;
                        let mut out = vec![0.5f32; m * ld];
                        let acc = li == 0;
                        pool.install(|| {
                            gemm_on(Backend::Bf16, d, *l, *r, Out::new(&mut out, ld, acc))
                        });
                        for i in 0..m {
                            for j in 0..ld {
                                let got = out[i * ld + j] as f64;
                                if j >= n {
                                    assert_eq!(got, 0.5, "({i},{j}) past the {n} columns");
                                    continue;
                                }
                                let base = if acc { 0.5 } else { 0.0 };
                                let exact: f64 = (0..k)
                                    .map(|p| ar[i * k + p] as f64 * br[p * n + j] as f64)
                                    .sum();
                                let scale: f64 = (0..k)
                                    .map(|p| (a[i * k + p] * b[p * n + j]).abs() as f64)
                                    .sum();
                                let tol = 1e-5 * (1.0 + scale);
                                let at =
                                    format!("{m}x{n}x{k} lhs{li} rhs{ri} t{threads} ({i},{j})");
                                assert!(
                                    (got - base - exact).abs() <= tol,
                                    "{at}: {got} vs {exact}"
                                );
                                let f = f32_of_rounded[i * n + j] as f64;
                                assert!((got - base - f).abs() <= tol, "{at}: {got} vs f32 {f}");
                            }
                        }
                    }
                }
            }
        }
    }
}

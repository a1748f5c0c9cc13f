//! The f32 product's micro-kernel for ARM64 (NEON, which every ARM64 CPU has; `super::f32`
//! drives it): tiles of 8 rows × 12 columns. Of the 32 128-bit registers, 24 accumulate, three
//! hold a row of the B panel and two the A panel's column, whose values the FMAs take by lane
//! (`fmla v.4s, v.4s, v.s[l]`), so no broadcast is spent.
//!
//! Sized from the published limits: Apple's M-series performance cores and Neoverse N1/V1/V2
//! run two to four 128-bit FMAs a cycle at a latency of 3–4 cycles, so 24 independent
//! accumulators keep four pipes busy; one step of the depth loop is 5 loads for 24 FMAs. A
//! depth of 256 puts an A panel (8 KiB) and a B panel (12 KiB) in the 64 KiB L1D of a
//! Neoverse core (128 KiB on an M-series P-core); a row block of 128 rows (128 KiB packed)
//! stays in a 1 MiB L2.

use super::f32_kernel::CTile;
use std::arch::aarch64::*;

/// Micro-tile: 8 rows × 12 columns = 24 q-register accumulators (of 32).
const MR: usize = 8;
const NR: usize = 12;

/// The NEON kernel.
pub(crate) struct Neon;

super::f32_kernel::f32_kernel!(Neon, kc: 256, max_mc: 16 * MR);

/// C[0..h, 0..w] (row stride ldc) = (or +=) Σ_p ap[p][r] · bp[p][c] over one packed A panel
/// and one packed B panel of depth kc. The panels are zero-padded, so a ragged tile runs the
/// whole tile's FMAs and stores only its h rows and w columns.
///
/// # Safety
/// Needs NEON; the tile's `c` must be valid for h ≤ 8 rows of w ≤ 12 columns at ldc.
#[target_feature(enable = "neon")]
#[inline(never)]
unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: CTile) {
    assert!(ap.len() >= kc * MR && bp.len() >= kc * NR);
    let mut acc = [[vdupq_n_f32(0.0); 3]; MR];
    let (mut pa, mut pb) = (ap.as_ptr(), bp.as_ptr());
    // SAFETY: the panel loads (kc steps of MR and NR values) stay inside ap and bp (asserted).
    unsafe {
        for _ in 0..kc {
            let b = [vld1q_f32(pb), vld1q_f32(pb.add(4)), vld1q_f32(pb.add(8))];
            let (a0, a1) = (vld1q_f32(pa), vld1q_f32(pa.add(4)));
            // row r takes lane r % 4 of a0 (rows 0–3) or a1 (rows 4–7)
            macro_rules! row {
                ($r:expr, $a:expr, $lane:expr) => {
                    for j in 0..3 {
                        acc[$r][j] = vfmaq_laneq_f32::<$lane>(acc[$r][j], b[j], $a);
                    }
                };
            }
            row!(0, a0, 0);
            row!(1, a0, 1);
            row!(2, a0, 2);
            row!(3, a0, 3);
            row!(4, a1, 0);
            row!(5, a1, 1);
            row!(6, a1, 2);
            row!(7, a1, 3);
            pa = pa.add(MR);
            pb = pb.add(NR);
        }
    }
    // SAFETY: c valid for h rows of w columns at ldc (this fn's contract).
    unsafe { store_tile(&acc, tile) };
}

/// The tile's h rows of w columns (+)= `acc`, 8 rows of 12 columns in registers: whole rows
/// by vector stores, a ragged right edge through a row on the stack. Also the bf16 kernel's
/// (bf16_neon.rs), whose tile is the same.
///
/// # Safety
/// Needs NEON; the tile's `c` must be valid for h ≤ 8 rows of w ≤ 12 columns at ldc.
#[target_feature(enable = "neon")]
#[inline]
pub(super) unsafe fn store_tile(acc: &[[float32x4_t; 3]; MR], tile: CTile) {
    let CTile {
        c,
        ldc,
        h,
        w,
        accumulate,
    } = tile;
    assert!(h <= MR && w <= NR);
    // SAFETY: the stores write rows r < h, columns j < w (the contract).
    unsafe {
        for (r, x) in acc.iter().enumerate().take(h) {
            let row = c.add(r * ldc);
            if w == NR {
                for (j, &x) in x.iter().enumerate() {
                    let at = row.add(4 * j);
                    let x = if accumulate {
                        vaddq_f32(x, vld1q_f32(at))
                    } else {
                        x
                    };
                    vst1q_f32(at, x);
                }
            } else {
                let mut sums = [0f32; NR];
                for (j, &x) in x.iter().enumerate() {
                    vst1q_f32(sums.as_mut_ptr().add(4 * j), x);
                }
                for (j, &s) in sums.iter().enumerate().take(w) {
                    let at = row.add(j);
                    *at = if accumulate { s + *at } else { s };
                }
            }
        }
    }
}

/// The 4 × 4 block in r transposed: r[i][j] becomes r[j][i].
///
/// # Safety
/// Needs NEON.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn transpose4(r: &mut [float32x4_t; 4]) {
    // t0 = r00 r10 r02 r12, t1 = r01 r11 r03 r13 (rows 0 and 1 interleaved), t2, t3 likewise
    let (t0, t1) = (vtrn1q_f32(r[0], r[1]), vtrn2q_f32(r[0], r[1]));
    let (t2, t3) = (vtrn1q_f32(r[2], r[3]), vtrn2q_f32(r[2], r[3]));
    // the 64-bit halves swapped across the pairs
    let (t0, t1, t2, t3) = (
        vreinterpretq_f64_f32(t0),
        vreinterpretq_f64_f32(t1),
        vreinterpretq_f64_f32(t2),
        vreinterpretq_f64_f32(t3),
    );
    r[0] = vreinterpretq_f32_f64(vtrn1q_f64(t0, t2));
    r[1] = vreinterpretq_f32_f64(vtrn1q_f64(t1, t3));
    r[2] = vreinterpretq_f32_f64(vtrn2q_f64(t0, t2));
    r[3] = vreinterpretq_f32_f64(vtrn2q_f64(t1, t3));
}

/// panel[p][c] = rows[c][p] for p < kc (a panel of R columns, R a multiple of 4): 4 × 4 blocks
/// transposed in registers, the ragged depth by element.
///
/// # Safety
/// Needs NEON; every row must hold kc values and the panel kc · R.
#[target_feature(enable = "neon")]
unsafe fn transpose_rows<const R: usize>(panel: &mut [f32], rows: &[&[f32]; R], kc: usize) {
    assert!(R.is_multiple_of(4) && panel.len() >= kc * R && rows.iter().all(|r| r.len() >= kc));
    let mut p = 0;
    while p + 4 <= kc {
        for g in 0..R / 4 {
            // SAFETY: 4 values from p + 4 ≤ kc of rows that hold kc (asserted).
            let mut t: [float32x4_t; 4] =
                std::array::from_fn(|i| unsafe { vld1q_f32(rows[4 * g + i].as_ptr().add(p)) });
            // SAFETY: NEON is this fn's contract.
            unsafe { transpose4(&mut t) };
            for (i, &t) in t.iter().enumerate() {
                let at = (p + i) * R + 4 * g;
                // SAFETY: 4 values at (p + i) · R + 4g + 4 ≤ kc · R (asserted).
                unsafe { vst1q_f32(panel.as_mut_ptr().add(at), t) };
            }
        }
        p += 4;
    }
    for p in p..kc {
        for (c, row) in rows.iter().enumerate() {
            panel[p * R + c] = row[p];
        }
    }
}

//! The f32 product's micro-kernel for CPUs with AVX-512F (`super::f32` drives it): tiles of
//! 14 rows × 32 columns, 28 of the 32 zmm registers accumulating.

use super::f32_kernel::CTile;
use super::small::avx512::products;
use std::arch::x86_64::*;

/// Micro-tile: 14 rows × 32 columns = 28 zmm accumulators (of 32 registers).
const MR: usize = 14;
const NR: usize = 32;

/// The AVX-512F kernel.
pub(crate) struct Avx512;

super::f32_kernel::f32_kernel!(Avx512, kc: 256, max_mc: 16 * MR);

/// C[0..h, 0..w] (row stride ldc) = (or +=) Σ_p ap[p][r] · bp[p][c] over one packed A panel
/// and one packed B panel of depth kc.
///
/// # Safety
/// Needs AVX-512F; the tile's `c` must be valid for h rows of w columns at stride ldc.
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: CTile) {
    let CTile {
        c,
        ldc,
        h,
        w,
        accumulate,
    } = tile;
    // SAFETY: AVX-512F and c valid for h rows of w columns at ldc are this
    // fn's contract; the callers slice ap to kc · MR and bp to kc · NR values, which the panel
    // loads (kc steps of MR and NR) stay inside; the stores write rows r < h, columns masked to w.
    unsafe {
        // The register products of the rows and columns the tile has: a ragged last panel (the
        // 4 rows left of 2,048 or 256, the 11 columns left of 683) runs only the FMAs it needs.
        let mut acc = [_mm512_setzero_ps(); 2 * MR];
        macro_rules! tile {
            ($h:expr, $nv:literal) => {{
                let p = products::<$h, $nv>(kc, ap.as_ptr(), 1, MR, bp.as_ptr(), NR, [0xffff; $nv]);
                for (r, row) in p.iter().enumerate() {
                    acc[2 * r..2 * r + $nv].copy_from_slice(row);
                }
            }};
        }
        match (h, w > 16) {
            (0..=4, false) => tile!(4, 1),
            (0..=4, true) => tile!(4, 2),
            (5..=8, false) => tile!(8, 1),
            (5..=8, true) => tile!(8, 2),
            (_, false) => tile!(MR, 1),
            _ => {
                // The full tile: its own loop (products::<MR, 2> ran 1-6% slower here).
                let (mut pa, mut pb) = (ap.as_ptr(), bp.as_ptr());
                for _ in 0..kc {
                    let b0 = _mm512_loadu_ps(pb);
                    let b1 = _mm512_loadu_ps(pb.add(16));
                    for r in 0..MR {
                        let a = _mm512_set1_ps(*pa.add(r));
                        acc[2 * r] = _mm512_fmadd_ps(a, b0, acc[2 * r]);
                        acc[2 * r + 1] = _mm512_fmadd_ps(a, b1, acc[2 * r + 1]);
                    }
                    pa = pa.add(MR);
                    pb = pb.add(NR);
                }
            }
        }
        // Rows by a loop of fixed length (unrolled, so that acc stays in registers: a loop of h
        // rows kept it on the stack, zeroed by a memset at every call).
        let (m0, m1) = (crate::lane_mask(w), crate::lane_mask(w.saturating_sub(16)));
        for r in 0..MR {
            if r == h {
                break;
            }
            let row = c.add(r * ldc);
            let (mut x0, mut x1) = (acc[2 * r], acc[2 * r + 1]);
            if w == NR {
                if accumulate {
                    x0 = _mm512_add_ps(x0, _mm512_loadu_ps(row));
                    x1 = _mm512_add_ps(x1, _mm512_loadu_ps(row.add(16)));
                }
                _mm512_storeu_ps(row, x0);
                _mm512_storeu_ps(row.add(16), x1);
            } else {
                // A ragged right edge: masked loads and stores of the first w columns.
                if accumulate {
                    x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, row));
                    x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, row.add(16)));
                }
                _mm512_mask_storeu_ps(row, m0, x0);
                _mm512_mask_storeu_ps(row.add(16), m1, x1);
            }
        }
    }
}

/// panel[p][r] = rows[r][p] for p < kc (a panel of R ≤ 32 columns): 16 × 16 blocks
/// transposed in registers (R = 14 stores the first 14 lanes of each), the ragged depth by
/// element.
///
/// # Safety
/// Needs AVX-512F; every row must hold kc values and the panel kc · R.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_rows<const R: usize>(panel: &mut [f32], rows: &[&[f32]; R], kc: usize) {
    // SAFETY: AVX-512F is the caller's contract; the assert that opens this block checks that
    // every row holds kc values and the panel kc · R, so the 16-wide loads at p + 16 ≤ kc and
    // the stores masked to the w ≤ R − c0 columns of row p + i stay in bounds.
    unsafe {
        assert!(panel.len() >= kc * R && rows.iter().all(|r| r.len() >= kc));
        let mut p = 0;
        while p + 16 <= kc {
            for c0 in (0..R).step_by(16) {
                let w = 16.min(R - c0);
                let mut r = [_mm512_setzero_si512(); 16];
                for (i, r) in r.iter_mut().enumerate().take(w) {
                    *r = _mm512_loadu_si512(rows[c0 + i].as_ptr().add(p) as *const _);
                }
                crate::transpose16(&mut r);
                let mask = crate::lane_mask(w);
                for (i, v) in r.iter().enumerate() {
                    let dst = panel.as_mut_ptr().add((p + i) * R + c0);
                    _mm512_mask_storeu_epi32(dst as *mut _, mask, *v);
                }
            }
            p += 16;
        }
        for p in p..kc {
            for (c, row) in rows.iter().enumerate() {
                panel[p * R + c] = row[p];
            }
        }
    }
}

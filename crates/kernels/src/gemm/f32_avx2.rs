//! The f32 product's micro-kernel for CPUs with AVX2 and FMA but no AVX-512 (AMD Zen 2 and 3,
//! Intel's client cores; `super::f32` drives it): tiles of 6 rows × 16 columns, 12 of the 16
//! ymm registers accumulating, two holding a row of the B panel and one a broadcast of A.
//! Before it such CPUs ran the `gemm` crate, which allocates its packing buffers at every call.

use super::f32_kernel::CTile;
use std::arch::x86_64::*;

/// Micro-tile: 6 rows × 16 columns = 12 ymm accumulators (of 16 registers).
const MR: usize = 6;
const NR: usize = 16;

/// The AVX2 kernel.
pub(crate) struct Avx2;

// a row block of 168 rows: a packed A block of 168 KiB in a Zen 3's 512 KiB of L2
super::f32_kernel::f32_kernel!(Avx2, kc: 256, max_mc: 28 * MR);

/// C[0..h, 0..w] (row stride ldc) = (or +=) Σ_p ap[p][r] · bp[p][c] over one packed A panel
/// and one packed B panel of depth kc. The panels are zero-padded, so a ragged tile runs the
/// whole tile's FMAs and stores only its h rows and w columns.
///
/// # Safety
/// Needs AVX2 and FMA; the tile's `c` must be valid for h ≤ 6 rows of w ≤ 16 columns at ldc.
#[target_feature(enable = "avx2,fma")]
#[inline(never)]
unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: CTile) {
    let CTile {
        c,
        ldc,
        h,
        w,
        accumulate,
    } = tile;
    assert!(ap.len() >= kc * MR && bp.len() >= kc * NR && h <= MR && w <= NR);
    // SAFETY: AVX2, FMA and c valid for h rows of w columns at ldc are this fn's contract; the
    // panel loads (kc steps of MR and NR values) stay inside ap and bp (asserted); the stores
    // write rows r < h, columns j < w.
    unsafe {
        // C's rows, fetched while the tile is computed (its stores otherwise wait for them:
        // a quarter of the time at a depth of 256)
        for r in 0..h {
            let row = c.add(r * ldc) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(4 * w - 1));
        }
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let (mut pa, mut pb) = (ap.as_ptr(), bp.as_ptr());
        for _ in 0..kc {
            let b0 = _mm256_loadu_ps(pb);
            let b1 = _mm256_loadu_ps(pb.add(8));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm256_broadcast_ss(&*pa.add(r));
                acc[0] = _mm256_fmadd_ps(a, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(a, b1, acc[1]);
            }
            pa = pa.add(MR);
            pb = pb.add(NR);
        }
        // rows by a loop of fixed length, stopping at h
        for (r, &[x0, x1]) in acc.iter().enumerate() {
            if r == h {
                break;
            }
            let row = c.add(r * ldc);
            if w == NR {
                let (mut x0, mut x1) = (x0, x1);
                if accumulate {
                    x0 = _mm256_add_ps(x0, _mm256_loadu_ps(row));
                    x1 = _mm256_add_ps(x1, _mm256_loadu_ps(row.add(8)));
                }
                _mm256_storeu_ps(row, x0);
                _mm256_storeu_ps(row.add(8), x1);
            } else {
                // a ragged right edge: the first w columns, through a row on the stack
                let mut sums = [0f32; NR];
                _mm256_storeu_ps(sums.as_mut_ptr(), x0);
                _mm256_storeu_ps(sums.as_mut_ptr().add(8), x1);
                for (j, &s) in sums.iter().enumerate().take(w) {
                    let at = row.add(j);
                    *at = if accumulate { s + *at } else { s };
                }
            }
        }
    }
}

/// The 8 × 8 block in r transposed: r[i][j] becomes r[j][i].
///
/// # Safety
/// Needs AVX.
#[target_feature(enable = "avx")]
#[inline]
unsafe fn transpose8(r: &mut [__m256; 8]) {
    // t[2q], t[2q + 1]: rows 2q and 2q + 1 interleaved, lanes 0, 1 (4, 5) and 2, 3 (6, 7)
    let mut t = [_mm256_setzero_ps(); 8];
    for q in 0..4 {
        t[2 * q] = _mm256_unpacklo_ps(r[2 * q], r[2 * q + 1]);
        t[2 * q + 1] = _mm256_unpackhi_ps(r[2 * q], r[2 * q + 1]);
    }
    // u[4h + c]: lane c (c + 4 in the high half) of rows 4h..4h + 4
    let mut u = [_mm256_setzero_ps(); 8];
    for h in 0..2 {
        for q in 0..2 {
            let (lo, hi) = (t[4 * h + q], t[4 * h + 2 + q]);
            u[4 * h + 2 * q] = _mm256_shuffle_ps::<0x44>(lo, hi);
            u[4 * h + 2 * q + 1] = _mm256_shuffle_ps::<0xEE>(lo, hi);
        }
    }
    for c in 0..4 {
        r[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
        r[c + 4] = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
    }
}

/// panel[p][c] = rows[c][p] for p < kc (a panel of R ≤ 32 columns): 8 × 8 blocks transposed
/// in registers, stored row by row of the panel in order (a last group of fewer than 8
/// columns stores 8, the extra lanes landing on the next row's first columns, which are
/// stored after them), the ragged depth by element.
///
/// # Safety
/// Needs AVX; every row must hold kc values and the panel kc · R.
#[target_feature(enable = "avx")]
unsafe fn transpose_rows<const R: usize>(panel: &mut [f32], rows: &[&[f32]; R], kc: usize) {
    assert!(R <= 32 && panel.len() >= kc * R && rows.iter().all(|r| r.len() >= kc));
    let groups = R.div_ceil(8);
    let mut p = 0;
    while p + 8 <= kc {
        let mut t = [[_mm256_setzero_ps(); 8]; 4];
        for (g, t) in t.iter_mut().enumerate().take(groups) {
            for (i, t) in t.iter_mut().enumerate().take(8.min(R - 8 * g)) {
                // SAFETY: p + 8 ≤ kc values of a row that holds kc (asserted).
                *t = unsafe { _mm256_loadu_ps(rows[8 * g + i].as_ptr().add(p)) };
            }
            // SAFETY: AVX is this fn's contract.
            unsafe { transpose8(t) };
        }
        for i in 0..8 {
            for (g, t) in t.iter().enumerate().take(groups) {
                let at = (p + i) * R + 8 * g;
                if at + 8 <= panel.len() {
                    // SAFETY: 8 values from `at` inside the panel (checked).
                    unsafe { _mm256_storeu_ps(panel.as_mut_ptr().add(at), t[i]) };
                } else {
                    let mut v = [0f32; 8];
                    // SAFETY: 8 values into 8.
                    unsafe { _mm256_storeu_ps(v.as_mut_ptr(), t[i]) };
                    let w = 8.min(R - 8 * g);
                    panel[at..at + w].copy_from_slice(&v[..w]);
                }
            }
        }
        p += 8;
    }
    for p in p..kc {
        for (c, row) in rows.iter().enumerate() {
            panel[p * R + c] = row[p];
        }
    }
}

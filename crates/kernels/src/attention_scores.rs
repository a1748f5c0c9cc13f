//! The forward's score tile with the online softmax as its epilogue (AVX-512): S = Q·Kᵀ·scale
//! of a query block against one key tile is computed in registers, a few rows at a time, and
//! each row leaves them as P = exp(S − m_new) with its running max m and sum l updated. Stored
//! and read back by two passes instead, the softmax cost a quarter of the forward's time.
//! attention.rs keeps those passes for other CPUs and for bf16 tiles.

use super::attention_parts::{Online, PairRow, BK};
use super::gemm::small::avx512::{products, WIDE_ROWS};
use super::gemm::Mat;
use super::{exp_nonpos16, lane_mask};
use std::arch::x86_64::*;

/// Registers of one row of the tile.
const V: usize = BK / 16;

/// For query rows 0..rows of q (rows × dk), against a key tile kt (Kᵀ: dk rows of BK keys):
/// row r sees the first `valid(r)` keys; p[r] (rows of BK) = exp(S[r] − m_new[r]), 0 past
/// them; m, l and corr as `Online` says. A row that sees no key is left as it was (corr 1).
///
/// # Safety
/// Needs AVX-512F.
#[target_feature(enable = "avx512f")]
// the register epilogue's raw operands and running statistics, per tile
#[allow(clippy::too_many_arguments)]
pub unsafe fn scores_softmax(
    rows: usize,
    dk: usize,
    q: Mat,
    kt: &[f32],
    scale: f32,
    valid: impl Fn(usize) -> usize,
    p: &mut [f32],
    mut st: Online,
) {
    // SAFETY: AVX-512F is the caller's contract; the asserts that open this block bound q
    // (rows × dk), kt (dk × BK), p (rows × BK) and the statistics, which are all the pointers
    // below reach.
    unsafe {
        assert!(q.fits(rows, dk) && kt.len() >= dk * BK && p.len() >= rows * BK);
        assert!(st.m.len() >= rows && st.l.len() >= rows && st.corr.len() >= rows);
        let mut r0 = 0;
        while r0 < rows {
            let h = WIDE_ROWS.min(rows - r0);
            let a = q.data.as_ptr().add(r0 * q.rs);
            let s = (dk, a, q.rs, q.cs, kt.as_ptr());
            match h {
                6 => rows_out(&products_of::<6>(s), r0, scale, &valid, p, &mut st),
                5 => rows_out(&products_of::<5>(s), r0, scale, &valid, p, &mut st),
                4 => rows_out(&products_of::<4>(s), r0, scale, &valid, p, &mut st),
                3 => rows_out(&products_of::<3>(s), r0, scale, &valid, p, &mut st),
                2 => rows_out(&products_of::<2>(s), r0, scale, &valid, p, &mut st),
                _ => rows_out(&products_of::<1>(s), r0, scale, &valid, p, &mut st),
            }
            r0 += h;
        }
    }
}

/// The scores of H rows: (dk, A, A's row and column strides, Kᵀ).
///
/// # Safety
/// AVX-512F; A's H rows of dk and Kᵀ's dk rows of BK in bounds.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn products_of<const H: usize>(
    (dk, a, a_rs, a_cs, kt): (usize, *const f32, usize, usize, *const f32),
) -> [[__m512; V]; H] {
    // SAFETY: AVX-512F is the caller's contract; a holds H rows of
    // dk at (a_rs, a_cs) and kt dk rows of BK (checked by `scores_softmax`).
    unsafe { products::<H, V>(dk, a, a_rs, a_cs, kt, BK, [0xffff; V]) }
}

/// The softmax update of rows r0.. from their scores s, in registers.
///
/// # Safety
/// AVX-512F; rows r0..r0 + H of p (BK each) and of the statistics in bounds.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn rows_out<const H: usize>(
    s: &[[__m512; V]; H],
    r0: usize,
    scale: f32,
    valid: &impl Fn(usize) -> usize,
    p: &mut [f32],
    st: &mut Online,
) {
    // SAFETY: AVX-512F is the caller's contract; rows r0..r0 + H are
    // below `rows`, inside p and the statistics (checked by `scores_softmax`).
    unsafe {
        for (i, row) in s.iter().enumerate() {
            let r = r0 + i;
            let out = p.as_mut_ptr().add(r * BK);
            let valid = valid(r).min(BK);
            if valid == 0 {
                for v in 0..V {
                    _mm512_storeu_ps(out.add(16 * v), _mm512_setzero_ps());
                }
                st.corr[r] = 1.0;
                continue;
            }
            // scaled, and −∞ past the causal limit
            let mut x = [_mm512_setzero_ps(); V];
            let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
            for v in 0..V {
                let keep = lane_mask(valid.saturating_sub(16 * v));
                x[v] = _mm512_mask_mul_ps(mx, keep, row[v], _mm512_set1_ps(scale));
            }
            for xv in x {
                mx = _mm512_max_ps(mx, xv);
            }
            let m_new = st.raise(r, _mm512_reduce_max_ps(mx));
            let mut sum = _mm512_setzero_ps();
            for (v, xv) in x.iter().enumerate() {
                let e = exp_nonpos16(_mm512_sub_ps(*xv, _mm512_set1_ps(m_new)));
                _mm512_storeu_ps(out.add(16 * v), e);
                sum = _mm512_add_ps(sum, e);
            }
            st.settle(r, m_new, _mm512_reduce_add_ps(sum));
        }
    }
}

/// The backward's P and dS of one score row in place (BK wide): p = exp(s·scale − lse) and
/// ds = p·(dp − delta)·scale for the first `valid` keys, 0 past them: `attention_backward`'s
/// row loop on whole registers, without a scalar tail on the diagonal tiles. With a pair: its
/// second map's dP is −λ·dp, and p leaves as P₁ − λ·P₂, the pair's weights on V.
///
/// # Safety
/// Needs AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn probs_grads_row(
    p: &mut [f32],
    ds: &mut [f32],
    valid: usize,
    (lse, delta): (f32, f32),
    scale: f32,
    mut pair: Option<PairRow>,
) {
    // SAFETY: AVX-512F is the caller's contract; every
    // pointer below stays inside p and ds (and the pair's), whose lengths are checked above.
    unsafe {
        assert!(p.len() >= BK && ds.len() >= BK);
        if let Some(pr) = &pair {
            assert!(pr.p.len() >= BK && pr.ds.len() >= BK);
        }
        let c = _mm512_set1_ps;
        let probs = |s: *const f32, lse: f32, keep| {
            let s = _mm512_mul_ps(_mm512_loadu_ps(s), c(scale));
            _mm512_maskz_mov_ps(keep, exp_nonpos16(_mm512_sub_ps(s, c(lse))))
        };
        let grads = |e, dp, delta, keep| {
            let g = _mm512_mul_ps(e, _mm512_sub_ps(dp, c(delta)));
            _mm512_maskz_mul_ps(keep, g, c(scale))
        };
        for v in 0..V {
            let keep = lane_mask(valid.saturating_sub(16 * v));
            let (pv, dv) = (p.as_mut_ptr().add(16 * v), ds.as_mut_ptr().add(16 * v));
            let e = probs(pv, lse, keep);
            let dp = _mm512_loadu_ps(dv);
            _mm512_storeu_ps(dv, grads(e, dp, delta, keep));
            let weights = match &mut pair {
                None => e,
                Some(pr) => {
                    let (pv2, dv2) = (
                        pr.p.as_mut_ptr().add(16 * v),
                        pr.ds.as_mut_ptr().add(16 * v),
                    );
                    let (lse2, delta2) = pr.lse_delta;
                    let e2 = probs(pv2, lse2, keep);
                    let dp2 = _mm512_mul_ps(dp, c(-pr.lambda));
                    _mm512_storeu_ps(dv2, grads(e2, dp2, delta2, keep));
                    _mm512_fnmadd_ps(c(pr.lambda), e2, e)
                }
            };
            _mm512_storeu_ps(pv, weights);
        }
    }
}

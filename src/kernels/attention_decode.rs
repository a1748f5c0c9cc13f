//! Attention for one new query per sequence: a decoding step over the KV cache.
//!
//! The tile kernel (attention.rs) parallelises over key heads and streams each head's cached
//! rows as a strided column, transposed into a tile first. With one query there is nothing to
//! reuse a tile for, so here the cached positions are cut into chunks instead
//! (flash-decoding): a task reads its chunk's key and value rows for every head, keeps a
//! partial softmax (max, sum, weighted values) per head, and the partials are merged at the
//! end. The chunks do not depend on the thread count, so neither do the results.

use super::attention::AttnShape;
use super::{axpy, exp_nonpos, map_lanes, SharedMut, MAX, SUM};
use rayon::prelude::*;

/// Cached positions per task: two 16-row score blocks.
const CHUNK: usize = 32;

thread_local! {
    static PARTIALS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// o (B, NQ, DV) and lse (B, NQ) for one query per sequence, q (B, NQ, DK), that sees the
/// first `visible` of the sequence's `tkv` cached rows in k (B, Tkv, NK, DK) and
/// v (B, Tkv, NV, DV); `attention_forward`, its caller, checked these lengths. Same results as
/// the tile kernel, up to rounding.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_decode(
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    tkv: usize,
    visible: usize,
    s: &AttnShape,
) {
    let AttnShape { nq, dk, dv, .. } = *s;
    assert!(visible >= 1 && visible <= tkv);
    let chunks = visible.div_ceil(CHUNK);
    // Per (sequence, chunk, head): the chunk's max score, its sum of exp(score − max) and
    // the values weighted by those exps.
    let part = dv + 2;
    super::with_thread_buffer(&PARTIALS, |buf| {
        let partials = SharedMut::new(super::ensure(buf, b * chunks * nq * part));
        let run = |task: usize| {
            let (bi, ci) = (task / chunks, task % chunks);
            let t0 = ci * CHUNK;
            let len = CHUNK.min(visible - t0);
            // SAFETY: task (bi, ci) alone writes its nq partials.
            let out = unsafe { partials.slice(task * nq * part, nq * part) };
            chunk_partials(out, &q[bi * nq * dk..], k, v, bi * tkv + t0, len, s);
        };
        if chunks * b > 1 {
            (0..b * chunks).into_par_iter().for_each(run);
        } else {
            run(0);
        }
        for bi in 0..b {
            for j in 0..nq {
                let at = |ci: usize| ((bi * chunks + ci) * nq + j) * part;
                let m = (0..chunks).fold(f32::NEG_INFINITY, |m, ci| m.max(buf[at(ci) + dv]));
                // Each chunk rescaled from its own max to m, then everything divided by the sum.
                let oj = &mut o[(bi * nq + j) * dv..][..dv];
                oj.fill(0.0);
                let mut l = 0.0;
                for ci in 0..chunks {
                    let e = exp_nonpos(buf[at(ci) + dv] - m);
                    l += buf[at(ci) + dv + 1] * e;
                    axpy(oj, e, &buf[at(ci)..at(ci) + dv]);
                }
                oj.iter_mut().for_each(|x| *x /= l);
                lse[bi * nq + j] = m + l.ln();
            }
        }
    });
}

/// For each query head j, into out[j·(DV + 2)..]: Σ_t e^(s_t − m)·v_t, then m and
/// Σ_t e^(s_t − m), over the `len` cached rows from `row0` (s_t the scaled scores, m their max).
fn chunk_partials(
    out: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    row0: usize,
    len: usize,
    s: &AttnShape,
) {
    let AttnShape {
        nq, nk, nv, dk, dv, ..
    } = *s;
    let scale = 1.0 / (dk as f32).sqrt();
    let mut scores = [0f32; CHUNK];
    for j in 0..nq {
        let (kh, vh) = (s.k_head(j), s.v_head(j));
        let qj = &q[j * dk..(j + 1) * dk];
        key_scores(&mut scores[..len], qj, &k[(row0 * nk + kh) * dk..], nk * dk);
        let sc = &mut scores[..len];
        let m = map_lanes(sc, |_, x| x * scale, MAX);
        let l = map_lanes(sc, |_, x| exp_nonpos(x - m), SUM);
        let (acc, ml) = out[j * (dv + 2)..(j + 1) * (dv + 2)].split_at_mut(dv);
        weighted_rows(acc, sc, &v[(row0 * nv + vh) * dv..], nv * dv);
        ml[0] = m;
        ml[1] = l;
    }
}

/// scores[t] = q · k[t·rs..t·rs + q.len()]
fn key_scores(scores: &mut [f32], q: &[f32], k: &[f32], rs: usize) {
    #[cfg(target_arch = "x86_64")]
    if super::sgemm_avx512::available() {
        use std::arch::x86_64::*;
        assert!(k.len() >= (scores.len() - 1) * rs + q.len());
        for (bi, block) in scores.chunks_mut(16).enumerate() {
            let h = block.len();
            // SAFETY: AVX-512F is present; rows 16·bi..16·bi + h of k are in bounds (asserted
            // above), and the store writes h lanes of block.
            unsafe {
                let sums = super::dot_rows16(q, k.as_ptr().add(16 * bi * rs), rs, h);
                _mm512_mask_storeu_ps(block.as_mut_ptr(), super::lane_mask(h), sums);
            }
        }
        return;
    }
    for (t, x) in scores.iter_mut().enumerate() {
        *x = super::dot(q, &k[t * rs..t * rs + q.len()]);
    }
}

/// acc = Σ_t p[t] · v[t·rs..t·rs + acc.len()]
fn weighted_rows(acc: &mut [f32], p: &[f32], v: &[f32], rs: usize) {
    let w = acc.len();
    assert!(v.len() >= (p.len() - 1) * rs + w);
    #[cfg(target_arch = "x86_64")]
    if super::sgemm_avx512::available() {
        // SAFETY: AVX-512F is present; rows t < p.len() of v are in bounds (asserted above).
        unsafe { weighted_rows_avx512(acc, p, v, rs) };
        return;
    }
    acc.fill(0.0);
    for (t, &pt) in p.iter().enumerate() {
        axpy(acc, pt, &v[t * rs..t * rs + w]);
    }
}

/// `weighted_rows` 64 columns at a time, their sums kept in four registers over all rows; a
/// last, narrower block of columns in as many registers as it needs (two for the 32 columns
/// of a `bench` head, where four would spend half their loads and FMAs on masked-off lanes).
///
/// # Safety
/// AVX-512F; rows t < p.len() of v, acc.len() long at stride rs, are in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_rows_avx512(acc: &mut [f32], p: &[f32], v: &[f32], rs: usize) {
    let w = acc.len();
    for c0 in (0..w).step_by(64) {
        let cols = (w - c0).min(64);
        match cols.div_ceil(16) {
            1 => weighted_columns::<1>(acc, p, v, rs, c0, cols),
            2 => weighted_columns::<2>(acc, p, v, rs, c0, cols),
            3 => weighted_columns::<3>(acc, p, v, rs, c0, cols),
            _ => weighted_columns::<4>(acc, p, v, rs, c0, cols),
        }
    }
}

/// acc[c0..c0 + cols] = Σ_t p[t] · v[t·rs + c0..][..cols] in N registers (cols ≤ 16·N).
///
/// # Safety
/// As for `weighted_rows_avx512`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weighted_columns<const N: usize>(
    acc: &mut [f32],
    p: &[f32],
    v: &[f32],
    rs: usize,
    c0: usize,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let masks: [__mmask16; N] =
        std::array::from_fn(|i| super::lane_mask(cols.saturating_sub(16 * i)));
    let mut sums = [_mm512_setzero_ps(); N];
    for (t, &pt) in p.iter().enumerate() {
        let (pv, row) = (_mm512_set1_ps(pt), v.as_ptr().add(t * rs + c0));
        for (i, s) in sums.iter_mut().enumerate() {
            let x = _mm512_maskz_loadu_ps(masks[i], row.add(16 * i));
            *s = _mm512_fmadd_ps(pv, x, *s);
        }
    }
    for (i, s) in sums.iter().enumerate() {
        _mm512_mask_storeu_ps(acc.as_mut_ptr().add(c0 + 16 * i), masks[i], *s);
    }
}

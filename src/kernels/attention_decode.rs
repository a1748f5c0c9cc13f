//! Attention for one new query per sequence: a decoding step over the KV cache.
//!
//! The tile kernel (attention.rs) parallelises over key heads and streams each head's cached
//! rows as a strided column, transposed into a tile first. With one query there is nothing to
//! reuse a tile for, so here the cached positions are cut into chunks instead
//! (flash-decoding): a task reads its chunk's key and value rows for every head, block by
//! block in memory order, keeps a partial softmax (max, sum, weighted values) per head, and
//! the partials are merged at the end. The chunks do not depend on the thread count, so
//! neither do the results.
//!
//! The cache holds f32 or bf16 keys and values (`Elem`, `--kv-cache bf16`): bf16 rows are
//! widened to f32 as they are loaded (on AVX-512 a zero-extension and a shift, `load16`),
//! and everything after the load runs in f32 either way.

use super::attention::{attention_forward, AttnShape};
use super::Precision;
use super::{axpy, axpy_elems, exp_nonpos, map_lanes, Elem, SharedMut, MAX, SUM};
use rayon::prelude::*;

/// Cached positions per task: two 16-row score blocks.
const CHUNK: usize = 32;
/// Cached rows a block: one 16-row score block.
const ROWS: usize = 16;

thread_local! {
    static PARTIALS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// a bf16 cache's rows widened for a prefill
    static WIDENED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// o (B, NQ, DV) and lse (B, NQ) for one query per sequence, q (B, NQ, DK), that sees the
/// first `visible` of the sequence's `tkv` cached rows in k (B, Tkv, NK, DK) and
/// v (B, Tkv, NV, DV); `attention_forward`, its caller, checked these lengths. Same results as
/// the tile kernel, up to rounding. The AVX-512 loops where the CPU has AVX-512F, else the
/// portable ones.
// attention_forward's decoding branch: the same operands, passed on as they came
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_decode<T: Elem>(
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    b: usize,
    tkv: usize,
    visible: usize,
    s: &AttnShape,
) {
    let simd = super::gemm::cpu::avx512f();
    attention_decode_on(simd, o, lse, q, k, v, b, tkv, visible, s)
}

/// `attention_decode` on the AVX-512 loops (`simd`, which the caller has checked the CPU can
/// run) or the portable ones: tests compare the two.
// attention_decode's operands and the path
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_decode_on<T: Elem>(
    simd: bool,
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    b: usize,
    tkv: usize,
    visible: usize,
    s: &AttnShape,
) {
    assert!(!simd || super::gemm::cpu::avx512f());
    let AttnShape { nq, dk, dv, .. } = *s;
    assert!(visible >= 1 && visible <= tkv);
    let chunks = visible.div_ceil(CHUNK);
    // Per (sequence, chunk, head): the values weighted by exp(score − max), the chunk's max
    // score and its sum of exp(score − max), then room for the chunk's scores.
    let (part, group) = (dv + 2 + CHUNK, query_group(s));
    super::with_thread_buffer(&PARTIALS, |buf| {
        let partials = SharedMut::new(super::ensure(buf, b * chunks * nq * part));
        let run = |task: usize| {
            let (bi, ci) = (task / chunks, task % chunks);
            let t0 = ci * CHUNK;
            let len = CHUNK.min(visible - t0);
            // SAFETY: task (bi, ci) alone writes its nq partials.
            let out = unsafe { partials.slice(task * nq * part, nq * part) };
            let (q, row0) = (&q[bi * nq * dk..], bi * tkv + t0);
            chunk_partials(simd, out, q, &Rows { k, v, row0, len }, s, group);
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

/// Attention of the `tq` new queries of one sequence, at positions `q_offset..`, over the first
/// `q_offset + tq` rows of its KV cache (k (Tkv, NK, DK), v (Tkv, NV, DV), f32 or bf16): an f32
/// cache is read in place by `attention_forward`; a bf16 one by the decoding kernel when one
/// token is decoded (widened as it is loaded), else (prefill) widened first into a thread
/// buffer for the tile kernel.
// attention_forward's operands for one sequence, its cache rows of either element type
#[allow(clippy::too_many_arguments)]
pub fn attention_cached<T: Elem>(
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[T],
    v: &[T],
    tq: usize,
    q_offset: usize,
    s: &AttnShape,
    precision: Precision,
) {
    let tkv = q_offset + tq;
    let (k, v) = (&k[..tkv * s.nk * s.dk], &v[..tkv * s.nv * s.dv]);
    let run = |o: &mut [f32], lse: &mut [f32], k: &[f32], v: &[f32]| {
        attention_forward(o, lse, q, k, v, 1, tq, tkv, q_offset, s, precision)
    };
    match (T::as_f32(k), T::as_f32(v)) {
        (Some(k), Some(v)) => run(o, lse, k, v),
        _ if tq == 1 => {
            s.check();
            attention_decode(o, lse, q, k, v, 1, tkv, tkv, s)
        }
        _ => super::with_thread_buffer(&WIDENED, |buf| {
            let (kf, vf) = super::ensure(buf, k.len() + v.len()).split_at_mut(k.len());
            kf.iter_mut().zip(k).for_each(|(d, x)| *d = x.widen());
            vf.iter_mut().zip(v).for_each(|(d, x)| *d = x.widen());
            run(o, lse, kf, vf)
        }),
    }
}

/// The largest of 4, 2 and 1 such that each aligned run of that many query heads reads one
/// key head and one value head (diff_v2 at `bench`: 4; standard GQA: its group size).
fn query_group(s: &AttnShape) -> usize {
    let shares = |g: usize| {
        s.nq.is_multiple_of(g)
            && (0..s.nq).all(|j| {
                let j0 = j - j % g;
                s.k_head(j) == s.k_head(j0) && s.v_head(j) == s.v_head(j0)
            })
    };
    [4, 2].into_iter().find(|&g| shares(g)).unwrap_or(1)
}

/// A task's chunk of the cache: `len` rows from `row0` of k and v.
struct Rows<'a, T> {
    k: &'a [T],
    v: &'a [T],
    row0: usize,
    len: usize,
}

impl<T> Rows<'_, T> {
    /// The cached rows `t..t + ROWS` of the chunk (every head's, contiguous) in k (`keys`) or
    /// v, asked for into L2 (`prefetch_l2`) in memory order, a block ahead of the heads that
    /// read them each as a strided column: runs too short for the hardware prefetcher.
    fn prefetch(&self, s: &AttnShape, keys: bool, t: usize) {
        if t >= self.len {
            return;
        }
        let rows = ROWS.min(self.len - t);
        let (x, w) = match keys {
            true => (self.k.as_ptr(), s.nk * s.dk),
            false => (self.v.as_ptr(), s.nv * s.dv),
        };
        let at = x.wrapping_add((self.row0 + t) * w);
        super::prefetch_l2(at.cast(), rows * w * std::mem::size_of::<T>());
    }
}

/// A task's partials, out (NQ, DV + 2 + CHUNK): each phase walks the chunk's cached rows a
/// block of `ROWS` at a time, every head over one block before the next (memory order), and
/// asks for the next block's rows while the heads read this one (from DRAM, 1.3–1.5× the
/// head-by-head walk over the whole chunk). A GQA group's query heads (diff_v2's) go
/// together (`group`, `query_group`'s), each cached row loaded once for them.
fn chunk_partials<T: Elem>(
    simd: bool,
    out: &mut [f32],
    q: &[f32],
    r: &Rows<T>,
    s: &AttnShape,
    group: usize,
) {
    let AttnShape { nq, dk, dv, .. } = *s;
    let part = dv + 2 + CHUNK;
    let scale = 1.0 / (dk as f32).sqrt();
    // 1. every head's scores, into out[j][dv + 2..]
    r.prefetch(s, true, 0);
    for t in (0..r.len).step_by(ROWS) {
        match t + ROWS < r.len {
            true => r.prefetch(s, true, t + ROWS),
            false => r.prefetch(s, false, 0),
        }
        for j in (0..nq).step_by(group) {
            let heads = &mut out[j * part..(j + group) * part];
            match group {
                4 => scores_block::<4, T>(simd, heads, q, r, s, j, t),
                2 => scores_block::<2, T>(simd, heads, q, r, s, j, t),
                _ => scores_block::<1, T>(simd, heads, q, r, s, j, t),
            }
        }
    }
    // 2. each head's max m and Σ exp(score − m), the scores turned into those exps
    for o in out.chunks_exact_mut(part) {
        let (stats, sc) = o[dv..].split_at_mut(2);
        let sc = &mut sc[..r.len];
        let m = map_lanes(sc, |_, x| x * scale, MAX);
        stats[0] = m;
        stats[1] = map_lanes(sc, |_, x| exp_nonpos(x - m), SUM);
    }
    // 3. every head's values weighted by its exps, into out[j][..dv]
    for t in (0..r.len).step_by(ROWS) {
        r.prefetch(s, false, t + ROWS);
        for j in (0..nq).step_by(group) {
            let heads = &mut out[j * part..(j + group) * part];
            match group {
                4 => values_block::<4, T>(simd, heads, r, s, j, t),
                2 => values_block::<2, T>(simd, heads, r, s, j, t),
                _ => values_block::<1, T>(simd, heads, r, s, j, t),
            }
        }
    }
}

/// Phase 1 for the Q query heads from j0, which read one key head (`heads`: their partials),
/// over the block of cached rows from t. Out of line, each Q compiled on its own: inlined
/// together into their caller, the three shared one register allocation, and standard's
/// single heads decoded 4–5% slower.
#[inline(never)]
fn scores_block<const Q: usize, T: Elem>(
    simd: bool,
    heads: &mut [f32],
    q: &[f32],
    r: &Rows<T>,
    s: &AttnShape,
    j0: usize,
    t: usize,
) {
    let (t1, at) = (ROWS.min(r.len - t), s.dv + 2 + t);
    let mut parts = heads.chunks_exact_mut(s.dv + 2 + CHUNK);
    let sc: [&mut [f32]; Q] = std::array::from_fn(|_| &mut parts.next().unwrap()[at..at + t1]);
    let qs: [&[f32]; Q] = std::array::from_fn(|i| &q[(j0 + i) * s.dk..(j0 + i + 1) * s.dk]);
    let k = &r.k[((r.row0 + t) * s.nk + s.k_head(j0)) * s.dk..];
    key_scores(simd, sc, qs, k, s.nk * s.dk);
}

/// Phase 3 for the Q query heads from j0, which read one value head, over the block of cached
/// rows from t: the first block sets each head's sums, later ones add to them.
#[inline(never)]
fn values_block<const Q: usize, T: Elem>(
    simd: bool,
    heads: &mut [f32],
    r: &Rows<T>,
    s: &AttnShape,
    j0: usize,
    t: usize,
) {
    let (t1, dv) = (ROWS.min(r.len - t), s.dv);
    let mut parts = heads
        .chunks_exact_mut(dv + 2 + CHUNK)
        .map(|o| o.split_at_mut(dv + 2));
    let mut ps: [&[f32]; Q] = [&[]; Q];
    let accs: [&mut [f32]; Q] = std::array::from_fn(|i| {
        let (acc, sc) = parts.next().unwrap();
        ps[i] = &sc[t..t + t1];
        &mut acc[..dv]
    });
    let v = &r.v[((r.row0 + t) * s.nv + s.v_head(j0)) * dv..];
    weighted_rows(simd, accs, ps, v, s.nv * dv, t > 0);
}

/// scores[i][t] = qs[i] · k[t·rs..t·rs + qs[i].len()], each row of k loaded once for all the qs
fn key_scores<const Q: usize, T: Elem>(
    simd: bool,
    mut scores: [&mut [f32]; Q],
    qs: [&[f32]; Q],
    k: &[T],
    rs: usize,
) {
    let (len, dk) = (scores[0].len(), qs[0].len());
    assert!(k.len() >= (len - 1) * rs + dk);
    #[cfg(target_arch = "x86_64")]
    if simd {
        use std::arch::x86_64::*;
        for r0 in (0..len).step_by(16) {
            let h = 16.min(len - r0);
            // SAFETY: AVX-512F is present; rows r0..r0 + h of k are in bounds (asserted
            // above), and each store writes h lanes of scores[i][r0..].
            unsafe {
                let rows = k.as_ptr().add(r0 * rs);
                if Q == 1 {
                    let sums = super::dot_rows16(qs[0], rows, rs, h);
                    _mm512_mask_storeu_ps(
                        scores[0].as_mut_ptr().add(r0),
                        super::lane_mask(h),
                        sums,
                    );
                } else {
                    let sums = group_scores16(qs, rows, rs, h);
                    for (sc, x) in scores.iter_mut().zip(sums) {
                        _mm512_mask_storeu_ps(sc.as_mut_ptr().add(r0), super::lane_mask(h), x);
                    }
                }
            }
        }
        return;
    }
    for (sc, q) in scores.into_iter().zip(qs) {
        for (t, x) in sc.iter_mut().enumerate() {
            *x = super::dot_elems(q, &k[t * rs..t * rs + dk]);
        }
    }
}

/// Lane i of register j is qs[j] · k[i·rs..][..dk] for the rows i < h ≤ 16 (0 past h). A
/// block of 16 rows × 16 key columns is transposed once, a register per column, and each
/// query adds its broadcast component times that column: Q heads share one transpose, where
/// `dot_rows16` spends one on every 16 sums (more than its products cost at dk = 32).
///
/// # Safety
/// AVX-512F; the qs are equally long; rows 0..h of k, each that long at stride rs, are in
/// bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn group_scores16<const Q: usize, T: Elem>(
    qs: [&[f32]; Q],
    k: *const T,
    rs: usize,
    h: usize,
) -> [std::arch::x86_64::__m512; Q] {
    // SAFETY: AVX-512F is the caller's contract, and the loads
    // read rows i < h of k at stride rs, columns p0.. masked to dk, which it guarantees in bounds.
    unsafe {
        use std::arch::x86_64::*;
        let dk = qs[0].len();
        let mut acc = [_mm512_setzero_ps(); Q];
        for p0 in (0..dk).step_by(16) {
            let m = super::lane_mask(dk - p0);
            let mut cols: [__m512i; 16] = std::array::from_fn(|i| {
                if i < h {
                    _mm512_castps_si512(super::load16(k.add(i * rs + p0), dk - p0))
                } else {
                    _mm512_setzero_si512()
                }
            });
            super::transpose16(&mut cols);
            // this block's query components, zero past dk
            let mut qp = [[0f32; 16]; Q];
            for (d, q) in qp.iter_mut().zip(qs) {
                _mm512_storeu_ps(d.as_mut_ptr(), _mm512_maskz_loadu_ps(m, q.as_ptr().add(p0)));
            }
            for (p, col) in cols.iter().enumerate() {
                for (a, d) in acc.iter_mut().zip(&qp) {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(d[p]), _mm512_castsi512_ps(*col), *a);
                }
            }
        }
        acc
    }
}

/// accs[i] = Σ_t ps[i][t] · v[t·rs..t·rs + accs[i].len()] (with `add`, accs[i] += it), each
/// row of v loaded once for all
fn weighted_rows<const Q: usize, T: Elem>(
    simd: bool,
    accs: [&mut [f32]; Q],
    ps: [&[f32]; Q],
    v: &[T],
    rs: usize,
    add: bool,
) {
    let (w, len) = (accs[0].len(), ps[0].len());
    assert!(v.len() >= (len - 1) * rs + w);
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: AVX-512F is present; rows t < len of v are in bounds (asserted above).
        unsafe { weighted_rows_avx512(accs, ps, v, rs, add) };
        return;
    }
    for (acc, p) in accs.into_iter().zip(ps) {
        if !add {
            acc.fill(0.0);
        }
        for (t, &pt) in p.iter().enumerate() {
            axpy_elems(acc, pt, &v[t * rs..t * rs + w]);
        }
    }
}

/// `weighted_rows` 64 columns at a time, their sums kept in four registers a head over all
/// rows; a last, narrower block of columns in as many registers as it needs (two for the 32
/// columns of a `bench` head, where four would spend half their loads and FMAs on masked-off
/// lanes).
///
/// # Safety
/// AVX-512F; rows t < ps[0].len() of v, accs[0].len() long at stride rs, are in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_rows_avx512<const Q: usize, T: Elem>(
    mut accs: [&mut [f32]; Q],
    ps: [&[f32]; Q],
    v: &[T],
    rs: usize,
    add: bool,
) {
    // SAFETY: `weighted_columns` has this fn's contract
    // (AVX-512F, rows of v in bounds) and is called with c0 + cols ≤ w columns.
    unsafe {
        let w = accs[0].len();
        for c0 in (0..w).step_by(64) {
            let cols = (w - c0).min(64);
            let (a, p) = (&mut accs, &ps);
            match cols.div_ceil(16) {
                1 => weighted_columns::<1, Q, T>(a, p, v, rs, c0, cols, add),
                2 => weighted_columns::<2, Q, T>(a, p, v, rs, c0, cols, add),
                3 => weighted_columns::<3, Q, T>(a, p, v, rs, c0, cols, add),
                _ => weighted_columns::<4, Q, T>(a, p, v, rs, c0, cols, add),
            }
        }
    }
}

/// accs[i][c0..c0 + cols] = Σ_t ps[i][t] · v[t·rs + c0..][..cols] in N registers a head
/// (cols ≤ 16·N).
///
/// # Safety
/// As for `weighted_rows_avx512`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weighted_columns<const N: usize, const Q: usize, T: Elem>(
    accs: &mut [&mut [f32]; Q],
    ps: &[&[f32]; Q],
    v: &[T],
    rs: usize,
    c0: usize,
    cols: usize,
    add: bool,
) {
    // SAFETY: AVX-512F and rows t < ps[0].len() of v in bounds
    // at stride rs are the caller's contract; the loads and stores are masked to the cols
    // columns from c0, inside v's rows and every acc (c0 + cols ≤ their length).
    unsafe {
        use std::arch::x86_64::*;
        let masks: [__mmask16; N] =
            std::array::from_fn(|i| super::lane_mask(cols.saturating_sub(16 * i)));
        let mut sums = [[_mm512_setzero_ps(); N]; Q];
        if add {
            for (s, acc) in sums.iter_mut().zip(accs.iter()) {
                for i in 0..N {
                    s[i] = _mm512_maskz_loadu_ps(masks[i], acc.as_ptr().add(c0 + 16 * i));
                }
            }
        }
        for t in 0..ps[0].len() {
            let row = v.as_ptr().add(t * rs + c0);
            let mut pv = [_mm512_setzero_ps(); Q];
            for (x, p) in pv.iter_mut().zip(ps) {
                *x = _mm512_set1_ps(p[t]);
            }
            for i in 0..N {
                let x = super::load16(row.add(16 * i), cols.saturating_sub(16 * i));
                for (s, &p) in sums.iter_mut().zip(&pv) {
                    s[i] = _mm512_fmadd_ps(p, x, s[i]);
                }
            }
        }
        for (acc, s) in accs.iter_mut().zip(&sums) {
            for i in 0..N {
                _mm512_mask_storeu_ps(acc.as_mut_ptr().add(c0 + 16 * i), masks[i], s[i]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// A bf16 cache decodes exactly as an f32 cache holding the same (widened) values, on the
    /// portable loops and, where the CPU has AVX-512F, on the AVX-512 ones, which agree with
    /// the portable ones to rounding: ragged head widths (dk 20, dv 40 and 8), a last chunk
    /// of 13 rows, GQA groups of 4, 2 and 1, two sequences.
    #[test]
    fn bf16_caches_decode_as_their_widened_values_on_both_paths() {
        let mut paths = vec![false];
        if crate::kernels::gemm::cpu::avx512f() {
            paths.push(true);
        }
        let mut seed = 1u32;
        let mut rand = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1 << 24) as f32 * 4.0 - 2.0
                })
                .collect()
        };
        let (b, tkv) = (2, 77);
        for (nq, nk, nv, dk, dv) in [(8, 2, 2, 20, 40), (4, 2, 2, 32, 8), (6, 6, 6, 16, 16)] {
            let s = AttnShape {
                nq,
                nk,
                nv,
                dk,
                dv,
                diff_pairs: false,
            };
            let q = rand(b * nq * dk);
            let kb: Vec<bf16> = rand(b * tkv * nk * dk)
                .into_iter()
                .map(bf16::narrow)
                .collect();
            let vb: Vec<bf16> = rand(b * tkv * nv * dv)
                .into_iter()
                .map(bf16::narrow)
                .collect();
            let (kf, vf): (Vec<f32>, Vec<f32>) = (
                kb.iter().map(|x| x.widen()).collect(),
                vb.iter().map(|x| x.widen()).collect(),
            );
            let run = |simd: bool, bf: bool| {
                let (mut o, mut lse) = (vec![0f32; b * nq * dv], vec![0f32; b * nq]);
                match bf {
                    true => {
                        attention_decode_on(simd, &mut o, &mut lse, &q, &kb, &vb, b, tkv, tkv, &s)
                    }
                    false => {
                        attention_decode_on(simd, &mut o, &mut lse, &q, &kf, &vf, b, tkv, tkv, &s)
                    }
                }
                (o, lse)
            };
            let portable = run(false, false);
            assert!(portable.0.iter().any(|&x| x != 0.0));
            for &simd in &paths {
                let f = run(simd, false);
                assert_eq!(run(simd, true), f, "{s:?} simd={simd}: bf16 vs widened f32");
                for (a, b) in
                    f.0.iter()
                        .chain(&f.1)
                        .zip(portable.0.iter().chain(&portable.1))
                {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{s:?}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn query_groups_are_the_aligned_runs_that_share_key_and_value_heads() {
        let shape = |nq, nk, nv, diff_pairs| AttnShape {
            nq,
            nk,
            nv,
            dk: 8,
            dv: 8,
            diff_pairs,
        };
        // standard MHA; GQA of 2 and of 4 (diff_v2); diff_v1's sub-heads alternate key heads;
        // groups of 3 fit no aligned run of 2; 8 over 1 is taken 4 at a time
        for (s, want) in [
            (shape(8, 8, 8, false), 1),
            (shape(4, 2, 2, false), 2),
            (shape(16, 4, 4, false), 4),
            (shape(8, 8, 4, true), 1),
            (shape(6, 2, 2, false), 1),
            (shape(8, 1, 1, false), 4),
        ] {
            assert_eq!(query_group(&s), want, "{s:?}");
        }
    }
}

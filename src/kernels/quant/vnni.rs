//! The AVX512-VNNI engine. `vpdpbusd` multiplies unsigned bytes by signed bytes and sums each
//! four into an int32 lane. The weights are made unsigned by an offset (Q8_0: q + 128, as
//! stored; Q4_0: its nibbles, q + 8), which the input's per-block correction
//! (`QuantAct::corr`, −off · Σq_x) takes back out in int32, before the scales:
//!
//! ```text
//! Σ_b d_w·d_x·Σ_j q_w·q_x = Σ_b d_w·d_x·(Σ_j (q_w + off)·q_x + corr_b)
//! ```
//!
//! (exact: the offset never meets a rounding, where an f32 correction added after the scales
//! cancelled two large terms.)
//!
//! Sixteen blocks a step (a `SPAN`, laid out by `Tiling::quant_at` and `x_at`): each 64-byte
//! chunk holds four bytes of each of the span's blocks, block k's in int32 lane k, so the
//! span's eight chunks (Q4_0: four loads, low and high nibbles) `vpdpbusd` into one int32
//! register that ends holding each block's whole dot product, and the span's scales d_w·d_x,
//! also one block per lane, apply in one convert and one FMA (where the layout before it,
//! blocks of four, paid a permute, a convert and an FMA per four blocks and output). One
//! function (`dots`) serves decoding (one input row against a whole tile of weight rows, one
//! stretch of memory) and the GEMM (`NX` input rows against a whole tile, sharing every
//! load), so that a row's sums are the same bits in either.

use super::{x_at, QuantAct, QuantKind, QuantMatrix, Tiling, BLOCK, SPAN, TILE_ROWS};
use std::arch::x86_64::*;
use std::ops::Range;

/// Input rows the GEMM's step takes against a whole tile of weight rows: sixteen int32
/// accumulators, and the tile read start to end (four rows against half a tile, which reads
/// the tile in two interleaved passes, ran 10–20% slower at 4 and 16 rows).
const NX: usize = 2;

/// The outputs (rows × outs), handed to `put(row, out, value)`, a tile of weight rows at a
/// time, against one input row (decoding) or `NX` at a time.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512BW and AVX512-VNNI; `rows` and `outs` must lie inside
/// `x` and `w`, and `outs` start at a tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile(
    x: &QuantAct,
    w: &QuantMatrix,
    rows: Range<usize>,
    outs: Range<usize>,
    put: impl Fn(usize, usize, f32),
) {
    assert!(rows.end <= x.n && outs.end <= w.rows && outs.start.is_multiple_of(TILE_ROWS));
    for o0 in outs.clone().step_by(TILE_ROWS) {
        // the tile's padding rows (zeros) are computed and dropped
        let t = w.tile(o0 / TILE_ROWS);
        let oh = TILE_ROWS.min(outs.end - o0);
        if rows.len() == 1 {
            // SAFETY: the features are this function's contract; the row is in bounds.
            let [s] = unsafe { dots::<1, TILE_ROWS>(x, [rows.start], w.kind, w.tiling(), t) };
            (0..oh).for_each(|i| put(rows.start, o0 + i, s[i]));
            continue;
        }
        // the next tile into L2, a share at each step over this one (the first read of a tile
        // is from memory; the steps after it find it in cache)
        let (tb, calls) = (w.tiling().bytes(), rows.len().div_ceil(NX));
        let share = (tb / 64).div_ceil(calls);
        for r0 in rows.clone().step_by(NX) {
            if t.len() >= 2 * tb {
                for l in (r0 / NX * share..(r0 / NX + 1) * share).take_while(|l| 64 * l < tb) {
                    _mm_prefetch::<_MM_HINT_T1>(t[tb + 64 * l..].as_ptr().cast());
                }
            }
            let xr: [usize; NX] = std::array::from_fn(|j| (r0 + j).min(rows.end - 1));
            // SAFETY: as above.
            let s = unsafe { dots::<NX, TILE_ROWS>(x, xr, w.kind, w.tiling(), t) };
            for (j, s) in s.iter().enumerate().take(NX.min(rows.end - r0)) {
                (0..oh).for_each(|i| put(r0 + j, o0 + i, s[i]));
            }
        }
    }
}

/// The dot products of input rows `xr` with the first W rows of weight tile `t`, span by
/// span: the span's block dot products in int32 (`span_dots`), the offset's correction added
/// in int32, then per output one FMA of the exact sums times d_w·d_x, in the same order for
/// every R and W.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; the rows exist; `t` is a tile of `tl` and at least 64 bytes
/// after it; W ≤ its rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dots<const R: usize, const W: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    t: &[u8],
) -> [[f32; W]; R] {
    assert!(t.len() >= tl.bytes() + 64 && W <= TILE_ROWS);
    let xrow = xr.map(|r| x.row(r));
    let mut acc = [[_mm512_setzero_ps(); W]; R];
    for s in 0..tl.spans() {
        let (b0, m) = (s * SPAN, crate::kernels::lane_mask(tl.width(s)));
        // 1. the span's scales, and the offset's correction
        // SAFETY: the masked loads read the span's scales in each weight row; the input's
        // scales and corrections are padded to whole spans.
        let (dw, dx, corr) = unsafe {
            (
                std::array::from_fn::<_, W, _>(|i| {
                    let p = t.as_ptr().add(tl.scale_at(i, b0));
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast()))
                }),
                xrow.map(|(_, d, _)| _mm512_loadu_ps(d.as_ptr().add(b0))),
                xrow.map(|(_, _, c)| _mm512_loadu_si512(c.as_ptr().add(b0).cast())),
            )
        };
        // 2. every block's dot product, exact in int32
        // SAFETY: the span lies inside the tile and the input rows (padded).
        let dot = unsafe { span_dots::<R, W>(&xrow.map(|(q, _, _)| q), kind, tl, t, s) };
        // 3. scaled into the f32 sums
        for j in 0..R {
            for i in 0..W {
                let exact = _mm512_cvtepi32_ps(_mm512_add_epi32(dot[j][i], corr[j]));
                acc[j][i] = _mm512_fmadd_ps(exact, _mm512_mul_ps(dw[i], dx[j]), acc[j][i]);
            }
        }
    }
    // 4. each output's lanes summed, in one order whatever R and W (`sum_lanes16` sums each
    // of its lanes as `sum_lanes_tree` sums one vector)
    if R * W == 16 {
        let v: [__m512i; 16] = std::array::from_fn(|k| _mm512_castps_si512(acc[k / W][k % W]));
        let mut sums = [0f32; 16];
        // SAFETY: sixteen f32 into sixteen.
        unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), crate::kernels::sum_lanes16(v)) };
        return std::array::from_fn(|j| std::array::from_fn(|i| sums[j * W + i]));
    }
    acc.map(|a| a.map(|v| crate::kernels::sum_lanes_tree(v)))
}

/// Span s's block dot products (unsigned weights by signed inputs), block k of the span in
/// lane k: input rows `xq` with the first W weight rows of tile `t`, chunk by chunk.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; `t` is a tile of `tl` and at least 64 bytes after it; span s
/// lies inside each input row.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn span_dots<const R: usize, const W: usize>(
    xq: &[&[i8]; R],
    kind: QuantKind,
    tl: Tiling,
    t: &[u8],
    s: usize,
) -> [[__m512i; W]; R] {
    // A short last span's chunks are 4·width bytes, read as whole vectors: the lanes past
    // its blocks hold whatever follows (the next chunk, or the tile's successor) times the
    // input's zero padding, and `dots` drops them (the span's scales are loaded with those
    // lanes zero; a test fails without that). Byte-masked loads instead cost a lone row a
    // fifth of its speed.
    let width = tl.width(s);
    // chunk k of weight row i at wp[i] + k·step, of input row j at xp[j] + 64·k
    let step = 4 * width * TILE_ROWS;
    let wp: [*const u8; W] = std::array::from_fn(|i| t[tl.chunk_at(s, 0, i)..].as_ptr());
    let xp = xq.map(|q| q[x_at(s * SPAN, 0)..].as_ptr());
    let mut dot = [[_mm512_setzero_si512(); W]; R];
    // (loops, not closures: a closure would not inherit this fn's target features)
    let (mut xv, mut xw) = ([_mm512_setzero_si512(); R], [_mm512_setzero_si512(); R]);
    match kind {
        QuantKind::Q8_0 => {
            for k in 0..BLOCK / 4 {
                for j in 0..R {
                    // SAFETY: an input row's span is 512 bytes (8 chunks).
                    xv[j] = unsafe { _mm512_loadu_si512(xp[j].add(64 * k).cast()) };
                }
                for i in 0..W {
                    // SAFETY: the chunk starts inside the tile (`chunk_at`), and 64 bytes from it
                    // lie inside `t` (the tile and at least 64 bytes after it, asserted).
                    let wv = unsafe { _mm512_loadu_si512(wp[i].add(k * step).cast()) };
                    for j in 0..R {
                        dot[j][i] = _mm512_dpbusd_epi32(dot[j][i], wv, xv[j]);
                    }
                }
            }
        }
        QuantKind::Q4_0 => {
            let nib = _mm512_set1_epi8(15);
            for k in 0..BLOCK / 8 {
                // packed byte 4k + e holds elements 4k + e (low) and 4k + e + 16 (high)
                for j in 0..R {
                    // SAFETY: as for Q8_0.
                    unsafe {
                        xv[j] = _mm512_loadu_si512(xp[j].add(64 * k).cast());
                        xw[j] = _mm512_loadu_si512(xp[j].add(64 * (k + BLOCK / 8)).cast());
                    }
                }
                for i in 0..W {
                    // SAFETY: as for Q8_0.
                    let z = unsafe { _mm512_loadu_si512(wp[i].add(k * step).cast()) };
                    let lo = _mm512_and_si512(z, nib);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
                    for j in 0..R {
                        dot[j][i] = _mm512_dpbusd_epi32(dot[j][i], lo, xv[j]);
                        dot[j][i] = _mm512_dpbusd_epi32(dot[j][i], hi, xw[j]);
                    }
                }
            }
        }
    }
    dot
}

/// `super::quantize_row` sixteen lanes at a time: the same arithmetic, so the same quants,
/// scales and corrections. It runs before every product, on one thread while the
/// other waits, where the scalar loop took a few percent of a decoding step.
///
/// # Safety
/// AVX-512F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_row(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    corr: &mut [i32],
    offset: i32,
) {
    let nb = x.len() / BLOCK;
    assert!(qs.len() >= nb.div_ceil(SPAN) * SPAN * BLOCK && d.len() >= nb && corr.len() >= nb);
    for b in 0..nb {
        // SAFETY: block b's 32 values are in x.
        let v = unsafe {
            let p = x.as_ptr().add(b * BLOCK);
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        };
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
        let scale = amax / 127.0;
        let id = if scale == 0.0 { 0.0 } else { 1.0 / scale };
        let q = v.map(|v| round_away(_mm512_mul_ps(v, _mm512_set1_ps(id))));
        for (h, q) in q.iter().enumerate() {
            // elements 16h..16h + 16, four at a time to their chunks (`x_at`); the conversion
            // saturates, as `as i8` does
            let v = _mm512_cvtsepi32_epi8(*q);
            let four = [
                v,
                _mm_srli_si128::<4>(v),
                _mm_srli_si128::<8>(v),
                _mm_srli_si128::<12>(v),
            ];
            for (k, v) in four.into_iter().enumerate() {
                // SAFETY: x_at(b, ·) < qs.len() for the row's blocks (asserted above).
                unsafe { _mm_storeu_si32(qs.as_mut_ptr().add(x_at(b, 16 * h + 4 * k)).cast(), v) };
            }
        }
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
        d[b] = scale;
        corr[b] = -offset * sum;
    }
}

/// `f32::round` (half away from zero) of each lane, as int32: the truncation, plus one step
/// away from zero where the dropped fraction (exact, by Sterbenz) is at least a half.
#[target_feature(enable = "avx512f")]
fn round_away(p: __m512) -> __m512i {
    let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
    let half =
        _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(p, t)), _mm512_set1_ps(0.5));
    // ±1 with p's sign: 1.0's bits with p's sign bit
    let sign = _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32(i32::MIN));
    let step = _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_set1_epi32(0x3f80_0000)));
    _mm512_cvttps_epi32(_mm512_mask_add_ps(t, half, t, step))
}

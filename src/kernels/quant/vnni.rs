//! The AVX512-VNNI engine. `vpdpbusd` multiplies unsigned bytes by signed bytes and sums each
//! four into an int32 lane. The weights are made unsigned by an offset (Q8_0: q + 128, as
//! stored; Q4_0: its nibbles, q + 8), which the input's per-block correction
//! (`QuantAct::corr`, −offset · d_x · Σq_x) takes back out:
//!
//! ```text
//! Σ_b d_w·d_x·Σ_j q_w·q_x = Σ_b d_w·d_x·Σ_j (q_w + off)·q_x  +  Σ_b d_w·corr_b
//! ```
//!
//! Four blocks a step (`GROUP`, laid out by `q8_at`): one register holds the first halves of
//! four blocks, another their second halves (Q4_0: one load's low and high nibbles), so two
//! `vpdpbusd` leave block k's sum in 128-bit lane k. Each lane is scaled by its block's
//! d_w·d_x into f32 accumulators. Decoding takes one input row against a whole tile of weight
//! rows (`TILE_ROWS`, one stretch of memory); the GEMM four input rows against half a tile,
//! sharing every load.

use super::{q8_at, QuantAct, QuantKind, QuantMatrix, Tiling, BLOCK, GROUP, TILE_ROWS};
use std::arch::x86_64::*;
use std::ops::Range;

/// Weight rows the GEMM's step reads together (half a tile), against as many input rows.
const NR: usize = 4;

/// The outputs (rows × outs), handed to `put(row, out, value)`, a tile of weight rows at a
/// time: with one input row (decoding) all of its rows together, else half of them at a time
/// against four input rows.
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
            let s = unsafe { gemv_dots(x, rows.start, w.kind, w.tiling(), t) };
            (0..oh).for_each(|i| put(rows.start, o0 + i, s[i]));
            continue;
        }
        for i0 in (0..oh).step_by(NR) {
            for r0 in rows.clone().step_by(4) {
                let xr: [usize; 4] = std::array::from_fn(|j| (r0 + j).min(rows.end - 1));
                // SAFETY: as above.
                let s = unsafe { gemm_dots(x, xr, w.kind, w.tiling(), t, i0) };
                for (j, s) in s.iter().enumerate().take(4.min(rows.end - r0)) {
                    (0..NR.min(oh - i0)).for_each(|i| put(r0 + j, o0 + i0 + i, s[i]));
                }
            }
        }
    }
}

/// Decoding's dot products: input row `r` with every row of weight tile `t`, read start to
/// end. Each sixteen blocks' scale products d_w·d_x are formed once, so that a group's step
/// per row is its two `vpdpbusd`, one permute, one convert and one FMA.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; the row exists; `t` is a whole tile of `tl`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemv_dots(
    x: &QuantAct,
    r: usize,
    kind: QuantKind,
    tl: Tiling,
    t: &[u8],
) -> [f32; TILE_ROWS] {
    assert_eq!(t.len(), tl.bytes());
    let (xq, xd, xc) = x.row(r);
    let mut acc = [_mm512_setzero_ps(); TILE_ROWS];
    let lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for c16 in (0..tl.padded).step_by(16) {
        let count = 16.min(tl.padded - c16);
        // 1. sixteen blocks' scale products, and the offset's correction
        // SAFETY: the masked loads read the `count` scales left in each row; the input's
        // scales and corrections are padded to whole groups of sixteen.
        let s: [__m512; TILE_ROWS] = unsafe {
            let m = crate::kernels::lane_mask(count);
            let (dx, corr) = (
                _mm512_loadu_ps(xd.as_ptr().add(c16)),
                _mm512_loadu_ps(xc.as_ptr().add(c16)),
            );
            std::array::from_fn(|i| {
                let p = t.as_ptr().add(tl.scale_at(i, c16));
                let dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast()));
                acc[i] = _mm512_fmadd_ps(dw, corr, acc[i]);
                _mm512_mul_ps(dw, dx)
            })
        };
        // 2. four blocks a step, every row's group in turn
        for g in 0..count / GROUP {
            let b = c16 + GROUP * g;
            // lanes 4k..4k + 4 take block b + k's scales
            let idx = _mm512_add_epi32(lanes, _mm512_set1_epi32((GROUP * g) as i32));
            // SAFETY: the input rows are padded to whole groups of sixteen blocks.
            let (xa, xb) = unsafe {
                let p = xq.as_ptr().add(b * BLOCK);
                (
                    _mm512_loadu_si512(p.cast()),
                    _mm512_loadu_si512(p.add(64).cast()),
                )
            };
            for i in 0..TILE_ROWS {
                // SAFETY: the group lies inside the tile.
                let (wa, wb) = unsafe { weights(kind, t, tl.group_at(b / GROUP, i)) };
                let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, xa);
                let dp = _mm512_dpbusd_epi32(dp, wb, xb);
                let sl = _mm512_permutexvar_ps(idx, s[i]);
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), sl, acc[i]);
            }
        }
    }
    acc.map(|a| _mm512_reduce_add_ps(a))
}

/// The GEMM's dot products: input rows `xr` with rows i0..i0 + `NR` of weight tile `t`.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; the rows exist; `t` is a whole tile of `tl`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn gemm_dots(
    x: &QuantAct,
    xr: [usize; 4],
    kind: QuantKind,
    tl: Tiling,
    t: &[u8],
    i0: usize,
) -> [[f32; NR]; 4] {
    assert!(t.len() == tl.bytes() && i0 + NR <= TILE_ROWS);
    let xrow = xr.map(|r| x.row(r));
    let mut acc = [[_mm512_setzero_ps(); NR]; 4];
    let lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    for c16 in (0..tl.padded).step_by(16) {
        let count = 16.min(tl.padded - c16);
        // 1. sixteen blocks' scales, and the offset's correction
        // SAFETY: as in `gemv_dots`.
        let (dw, dx) = unsafe {
            let m = crate::kernels::lane_mask(count);
            (
                std::array::from_fn::<_, NR, _>(|i| {
                    let p = t.as_ptr().add(tl.scale_at(i0 + i, c16));
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast()))
                }),
                xrow.map(|(_, d, _)| _mm512_loadu_ps(d.as_ptr().add(c16))),
            )
        };
        for j in 0..4 {
            // SAFETY: as above (padded).
            let corr = unsafe { _mm512_loadu_ps(xrow[j].2.as_ptr().add(c16)) };
            for i in 0..NR {
                acc[j][i] = _mm512_fmadd_ps(dw[i], corr, acc[j][i]);
            }
        }
        // 2. four blocks a step
        for g in 0..count / GROUP {
            let b = c16 + GROUP * g;
            let idx = _mm512_add_epi32(lanes, _mm512_set1_epi32((GROUP * g) as i32));
            // SAFETY: the group lies inside the tile.
            let wv: [_; NR] = std::array::from_fn(|i| unsafe {
                weights(kind, t, tl.group_at(b / GROUP, i0 + i))
            });
            let dwl = dw.map(|d| _mm512_permutexvar_ps(idx, d));
            for j in 0..4 {
                // SAFETY: the input rows are padded to whole groups of sixteen blocks.
                let (xa, xb) = unsafe {
                    let p = xrow[j].0.as_ptr().add(b * BLOCK);
                    (
                        _mm512_loadu_si512(p.cast()),
                        _mm512_loadu_si512(p.add(64).cast()),
                    )
                };
                let dxl = _mm512_permutexvar_ps(idx, dx[j]);
                for i in 0..NR {
                    let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[i].0, xa);
                    let dp = _mm512_dpbusd_epi32(dp, wv[i].1, xb);
                    let s = _mm512_mul_ps(dwl[i], dxl);
                    acc[j][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), s, acc[j][i]);
                }
            }
        }
    }
    acc.map(|a| a.map(|v| _mm512_reduce_add_ps(v)))
}

/// A weight row's group of four blocks at byte `at` of tile `t`, as unsigned bytes
/// (q + offset): their first halves, then their second halves.
///
/// # Safety
/// AVX-512F/BW; the group lies inside `t`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn weights(kind: QuantKind, t: &[u8], at: usize) -> (__m512i, __m512i) {
    debug_assert!(at + GROUP * kind.quant_bytes() <= t.len());
    // SAFETY: the caller's contract: the group's bytes are in the tile.
    let p = unsafe { t.as_ptr().add(at) };
    match kind {
        // SAFETY: as above: 128 bytes from the group's start.
        QuantKind::Q8_0 => unsafe {
            (
                _mm512_loadu_si512(p.cast()),
                _mm512_loadu_si512(p.add(64).cast()),
            )
        },
        QuantKind::Q4_0 => {
            // SAFETY: as above: 64 bytes.
            let z = unsafe { _mm512_loadu_si512(p.cast()) };
            let nib = _mm512_set1_epi8(15);
            (
                _mm512_and_si512(z, nib),
                _mm512_and_si512(_mm512_srli_epi16(z, 4), nib),
            )
        }
    }
}

/// `super::quantize_row` sixteen lanes at a time: the same arithmetic, so the same quants,
/// scales and corrections bit for bit. It runs before every product, on one thread while the
/// other waits, where the scalar loop took a few percent of a decoding step.
///
/// # Safety
/// AVX-512F/BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize_row(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    corr: &mut [f32],
    offset: f32,
) {
    let nb = x.len() / BLOCK;
    assert!(qs.len() >= nb.div_ceil(GROUP) * GROUP * BLOCK && d.len() >= nb && corr.len() >= nb);
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
            // SAFETY: elements 16h..16h + 16 of block b lie side by side at q8_at (asserted
            // inside qs above); the conversion saturates, as `as i8` does.
            unsafe {
                let at = qs.as_mut_ptr().add(q8_at(b, 16 * h));
                _mm_storeu_si128(at.cast(), _mm512_cvtsepi32_epi8(*q));
            }
        }
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q[0], q[1]));
        d[b] = scale;
        corr[b] = -offset * scale * sum as f32;
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

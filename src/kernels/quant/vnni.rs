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
//! d_w·d_x into f32 accumulators. A tile of MR input rows × 4 weight rows shares every load.

use super::{QuantAct, QuantKind, QuantMatrix, BLOCK, GROUP};
use std::arch::x86_64::*;
use std::ops::Range;

/// Weight rows a tile reads together.
const NR: usize = 4;

/// The outputs (rows × outs), handed to `put(row, out, value)`: four weight rows at a time,
/// with one input row (decoding) or four.
///
/// # Safety
/// The CPU must have AVX-512F, AVX-512BW and AVX512-VNNI; `rows` and `outs` must lie inside
/// `x` and `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile(
    x: &QuantAct,
    w: &QuantMatrix,
    rows: Range<usize>,
    outs: Range<usize>,
    put: impl Fn(usize, usize, f32),
) {
    assert!(rows.end <= x.n && outs.end <= w.rows);
    for o0 in outs.clone().step_by(NR) {
        // ragged tiles repeat their last row and drop its copies' sums
        let wr: [usize; NR] = std::array::from_fn(|i| (o0 + i).min(outs.end - 1));
        let oh = NR.min(outs.end - o0);
        if rows.len() == 1 {
            // SAFETY: the features are this function's contract; rows are in bounds.
            let s = unsafe { dots::<1>(x, w, [rows.start], wr) };
            (0..oh).for_each(|i| put(rows.start, o0 + i, s[0][i]));
            continue;
        }
        for r0 in rows.clone().step_by(4) {
            let xr: [usize; 4] = std::array::from_fn(|j| (r0 + j).min(rows.end - 1));
            // SAFETY: as above.
            let s = unsafe { dots::<4>(x, w, xr, wr) };
            for (j, s) in s.iter().enumerate().take(4.min(rows.end - r0)) {
                (0..oh).for_each(|i| put(r0 + j, o0 + i, s[i]));
            }
        }
    }
}

/// The dot products of input rows `xr` with weight rows `wr`.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; the rows exist.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dots<const MR: usize>(
    x: &QuantAct,
    w: &QuantMatrix,
    xr: [usize; MR],
    wr: [usize; NR],
) -> [[f32; NR]; MR] {
    let (nb, kind) = (w.blocks(), w.kind);
    let wrow = wr.map(|o| w.row(o));
    // decoding (one input row) is bound by how fast the weights stream in: each step asks
    // for the same group of the weight rows two tiles on (rows are contiguous)
    let fetch = if MR == 1 { 2 * NR * wrow[0].0.len() } else { 0 };
    let xrow = xr.map(|r| x.row(r));
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    let lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    let padded = nb.div_ceil(GROUP) * GROUP;
    for c16 in (0..padded).step_by(16) {
        let count = 16.min(padded - c16);
        // 1. sixteen blocks' scales, and the offset's correction
        // SAFETY: the masked load reads the `count` scales left in the (padded) row; the
        // input's scales and corrections are padded to whole groups of sixteen.
        let (dw, dx) = unsafe {
            let m = crate::kernels::lane_mask(count);
            (
                wrow.map(|(_, d)| {
                    _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, d.as_ptr().add(c16).cast()))
                }),
                xrow.map(|(_, d, _)| _mm512_loadu_ps(d.as_ptr().add(c16))),
            )
        };
        for j in 0..MR {
            // SAFETY: as above (padded).
            let corr = unsafe { _mm512_loadu_ps(xrow[j].2.as_ptr().add(c16)) };
            for i in 0..NR {
                acc[j][i] = _mm512_fmadd_ps(dw[i], corr, acc[j][i]);
            }
        }
        // 2. four blocks a step
        for g in 0..count / GROUP {
            let b = c16 + GROUP * g;
            // lanes 4k..4k + 4 take block b + k's scales
            let idx = _mm512_add_epi32(lanes, _mm512_set1_epi32((GROUP * g) as i32));
            // SAFETY: the group lies inside each (padded) weight row.
            let wv = wrow.map(|(q, _)| unsafe { weights(kind, q, b) });
            if fetch > 0 {
                let qb = GROUP * kind.quant_bytes();
                for (q, _) in wrow {
                    let at = q.as_ptr().wrapping_add(b * kind.quant_bytes() + fetch);
                    for line in (0..qb).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(line).cast());
                    }
                }
            }
            let dwl = dw.map(|d| _mm512_permutexvar_ps(idx, d));
            for j in 0..MR {
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

/// The group of four blocks from block b of a weight row, as unsigned bytes (q + offset): their
/// first halves, then their second halves.
///
/// # Safety
/// AVX-512F/BW; the group lies inside `q`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn weights(kind: QuantKind, q: &[u8], b: usize) -> (__m512i, __m512i) {
    debug_assert!((b + GROUP) * kind.quant_bytes() <= q.len());
    // SAFETY: the caller's contract: the group's bytes are in the row.
    let p = unsafe { q.as_ptr().add(b * kind.quant_bytes()) };
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

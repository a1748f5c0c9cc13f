//! The AVX512-VNNI engine. `vpdpbusd` multiplies unsigned bytes by signed bytes and sums each
//! four into an int32 lane. The weights are made unsigned by an offset (Q8_0: q + 128, its
//! top bit flipped; Q4_0: its nibbles, q + 8), which the input's per-block correction
//! (`QuantAct::corr`, −offset · d_x · Σq_x) takes back out:
//!
//! ```text
//! Σ_b d_w·d_x·Σ_j q_w·q_x = Σ_b d_w·d_x·Σ_j (q_w + off)·q_x  +  Σ_b d_w·corr_b
//! ```
//!
//! One 512-bit register holds two blocks: int32 lanes 0–7 sum the first, 8–15 the second,
//! and each lane is scaled by its block's d_w·d_x before adding into f32 accumulators. A tile
//! of MR input rows × 4 weight rows shares every load.

use super::{QuantAct, QuantKind, QuantMatrix, BLOCK};
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
    let xrow = xr.map(|r| x.row(r));
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    let pair = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    for c16 in (0..nb).step_by(16) {
        let count = 16.min(nb - c16);
        // 1. sixteen blocks' scales, and the offset's correction
        // SAFETY: the masked load reads the `count` scales left in the row; the input's
        // scales and corrections are padded to whole groups of sixteen.
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
        // 2. two blocks a step
        for p in 0..count.div_ceil(2) {
            let b = c16 + 2 * p;
            let two = b + 1 < nb;
            // lanes 0–7 take block 2p's scale, 8–15 block 2p + 1's
            let idx = _mm512_add_epi32(pair, _mm512_set1_epi32(2 * p as i32));
            // SAFETY: block b (and b + 1 when `two`) is inside each weight row.
            let wv = wrow.map(|(q, _)| unsafe { weights(kind, q, b, two) });
            let dwl = dw.map(|d| _mm512_permutexvar_ps(idx, d));
            for j in 0..MR {
                // SAFETY: the input rows are padded to whole pairs of blocks.
                let xv = unsafe { _mm512_loadu_si512(xrow[j].0.as_ptr().add(b * BLOCK).cast()) };
                let dxl = _mm512_permutexvar_ps(idx, dx[j]);
                for i in 0..NR {
                    let dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[i], xv);
                    let s = _mm512_mul_ps(dwl[i], dxl);
                    acc[j][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), s, acc[j][i]);
                }
            }
        }
    }
    acc.map(|a| a.map(|v| _mm512_reduce_add_ps(v)))
}

/// Blocks b and (with `two`) b + 1 of a weight row as 64 unsigned bytes in element order
/// (q + offset), zero past the row's last block.
///
/// # Safety
/// AVX-512F/BW; the blocks lie inside `q`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn weights(kind: QuantKind, q: &[u8], b: usize, two: bool) -> __m512i {
    let bytes = kind.quant_bytes() * if two { 2 } else { 1 };
    debug_assert!((b * kind.quant_bytes() + bytes) <= q.len());
    // SAFETY: the caller's contract: `bytes` bytes from block b are in the row.
    let p = unsafe { q.as_ptr().add(b * kind.quant_bytes()) };
    match kind {
        QuantKind::Q8_0 => {
            let m: __mmask64 = if two { !0 } else { (1 << 32) - 1 };
            // SAFETY: the mask covers the blocks in the row alone.
            let v = unsafe { _mm512_maskz_loadu_epi8(m, p.cast()) };
            _mm512_maskz_xor_epi32(if two { 0xffff } else { 0xff }, v, _mm512_set1_epi8(-128))
        }
        QuantKind::Q4_0 => {
            let m: __mmask32 = if two { !0 } else { 0xffff };
            // SAFETY: as above.
            let y = unsafe { _mm256_maskz_loadu_epi8(m, p.cast()) };
            let nib = _mm256_set1_epi8(15);
            let lo = _mm256_and_si256(y, nib);
            let hi = _mm256_and_si256(_mm256_srli_epi16(y, 4), nib);
            // [lo b, lo b+1, hi b, hi b+1] in 128-bit lanes, to [lo b, hi b, lo b+1, hi b+1]
            let z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            _mm512_shuffle_i64x2(z, z, 0b11_01_10_00)
        }
    }
}

//! The AVX2 engine, for CPUs without AVX512-VNNI (AMD Zen 2 and Zen 3, Intel's client cores
//! before Ice Lake and many since): the VNNI engine's tiles and order of sums, with 256-bit
//! registers. A 64-byte chunk of a tile (four quant bytes of each of its sixteen rows) is two
//! registers, rows 0–7 and 8–15, and `vpdpbusd` becomes `vpmaddubsw` (unsigned by signed
//! bytes, adjacent pairs summed into int16) then `vpmaddwd` by ones (pairs of those into
//! int32). `vpmaddubsw` saturates at ±32,767, so no pair may exceed it:
//!
//! - Q4_0: the nibbles as stored (q + 8 ≤ 15) by the input (|q_x| ≤ 127): a pair is at most
//!   2 · 15 · 127; the input's correction (−8 · Σq_x, `QuantAct::corr`) takes the offset back
//!   out in int32, as on VNNI.
//! - Q8_0: stored as q + 128, which would reach 2 · 255 · 127; instead the signed quant
//!   (the stored byte with its top bit flipped back), as |q_w| (at most 128) by q_x with
//!   q_w's sign (`vpsignb`): at most 2 · 128 · 127, and no correction.
//!
//! Either way each block's dot product is exact in int32, the same integer as the VNNI
//! engine's, and is scaled into the f32 sums by the same convert and FMA: the two engines
//! give the same bits.

use super::{QuantAct, QuantKind, TileSums, Tiling, BLOCK, TILE_ROWS};
use std::arch::x86_64::*;

/// Input rows the GEMM's step takes against `NT` tiles: AVX2 has sixteen registers, so four
/// rows by one tile (eight int32 sums, two halves each; the f32 sums, touched once a block,
/// may live in memory) where VNNI takes 4 × 2. Against two rows (`difftx bench matmul --m
/// 512 --n 2816 --k 512 --layout nt`, Zen 3, three alternating runs, medians): Q4_0 124
/// against 106 GFLOP/s, Q8_0 111 against 121, within this machine's noise.
pub(super) const NX: usize = 4;
/// Tiles of weight rows the GEMM's step takes at once.
pub(super) const NT: usize = 1;

/// Sixteen lanes as two registers: rows 0–7 of a tile, then 8–15.
type Half2<T> = [T; 2];

/// Whether this CPU runs the engine: AVX2 with FMA and F16C (the scales' conversion).
pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

// The AVX2 engine as `super::engine_tile` runs it (the VNNI engine's loop, with `NX` and `NT`
// of its own).
simd_dots!(Avx2, Half2<__m256>);

/// Two registers' sixteen lanes.
#[target_feature(enable = "avx2")]
fn lanes(v: Half2<__m256>) -> TileSums {
    let mut s = [0f32; TILE_ROWS];
    // SAFETY: eight f32 into each half of sixteen.
    unsafe {
        _mm256_storeu_ps(s.as_mut_ptr(), v[0]);
        _mm256_storeu_ps(s.as_mut_ptr().add(8), v[1]);
    }
    s
}

/// `vnni::dots` on AVX2: the sums of input rows `xr` with the sixteen rows of each tile of
/// `ts`, block after block, in the same order and with the same f32 operations, each block
/// asking for its part of `next`.
///
/// # Safety
/// AVX2, FMA and F16C; the rows exist; each of `ts` is a tile of `tl`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots<const R: usize, const T: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    ts: [&[u8]; T],
    next: crate::NextLines,
) -> [[Half2<__m256>; T]; R] {
    let ops = super::Operands::new(x, xr, tl, ts);
    let (wp, xd, xc) = (ops.tiles, ops.xd, ops.xc);
    let corrected = kind == QuantKind::Q4_0;
    let mut acc = [[[_mm256_setzero_ps(); 2]; T]; R];
    for b in 0..tl.blocks {
        next.fetch(b, tl.blocks);
        // 1. the block's scales: the tiles' sixteen rows' (f16), then each input row's
        let mut dw = [[_mm256_setzero_ps(); 2]; T];
        for k in 0..T {
            for (h, d) in dw[k].iter_mut().enumerate() {
                // SAFETY: the block's sixteen scales lie inside the tile (`scale_at`).
                *d = unsafe {
                    _mm256_cvtph_ps(_mm_loadu_si128(wp[k].add(tl.scale_at(8 * h, b)).cast()))
                };
            }
        }
        // 2. every block dot product, exact in int32
        // SAFETY: the block lies inside the tiles (asserted) and the input rows (`row`).
        let dot = unsafe { block_dots::<R, T>(&ops, kind, tl, b) };
        // 3. scaled into the f32 sums
        for j in 0..R {
            let corr = _mm256_set1_epi32(if corrected { xc[j][b] } else { 0 });
            let dx = _mm256_set1_ps(xd[j][b]);
            for k in 0..T {
                for h in 0..2 {
                    let exact = _mm256_cvtepi32_ps(_mm256_add_epi32(dot[j][k][h], corr));
                    let scale = _mm256_mul_ps(dw[k][h], dx);
                    acc[j][k][h] = _mm256_fmadd_ps(exact, scale, acc[j][k][h]);
                }
            }
        }
    }
    acc
}

/// Block b's exact dot products of input rows `xq` with the sixteen rows of each tile of
/// `ts`, chunk by chunk: each chunk of weights loaded once for all the input rows, each
/// input's four bytes broadcast once for all the tiles. Q8_0's in signed form, Q4_0's with
/// the offset still in (see the module's note).
///
/// # Safety
/// AVX2; `ops` was made for tiles of `tl`, with block b inside them (`Operands::new` checks
/// the tiles' and the rows' lengths).
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn block_dots<const R: usize, const T: usize>(
    ops: &super::Operands<R, T>,
    kind: QuantKind,
    tl: Tiling,
    b: usize,
) -> [[Half2<__m256i>; T]; R] {
    // chunk k of tile t at wp[t] + 64·k; input row j's element e at xp[j] + e
    // SAFETY: block b lies inside the tiles (the caller's contract).
    let (wp, xp) = unsafe { ops.block(tl, b) };
    let ones = _mm256_set1_epi16(1);
    let mut dot = [[[_mm256_setzero_si256(); 2]; T]; R];
    // (loops, not closures: a closure would not inherit this fn's target features)
    match kind {
        QuantKind::Q8_0 => {
            let flip = _mm256_set1_epi8(i8::MIN);
            for k in 0..BLOCK / 4 {
                let (mut mag, mut sign) = ([[_mm256_setzero_si256(); 2]; T], [[ones; 2]; T]);
                for t in 0..T {
                    for h in 0..2 {
                        // SAFETY: a block's eight chunks lie inside the tile, on cache lines.
                        let z = unsafe { _mm256_load_si256(wp[t].add(64 * k + 32 * h).cast()) };
                        let q = _mm256_xor_si256(z, flip);
                        (mag[t][h], sign[t][h]) = (_mm256_abs_epi8(q), q);
                    }
                }
                for j in 0..R {
                    // SAFETY: elements 4k..4k + 4 of the block (asserted above).
                    let xv = _mm256_set1_epi32(unsafe {
                        xp[j].add(4 * k).cast::<i32>().read_unaligned()
                    });
                    for t in 0..T {
                        for h in 0..2 {
                            let sx = _mm256_sign_epi8(xv, sign[t][h]);
                            let pairs = _mm256_maddubs_epi16(mag[t][h], sx);
                            let quads = _mm256_madd_epi16(pairs, ones);
                            dot[j][t][h] = _mm256_add_epi32(dot[j][t][h], quads);
                        }
                    }
                }
            }
        }
        QuantKind::Q4_0 => {
            // each `vpmaddubsw` pair is at most 2 · 15 · 127, so the block's eight of them sum
            // in int16 (at most 30,480) and one `vpmaddwd` a block widens them: a quarter of
            // the multiplies, the port this engine waits on
            let nib = _mm256_set1_epi8(15);
            let mut pairs = [[[_mm256_setzero_si256(); 2]; T]; R];
            for k in 0..BLOCK / 8 {
                // packed byte 4k + e holds elements 4k + e (low) and 4k + e + 16 (high)
                let (mut lo, mut hi) = ([[nib; 2]; T], [[nib; 2]; T]);
                for t in 0..T {
                    for h in 0..2 {
                        // SAFETY: a block's four chunks lie inside the tile, on cache lines.
                        let z = unsafe { _mm256_load_si256(wp[t].add(64 * k + 32 * h).cast()) };
                        lo[t][h] = _mm256_and_si256(z, nib);
                        hi[t][h] = _mm256_and_si256(_mm256_srli_epi16(z, 4), nib);
                    }
                }
                for j in 0..R {
                    // SAFETY: elements 4k..4k + 4 and 4k + 16..4k + 20 of the block.
                    let (xl, xh) = unsafe {
                        (
                            _mm256_set1_epi32(xp[j].add(4 * k).cast::<i32>().read_unaligned()),
                            _mm256_set1_epi32(xp[j].add(4 * k + 16).cast::<i32>().read_unaligned()),
                        )
                    };
                    for t in 0..T {
                        for h in 0..2 {
                            let low = _mm256_maddubs_epi16(lo[t][h], xl);
                            let high = _mm256_maddubs_epi16(hi[t][h], xh);
                            let p = &mut pairs[j][t][h];
                            *p = _mm256_add_epi16(*p, _mm256_add_epi16(low, high));
                        }
                    }
                }
            }
            for j in 0..R {
                for t in 0..T {
                    for h in 0..2 {
                        dot[j][t][h] = _mm256_madd_epi16(pairs[j][t][h], ones);
                    }
                }
            }
        }
    }
    dot
}

/// `super::quantize_row` eight lanes at a time: the same arithmetic (the block's largest
/// magnitude over 127, each value times its inverse rounded half away from zero), so the same
/// quants, scales and corrections; `vnni::quantize_row` is its sixteen-lane twin.
///
/// # Safety
/// AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_row(
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    corr: &mut [i32],
    offset: i32,
) {
    let nb = x.len() / BLOCK;
    assert!(qs.len() >= nb * BLOCK && d.len() >= nb && corr.len() >= nb);
    let sign = _mm256_set1_ps(-0.0);
    // after the packs below, int32 lane r holds values 0–3 of register r and lane r + 4 its
    // values 4–7: these lanes in this order give the block's 32 quants in order
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..nb {
        let mut v = [_mm256_setzero_ps(); 4];
        let mut m = _mm256_setzero_ps();
        for (i, v) in v.iter_mut().enumerate() {
            // SAFETY: block b's 32 values are in x (nb blocks of it).
            *v = unsafe { _mm256_loadu_ps(x.as_ptr().add(b * BLOCK + 8 * i)) };
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *v));
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let (scale, id) = super::block::q8_scale(amax);
        let id = _mm256_set1_ps(id);
        let mut q = [_mm256_setzero_si256(); 4];
        let mut sum = _mm256_setzero_si256();
        for (q, v) in q.iter_mut().zip(&v) {
            *q = round_away(_mm256_mul_ps(*v, id));
            sum = _mm256_add_epi32(sum, *q);
        }
        // int32 → int16 → int8, saturating as `as i8` does (each pack works within a 128-bit
        // half), then the runs of four back in order
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let w = _mm256_permutevar8x32_epi32(w, order);
        // SAFETY: x_at(b, 0..32) = b·32.. < qs.len() (asserted above), in order.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().add(super::x_at(b, 0)).cast(), w) };
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256::<1>(sum),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        d[b] = scale;
        corr[b] = -offset * _mm_cvtsi128_si32(s);
    }
}

/// `f32::round` (half away from zero) of each lane, as int32: the truncation, plus one step
/// away from zero where the dropped fraction (exact, by Sterbenz) is at least a half.
#[target_feature(enable = "avx2")]
fn round_away(p: __m256) -> __m256i {
    let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
    let frac = _mm256_andnot_ps(_mm256_set1_ps(-0.0), _mm256_sub_ps(p, t));
    let half = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
    // ±1 with p's sign: 1.0's bits with p's sign bit, kept where the fraction was a half or more
    let step = _mm256_or_ps(_mm256_and_ps(p, _mm256_set1_ps(-0.0)), _mm256_set1_ps(1.0));
    _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(step, half)))
}

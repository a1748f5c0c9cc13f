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
//! A tile's sixteen weight rows lie side by side, one per int32 lane (`Tiling`): a 64-byte
//! chunk holds four quant bytes of each row, and one `vpdpbusd` against four bytes of the
//! input broadcast to every lane adds them into all sixteen rows' block sums. A block's eight
//! chunks (Q4_0: four loads, low and high nibbles) give its sixteen exact block dot products,
//! which one convert and one FMA by the rows' scales times the input's add to the sixteen f32
//! sums: each output is summed block after block in its own lane, with nothing to add across
//! lanes at the end. One function (`dots`) serves decoding (one input row against one tile,
//! one stretch of memory) and the GEMM (`NX` input rows against `NT` tiles, sharing every
//! load), and sums each output in the same order in both, so that a row's numbers are the same
//! bits alone or in a batch.

use super::{x_at, QuantAct, QuantKind, TileSums, Tiling, BLOCK, TILE_ROWS};
use std::arch::x86_64::*;

/// Input rows the GEMM's step takes against `NT` tiles of weight rows: 4 × 2 int32 block sums
/// and as many f32 sums in registers, each weight chunk loaded once for four input rows and
/// each broadcast input quad used for two tiles.
pub(super) const NX: usize = 4;
/// Tiles of weight rows the GEMM's step takes at once.
pub(super) const NT: usize = 2;

// The VNNI engine as `super::engine_tile` runs it (`NX` input rows against `NT` tiles a GEMM
// step, one input row a tile at a time when decoding).
simd_dots!(Vnni, __m512);

/// A register's sixteen lanes.
#[target_feature(enable = "avx512f")]
fn lanes(v: __m512) -> TileSums {
    let mut s = [0f32; TILE_ROWS];
    // SAFETY: sixteen f32 into sixteen.
    unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) };
    s
}

/// The sums of input rows `xr` with the sixteen rows of each tile of `ts`, one register per
/// (input row, tile), lane i for the tile's row i: block after block, the block's exact int32
/// dot products (`block_dots`, each sum starting from the offset's correction), then one FMA
/// of them times d_w·d_x, in the same order for every R and T; each block also asks for its
/// part of `next`.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; the rows exist; each of `ts` is a tile of `tl`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dots<const R: usize, const T: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    ts: [&[u8]; T],
    next: crate::NextLines,
) -> [[__m512; T]; R] {
    let ops = super::Operands::new(x, xr, tl, ts);
    let (wp, xd, xc) = (ops.tiles, ops.xd, ops.xc);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for b in 0..tl.blocks {
        next.fetch(b, tl.blocks);
        // 1. the block's scales: the tiles' sixteen rows' (f16), then each input row's
        let mut dw = [_mm512_setzero_ps(); T];
        for k in 0..T {
            // SAFETY: the block's sixteen scales lie inside the tile (`scale_at`).
            dw[k] =
                unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(wp[k].add(tl.scale_at(0, b)).cast())) };
        }
        // 2. every block dot product, exact in int32
        // SAFETY: the block lies inside the tiles (asserted) and the input rows (`row`).
        let dot = unsafe { block_dots::<R, T>(&ops, kind, tl, b, xc.map(|c| c[b])) };
        // 3. scaled into the f32 sums
        for j in 0..R {
            let dx = _mm512_set1_ps(xd[j][b]);
            for k in 0..T {
                let exact = _mm512_cvtepi32_ps(dot[j][k]);
                acc[j][k] = _mm512_fmadd_ps(exact, _mm512_mul_ps(dw[k], dx), acc[j][k]);
            }
        }
    }
    acc
}

/// Block b's dot products (unsigned weights by signed inputs) of input rows `xq` with the
/// sixteen rows of each tile of `ts`, row i of a tile in lane i, chunk by chunk: each chunk of
/// weights loaded once for all the input rows, each input's four bytes broadcast once for all
/// the tiles. Each row's sums start from its `corr` (the offset's correction), which saves an
/// add per sum a block and, in int32, changes no bit.
///
/// # Safety
/// AVX-512F/BW and AVX512-VNNI; `ops` was made for tiles of `tl`, with block b inside them
/// (`Operands::new` checks the tiles' and the rows' lengths).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn block_dots<const R: usize, const T: usize>(
    ops: &super::Operands<R, T>,
    kind: QuantKind,
    tl: Tiling,
    b: usize,
    corr: [i32; R],
) -> [[__m512i; T]; R] {
    // chunk k of tile t at wp[t] + 64·k; input row j's element e at xp[j] + e
    // SAFETY: block b lies inside the tiles (the caller's contract).
    let (wp, xp) = unsafe { ops.block(tl, b) };
    // Few sums (a lone row) run as two chains each, even and odd chunks (Q4_0: low and high
    // nibbles), added at the end: exact in int32, so the same sums; one chain of eight
    // dependent `vpdpbusd`s a block held a lone row back.
    let split = R * T < 4;
    let mut dot = [[[_mm512_setzero_si512(); T]; R]; 2];
    for (d, c) in dot[0].iter_mut().zip(corr) {
        *d = [_mm512_set1_epi32(c); T];
    }
    // (loops, not closures: a closure would not inherit this fn's target features)
    match kind {
        QuantKind::Q8_0 => {
            for k in 0..BLOCK / 4 {
                let mut wv = [_mm512_setzero_si512(); T];
                for t in 0..T {
                    // SAFETY: a block's eight chunks lie inside the tile, on cache lines.
                    wv[t] = unsafe { _mm512_load_si512(wp[t].add(64 * k).cast()) };
                }
                for j in 0..R {
                    // SAFETY: elements 4k..4k + 4 of the block (asserted above).
                    let xv = _mm512_set1_epi32(unsafe {
                        xp[j].add(4 * k).cast::<i32>().read_unaligned()
                    });
                    let c = if split { k % 2 } else { 0 };
                    for t in 0..T {
                        dot[c][j][t] = _mm512_dpbusd_epi32(dot[c][j][t], wv[t], xv);
                    }
                }
            }
        }
        QuantKind::Q4_0 => {
            let nib = _mm512_set1_epi8(15);
            for k in 0..BLOCK / 8 {
                // packed byte 4k + e holds elements 4k + e (low) and 4k + e + 16 (high)
                let (mut lo, mut hi) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
                for t in 0..T {
                    // SAFETY: a block's four chunks lie inside the tile, on cache lines.
                    let z = unsafe { _mm512_load_si512(wp[t].add(64 * k).cast()) };
                    lo[t] = _mm512_and_si512(z, nib);
                    hi[t] = _mm512_and_si512(_mm512_srli_epi16(z, 4), nib);
                }
                for j in 0..R {
                    // SAFETY: elements 4k..4k + 4 and 4k + 16..4k + 20 of the block.
                    let (xl, xh) = unsafe {
                        (
                            _mm512_set1_epi32(xp[j].add(4 * k).cast::<i32>().read_unaligned()),
                            _mm512_set1_epi32(xp[j].add(4 * k + 16).cast::<i32>().read_unaligned()),
                        )
                    };
                    let c = if split { 1 } else { 0 };
                    for t in 0..T {
                        dot[0][j][t] = _mm512_dpbusd_epi32(dot[0][j][t], lo[t], xl);
                        dot[c][j][t] = _mm512_dpbusd_epi32(dot[c][j][t], hi[t], xh);
                    }
                }
            }
        }
    }
    let [mut sums, odd] = dot;
    if split {
        for (s, o) in sums.iter_mut().zip(odd) {
            for (s, o) in s.iter_mut().zip(o) {
                *s = _mm512_add_epi32(*s, o);
            }
        }
    }
    sums
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
    assert!(qs.len() >= nb * BLOCK && d.len() >= nb && corr.len() >= nb);
    for b in 0..nb {
        // SAFETY: block b's 32 values are in x.
        let v = unsafe {
            let p = x.as_ptr().add(b * BLOCK);
            [_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16))]
        };
        let (scale, q) = block_quants(v);
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

/// A block's 32 values (two vectors of 16) by Q8_0's rule (`block::q8_scale`, `f32::round`):
/// its scale and its quants as int32 lanes. The inputs' quantiser and the q8_0 KV cache's
/// (`kernels::Q8Block`) both take it.
#[target_feature(enable = "avx512f")]
pub(crate) fn block_quants(v: [__m512; 2]) -> (f32, [__m512i; 2]) {
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    let (scale, id) = super::block::q8_scale(amax);
    (
        scale,
        v.map(|v| round_away(_mm512_mul_ps(v, _mm512_set1_ps(id)))),
    )
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

//! The ARM64 engine for CPUs with NEON but without `dotprod` (ARMv8.0 and 8.1: Cortex-A53,
//! A72, A73, the Raspberry Pi 3 and 4, Graviton 1): SDOT's tiles, order and f32 operations
//! (`sdot::dots_in`), with each block's integers from widening multiplies, base NEON. The
//! weights are made signed as SDOT makes them; four bytes of the input (one chunk's) are
//! broadcast to every int32 lane (`dup` by lane), so that a chunk's register (rows 4q..4q + 4,
//! four bytes each) times them is sixteen int8 products, taken into int16 by `smlal`
//! (low eight bytes: rows 4q and 4q + 1) and `smlal2` (high eight: 4q + 2 and 4q + 3). Runs
//! of those int16 sums are widened pairwise into int32 (`sadalp`: two lanes a row), and a
//! block's two registers of pairs are added pairwise into one register of its four rows
//! (`addp`): SDOT's lanes.
//!
//! No int16 sum may pass 32,767: a lane adds one product per chunk, and a product is at most
//! 128 · 127 (Q8_0: a weight quant of −128, which GGUF files may hold though `quantize` never
//! makes it, by an input quant, which is within ±127) or 8 · 127 (Q4_0: a nibble less 8), so
//! Q8_0's runs are two chunks and Q4_0's all eight (a block's four chunks, low and high
//! nibbles). Each block's sum is exact in int32, SDOT's integer: the same bits.

// (the loops index several arrays by one counter, in the SDOT engine's shape)
#![allow(clippy::needless_range_loop)]

use super::sdot::{dots_in, lanes, BlockDots, Quad};
use super::{QuantAct, QuantKind, TileSums, Tiling};
use std::arch::aarch64::*;

/// Input rows the GEMM's step takes against `NT` tiles: two, where SDOT takes four. A row
/// keeps a block's eight broadcasts in registers beside a weight register's eight terms, so
/// four rows would spill.
pub(super) const NX: usize = 2;
/// Tiles of weight rows the GEMM's step takes at once.
pub(super) const NT: usize = 1;

// The engine as `super::engine_tile` runs it.
simd_dots!(Neon, Quad<float32x4_t>);

/// The sums of input rows `xr` with the sixteen rows of each tile of `ts` (`sdot::dots_in`
/// on widening multiplies).
///
/// # Safety
/// NEON; the rows exist; each of `ts` is a tile of `tl`.
#[target_feature(enable = "neon")]
unsafe fn dots<const R: usize, const T: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    ts: [&[u8]; T],
    next: crate::NextLines,
) -> [[Quad<float32x4_t>; T]; R] {
    // SAFETY: the same contract.
    unsafe { dots_in::<Neon, R, T>(x, xr, kind, tl, ts, next) }
}

impl BlockDots for Neon {
    /// A weight register at a time (rows 4q..4q + 4 of a tile), its block's eight terms made
    /// once for all the input rows, each input row's eight broadcasts made once a block.
    #[inline(always)]
    unsafe fn block_dots<const R: usize, const T: usize>(
        kind: QuantKind,
        wc: &[*const u8; T],
        xs: &[[int8x16_t; 2]; R],
    ) -> [[Quad<int32x4_t>; T]; R] {
        let xb = xs.map(|x| broadcasts(x));
        let mut dot = [[[vdupq_n_s32(0); 4]; T]; R];
        for t in 0..T {
            for q in 0..4 {
                // SAFETY: the block's chunks lie inside the tile (the trait's contract).
                let w = unsafe { terms(kind, wc[t].add(16 * q)) };
                for j in 0..R {
                    dot[j][t][q] = match kind {
                        QuantKind::Q8_0 => term_sums::<2>(&w, &xb[j]),
                        QuantKind::Q4_0 => term_sums::<8>(&w, &xb[j]),
                    };
                }
            }
        }
        dot
    }
}

/// An input row's block as eight terms' multipliers: term k's four bytes (elements 4k..4k + 4,
/// lane k % 4 of register k / 4) in every int32 lane.
#[target_feature(enable = "neon")]
#[inline]
fn broadcasts(x: [int8x16_t; 2]) -> [int8x16_t; 8] {
    let [a, b] = x.map(|x| vreinterpretq_s32_s8(x));
    [
        vdupq_laneq_s32::<0>(a),
        vdupq_laneq_s32::<1>(a),
        vdupq_laneq_s32::<2>(a),
        vdupq_laneq_s32::<3>(a),
        vdupq_laneq_s32::<0>(b),
        vdupq_laneq_s32::<1>(b),
        vdupq_laneq_s32::<2>(b),
        vdupq_laneq_s32::<3>(b),
    ]
    .map(|v| vreinterpretq_s8_s32(v))
}

/// One weight register of a block (rows 4q..4q + 4, four bytes each, the first chunk's at
/// `w`, each next chunk 64 bytes on) as eight signed terms, term k to be multiplied by the
/// input's broadcast k: Q8_0's chunk k made signed; Q4_0's chunk k's low nibbles (elements
/// 4k..4k + 4) for k < 4, chunk k − 4's high ones (elements 4k..4k + 4 again) from 4 on,
/// each less 8.
///
/// # Safety
/// NEON; the block's chunks (eight of Q8_0, four of Q4_0) lie at `w` + 64·c.
#[target_feature(enable = "neon")]
#[inline]
unsafe fn terms(kind: QuantKind, w: *const u8) -> [int8x16_t; 8] {
    // SAFETY (each load): chunk c of the block (this fn's contract).
    let chunk = |c: usize| unsafe { vld1q_u8(w.add(64 * c)) };
    match kind {
        QuantKind::Q8_0 => {
            std::array::from_fn(|k| vreinterpretq_s8_u8(veorq_u8(chunk(k), vdupq_n_u8(0x80))))
        }
        QuantKind::Q4_0 => std::array::from_fn(|k| {
            let z = chunk(k % 4);
            let nibbles = if k < 4 {
                vandq_u8(z, vdupq_n_u8(15))
            } else {
                vshrq_n_u8::<4>(z)
            };
            vsubq_s8(vreinterpretq_s8_u8(nibbles), vdupq_n_s8(8))
        }),
    }
}

/// Σ_k w[k] · x[k] for each of four rows (int32 lane i: row 4q + i): runs of `RUN` terms
/// summed in int16 (`smlal`, `smlal2`), each run widened into two lanes a row (`sadalp`), the
/// pairs added at the end (`addp`). `RUN` · the largest product must fit int16 (the module's
/// note).
#[target_feature(enable = "neon")]
#[inline]
fn term_sums<const RUN: usize>(w: &[int8x16_t; 8], x: &[int8x16_t; 8]) -> int32x4_t {
    // rows 4q, 4q + 1 (two lanes each), then 4q + 2, 4q + 3
    let mut pairs = [vdupq_n_s32(0); 2];
    for run in (0..8).step_by(RUN) {
        let mut narrow = [vdupq_n_s16(0); 2];
        for k in run..run + RUN {
            narrow[0] = vmlal_s8(narrow[0], vget_low_s8(w[k]), vget_low_s8(x[k]));
            narrow[1] = smlal2(narrow[1], w[k], x[k]);
        }
        pairs[0] = vpadalq_s16(pairs[0], narrow[0]);
        pairs[1] = vpadalq_s16(pairs[1], narrow[1]);
    }
    vpaddq_s32(pairs[0], pairs[1])
}

/// `acc` + the products of the high eight bytes of `w` and `x`, widened to int16 (`smlal2`,
/// through `asm!`: of `vmlal_high_s8` against a broadcast, whose high half LLVM knows to be
/// its low half, LLVM made an `ext` of w's high half and a `smlal`, 32 more instructions a
/// block).
#[target_feature(enable = "neon")]
#[inline]
fn smlal2(mut acc: int16x8_t, w: int8x16_t, x: int8x16_t) -> int16x8_t {
    // SAFETY: one base NEON instruction, between registers.
    unsafe {
        std::arch::asm!(
            "smlal2 {a:v}.8h, {w:v}.16b, {x:v}.16b",
            a = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

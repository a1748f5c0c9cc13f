//! The ARM64 engine, for CPUs with `dotprod` (ARMv8.2 on: Apple M1 on, Neoverse N1/V1/V2,
//! Cortex-A76 on): the x86 engines' tiles and order of sums, with 128-bit registers. A 64-byte
//! chunk of a tile (four quant bytes of each of its sixteen rows) is four registers, rows 0–3,
//! 4–7, 8–11 and 12–15, and `vpdpbusd` becomes `sdot` by lane: each int32 lane adds the product
//! of its row's four bytes with four bytes of the input, picked by lane from the register that
//! holds the input's block, so no broadcast is spent.
//!
//! `sdot` multiplies signed by signed, so the weights are made signed first and need no
//! correction: Q8_0's stored q + 128 with its top bit flipped back, Q4_0's nibbles less 8.
//! Each block's dot product is exact in int32, the same integer as the x86 engines', and is
//! scaled into the f32 sums by the same convert and FMA: the same bits. The SMMLA engine here
//! and the NEON one (neon.rs, for CPUs without `dotprod`) share that scaling (`dots_in`) and
//! differ only in how they take a block's integers (`BlockDots`).

// (the loops index several arrays by one counter, in the x86 engines' shape)
#![allow(clippy::needless_range_loop)]

use super::{QuantAct, QuantKind, TileSums, Tiling, TILE_ROWS};
use std::arch::aarch64::*;

/// Input rows the GEMM's step takes against `NT` tiles: four rows by one tile is sixteen
/// registers of int32 sums, four of weights and eight of input quants (of 32).
pub(super) const NX: usize = 4;
/// Tiles of weight rows the GEMM's step takes at once.
pub(super) const NT: usize = 1;

/// Sixteen lanes as four registers: rows 0–3 of a tile, 4–7, 8–11, 12–15.
pub(super) type Quad<T> = [T; 4];

// The engine as `super::engine_tile` runs it.
simd_dots!(Sdot, Quad<float32x4_t>);

/// Four registers' sixteen lanes.
#[target_feature(enable = "neon")]
pub(super) fn lanes(v: Quad<float32x4_t>) -> TileSums {
    let mut s = [0f32; TILE_ROWS];
    for (q, v) in v.into_iter().enumerate() {
        // SAFETY: four f32 into each quarter of sixteen.
        unsafe { vst1q_f32(s.as_mut_ptr().add(4 * q), v) };
    }
    s
}

/// Four f16 (as bits) widened to f32 exactly (`fcvtl`: the base ARMv8 conversion, which
/// Rust's intrinsics offer only over its unstable f16 vector types).
#[target_feature(enable = "neon")]
#[inline]
fn widen_f16(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: one conversion between registers, which reads no memory.
    unsafe {
        std::arch::asm!(
            "fcvtl {o:v}.4s, {i:v}.4h",
            o = lateout(vreg) out,
            i = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    out
}

/// `acc` + the dot products of each lane's four bytes of `w` with bytes 4L..4L + 4 of `x`
/// (`sdot` by lane, through `asm!`: Rust's `vdotq_laneq_s32` is not stable yet).
#[target_feature(enable = "neon,dotprod")]
#[inline]
fn sdot<const L: u32>(mut acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: one instruction of the `dotprod` extension this fn requires, between registers.
    unsafe {
        std::arch::asm!(
            ".arch_extension dotprod",
            "sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[{l}]",
            a = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            l = const L,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

/// The sums of input rows `xr` with the sixteen rows of each tile of `ts` (`dots_in` on
/// SDOT alone).
///
/// # Safety
/// NEON and dotprod; the rows exist; each of `ts` is a tile of `tl`.
#[target_feature(enable = "neon,dotprod")]
unsafe fn dots<const R: usize, const T: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    ts: [&[u8]; T],
    next: crate::NextLines,
) -> [[Quad<float32x4_t>; T]; R] {
    // SAFETY: the same contract.
    unsafe { dots_in::<Sdot, R, T>(x, xr, kind, tl, ts, next) }
}

/// The sums of input rows `xr` with the sixteen rows of each tile of `ts`, block after block,
/// in the x86 engines' order and with their f32 operations, each block asking for its part
/// of `next`; each block's exact integers by P (`BlockDots`). Inlined into each engine's
/// `dots`, whose CPU features it runs with.
///
/// # Safety
/// P's CPU features; the rows exist; each of `ts` is a tile of `tl`.
#[inline(always)]
pub(super) unsafe fn dots_in<P: BlockDots, const R: usize, const T: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    ts: [&[u8]; T],
    next: crate::NextLines,
) -> [[Quad<float32x4_t>; T]; R] {
    let ops = super::Operands::new(x, xr, tl, ts);
    let (wp, xd) = (ops.tiles, ops.xd);
    let mut acc = [[[vdupq_n_f32(0.0); 4]; T]; R];
    for b in 0..tl.blocks {
        next.fetch(b, tl.blocks);
        // 1. the block's scales: the tiles' sixteen rows' (f16), then each input row's
        let mut dw = [[vdupq_n_f32(0.0); 4]; T];
        for k in 0..T {
            for (q, d) in dw[k].iter_mut().enumerate() {
                // SAFETY: the block's sixteen scales lie inside the tile (`scale_at`).
                let h = unsafe { vld1_u16(wp[k].add(tl.scale_at(4 * q, b)).cast()) };
                *d = widen_f16(h);
            }
        }
        // 2. every block dot product, exact in int32: block b's first chunk in each tile,
        // each input row's 32 quants in two registers
        // SAFETY: the block lies inside the tiles (asserted) and the input rows (`row`), which
        // hold its 32 quants; P's features (the contract).
        let dot = unsafe {
            let (wc, xp) = ops.block(tl, b);
            let xs = xp.map(|p| [vld1q_s8(p), vld1q_s8(p.add(16))]);
            P::block_dots::<R, T>(kind, &wc, &xs)
        };
        // 3. scaled into the f32 sums
        for j in 0..R {
            let dx = vdupq_n_f32(xd[j][b]);
            for k in 0..T {
                for q in 0..4 {
                    let exact = vcvtq_f32_s32(dot[j][k][q]);
                    let scale = vmulq_f32(dw[k][q], dx);
                    acc[j][k][q] = vfmaq_f32(acc[j][k][q], exact, scale);
                }
            }
        }
    }
    acc
}

/// How an ARM64 engine takes a block's exact dot products (`dots_in`'s step 2); any way gives
/// the same integers.
pub(super) trait BlockDots {
    /// The exact dot products of one block of each input row (its 32 quants in `xs`, in order)
    /// with the sixteen rows of each tile (the block's first chunk at `wc`), in `lanes`' order.
    ///
    /// # Safety
    /// The engine's CPU features; the block's chunks lie inside each tile at `wc`.
    unsafe fn block_dots<const R: usize, const T: usize>(
        kind: QuantKind,
        wc: &[*const u8; T],
        xs: &[[int8x16_t; 2]; R],
    ) -> [[Quad<int32x4_t>; T]; R];
}

impl BlockDots for Sdot {
    #[inline(always)]
    unsafe fn block_dots<const R: usize, const T: usize>(
        kind: QuantKind,
        wc: &[*const u8; T],
        xs: &[[int8x16_t; 2]; R],
    ) -> [[Quad<int32x4_t>; T]; R] {
        // SAFETY: the trait's contract.
        unsafe { block_dots::<false, R, T>(kind, wc, xs) }
    }
}

impl BlockDots for Smmla {
    #[inline(always)]
    unsafe fn block_dots<const R: usize, const T: usize>(
        kind: QuantKind,
        wc: &[*const u8; T],
        xs: &[[int8x16_t; 2]; R],
    ) -> [[Quad<int32x4_t>; T]; R] {
        // SAFETY: the trait's contract.
        unsafe { block_dots::<true, R, T>(kind, wc, xs) }
    }
}

/// A block's exact dot products, chunk by chunk: each chunk of weights loaded (and made
/// signed) once for all the input rows, each input's block loaded once for all the tiles; with
/// `MM`, Q8_0's blocks of four input rows by SMMLA instead (the same integers).
///
/// # Safety
/// NEON and dotprod, and i8mm with `MM`; the block's chunks lie inside each tile at `wp`
/// (chunk c of tile t at wp[t] + 64·c).
#[inline(always)]
unsafe fn block_dots<const MM: bool, const R: usize, const T: usize>(
    kind: QuantKind,
    wp: &[*const u8; T],
    xs: &[[int8x16_t; 2]; R],
) -> [[Quad<int32x4_t>; T]; R] {
    let mut dot = [[[vdupq_n_s32(0); 4]; T]; R];
    // (one call per lane: a lane is a constant of the instruction; calls, not closures: a
    // closure would not inherit this fn's target features)
    // SAFETY (each call): the block's chunks lie inside the tiles (the caller's contract).
    unsafe {
        match kind {
            QuantKind::Q8_0 if MM && R == 4 => q8_mm::<R, T>(&mut dot, wp, xs),
            QuantKind::Q8_0 => {
                for h in 0..2 {
                    q8_chunk::<0, R, T>(&mut dot, wp, xs, h);
                    q8_chunk::<1, R, T>(&mut dot, wp, xs, h);
                    q8_chunk::<2, R, T>(&mut dot, wp, xs, h);
                    q8_chunk::<3, R, T>(&mut dot, wp, xs, h);
                }
            }
            QuantKind::Q4_0 => {
                q4_chunk::<0, R, T>(&mut dot, wp, xs);
                q4_chunk::<1, R, T>(&mut dot, wp, xs);
                q4_chunk::<2, R, T>(&mut dot, wp, xs);
                q4_chunk::<3, R, T>(&mut dot, wp, xs);
            }
        }
    }
    dot
}

/// Q8_0's chunk c = 4h + L of a block (elements 4c..4c + 4, lane L of the input's register h)
/// added into `dot`, its weights made signed (the stored q + 128 with the top bit flipped).
///
/// # Safety
/// NEON and dotprod; chunk c of the block lies inside each tile at `wp`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn q8_chunk<const L: u32, const R: usize, const T: usize>(
    dot: &mut [[Quad<int32x4_t>; T]; R],
    wp: &[*const u8; T],
    xs: &[[int8x16_t; 2]; R],
    h: usize,
) {
    let c = 4 * h + L as usize;
    for t in 0..T {
        for q in 0..4 {
            // SAFETY: the chunk lies inside the tile (this fn's contract).
            let z = unsafe { vld1q_u8(wp[t].add(64 * c + 16 * q)) };
            let w = vreinterpretq_s8_u8(veorq_u8(z, vdupq_n_u8(0x80)));
            for j in 0..R {
                dot[j][t][q] = sdot::<L>(dot[j][t][q], w, xs[j][h]);
            }
        }
    }
}

/// Q4_0's chunk L of a block added into `dot`: packed bytes 4L..4L + 4, whose low nibbles are
/// elements 4L..4L + 4 (lane L of the input's first register) and high ones 16 + 4L.. (of its
/// second), each less 8.
///
/// # Safety
/// NEON and dotprod; chunk L of the block lies inside each tile at `wp`.
#[target_feature(enable = "neon,dotprod")]
#[inline]
unsafe fn q4_chunk<const L: u32, const R: usize, const T: usize>(
    dot: &mut [[Quad<int32x4_t>; T]; R],
    wp: &[*const u8; T],
    xs: &[[int8x16_t; 2]; R],
) {
    let c = L as usize;
    let (low, eight) = (vdupq_n_u8(15), vdupq_n_s8(8));
    for t in 0..T {
        for q in 0..4 {
            // SAFETY: the chunk lies inside the tile (this fn's contract).
            let z = unsafe { vld1q_u8(wp[t].add(64 * c + 16 * q)) };
            let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(z, low)), eight);
            let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(z)), eight);
            for j in 0..R {
                dot[j][t][q] = sdot::<L>(dot[j][t][q], lo, xs[j][0]);
                dot[j][t][q] = sdot::<L>(dot[j][t][q], hi, xs[j][1]);
            }
        }
    }
}

/// The engine for CPUs with `i8mm` (and `dotprod`: ARMv8.6 on, Apple M2 on, Neoverse V1/N2/V2,
/// Graviton 3 on): SDOT's tiles, order and f32 operations, with Q8_0's block products of four
/// input rows (prefill's GEMM step) by SMMLA, which multiplies two input rows by two weight
/// rows over eight bytes (32 multiply-adds an instruction, SDOT's 16). Fewer rows (decoding)
/// and Q4_0 stay on SDOT (a lone row would waste half of each SMMLA).
pub(super) struct Smmla;

impl super::SimdDots for Smmla {
    type Sum = Quad<float32x4_t>;
    unsafe fn dots<const R: usize, const T: usize>(
        x: &QuantAct,
        xr: [usize; R],
        kind: QuantKind,
        tl: Tiling,
        ts: [&[u8]; T],
        next: crate::NextLines,
    ) -> [[Self::Sum; T]; R] {
        // SAFETY: the trait's contract is `dots_mm`'s.
        unsafe { dots_mm(x, xr, kind, tl, ts, next) }
    }
    unsafe fn lanes(s: Self::Sum) -> TileSums {
        // SAFETY: the trait's contract: NEON.
        unsafe { lanes(s) }
    }
}

/// `dots_in` with SMMLA.
///
/// # Safety
/// NEON, dotprod and i8mm; the rows exist; each of `ts` is a tile of `tl`.
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn dots_mm<const R: usize, const T: usize>(
    x: &QuantAct,
    xr: [usize; R],
    kind: QuantKind,
    tl: Tiling,
    ts: [&[u8]; T],
    next: crate::NextLines,
) -> [[Quad<float32x4_t>; T]; R] {
    // SAFETY: the same contract.
    unsafe { dots_in::<Smmla, R, T>(x, xr, kind, tl, ts, next) }
}

/// `acc` + the 2 × 2 products of w's two rows of eight bytes with x's two (SMMLA: lane 2i + j
/// is w_i · x_j; through `asm!`, as `sdot`).
#[target_feature(enable = "neon,i8mm")]
#[inline]
fn smmla(mut acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: one instruction of the `i8mm` extension this fn requires, between registers.
    unsafe {
        std::arch::asm!(
            ".arch_extension i8mm",
            "smmla {a:v}.4s, {w:v}.16b, {x:v}.16b",
            a = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags)
        )
    };
    acc
}

/// Input rows (a, b)'s bytes 8h..8h + 8 side by side, SMMLA's two rows of eight.
#[target_feature(enable = "neon")]
#[inline]
fn x_pair(a: &[int8x16_t; 2], b: &[int8x16_t; 2], h: usize) -> int8x16_t {
    let (a, b) = (
        vreinterpretq_s64_s8(a[h / 2]),
        vreinterpretq_s64_s8(b[h / 2]),
    );
    vreinterpretq_s8_s64(if h.is_multiple_of(2) {
        vzip1q_s64(a, b)
    } else {
        vzip2q_s64(a, b)
    })
}

/// A Q8_0 block's exact dot products of four input rows (the GEMM's step) with each tile's
/// sixteen rows by SMMLA, into `dot` (SDOT's lanes: input j's register q holds rows
/// 4q..4q + 4). Eight bytes of a block at a time: chunks 2h and 2h + 1 (bytes 8h..8h + 8 of
/// every row, made signed) zipped by 32 bits are rows (4q, 4q + 1) and (4q + 2, 4q + 3) of
/// eight bytes each; input rows (0, 1) and (2, 3)'s eight bytes paired by 64 bits. After the
/// block, each pair of 2 × 2 sums unzipped by 32 bits gives an input row's four rows. (With
/// fewer rows SDOT does as well: the zips cost what SMMLA saves at two.)
///
/// # Safety
/// NEON and i8mm; the block's chunks lie inside each tile at `wp`.
#[target_feature(enable = "neon,i8mm")]
#[inline]
unsafe fn q8_mm<const R: usize, const T: usize>(
    dot: &mut [[Quad<int32x4_t>; T]; R],
    wp: &[*const u8; T],
    xs: &[[int8x16_t; 2]; R],
) {
    assert_eq!(R, 4);
    let mut x = [[vdupq_n_s8(0); 4]; 2];
    for (p, x) in x.iter_mut().enumerate() {
        for (h, x) in x.iter_mut().enumerate() {
            *x = x_pair(&xs[2 * p], &xs[2 * p + 1], h);
        }
    }
    let flip = vdupq_n_u8(0x80);
    for t in 0..T {
        // sums[p][k]: rows 2k, 2k + 1 of the tile by input rows 2p, 2p + 1
        let mut sums = [[vdupq_n_s32(0); 8]; 2];
        for h in 0..4 {
            for q in 0..4 {
                // SAFETY: chunks 2h, 2h + 1 lie inside the tile (this fn's contract).
                let (c0, c1) = unsafe {
                    let at = wp[t].add(128 * h + 16 * q);
                    (vld1q_u8(at), vld1q_u8(at.add(64)))
                };
                let (c0, c1) = (veorq_u8(c0, flip), veorq_u8(c1, flip));
                let (c0, c1) = (vreinterpretq_s32_u8(c0), vreinterpretq_s32_u8(c1));
                let lo = vreinterpretq_s8_s32(vzip1q_s32(c0, c1));
                let hi = vreinterpretq_s8_s32(vzip2q_s32(c0, c1));
                for (sums, x) in sums.iter_mut().zip(&x) {
                    sums[2 * q] = smmla(sums[2 * q], lo, x[h]);
                    sums[2 * q + 1] = smmla(sums[2 * q + 1], hi, x[h]);
                }
            }
        }
        for (p, sums) in sums.iter().enumerate() {
            for q in 0..4 {
                let (a, b) = (sums[2 * q], sums[2 * q + 1]);
                dot[2 * p][t][q] = vuzp1q_s32(a, b);
                dot[2 * p + 1][t][q] = vuzp2q_s32(a, b);
            }
        }
    }
}

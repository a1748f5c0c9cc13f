//! bf16 matrix multiply, the opt-in `--bf16` path: both operands are rounded to bf16 (round to
//! nearest even) while they are packed, the CPU multiplies them and accumulates in f32, so
//! weights, gradients and results all stay f32.
//!
//! Operands are packed into tiles of 16 rows of 64 bytes: 16 × 32 bf16 of A, or 16 pairs of
//! depth × 16 columns of B (the "VNNI" layout: the two depths of a pair side by side). Both
//! are packed into tiles ordered by depth (B whole, A two tile rows per task), and each task
//! computes a 32 × 32 block of C
//! over the whole depth. Two kernels read the same tiles: on Intel AMX, the tile unit
//! (TDPBF16PS, four C tiles in tile registers: `block`); elsewhere AVX512_BF16 (AMD Zen 4 and
//! others: VDPBF16PS, a B tile row per register against broadcast A pairs: `block_dot`).

use super::cpu::{amx, avx512_bf16 as available};
use super::{Dims, Mat, Out, SharedOut};
use crate::{lane_mask, transpose16, with_thread_buffer, SharedMut};
use rayon::prelude::*;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;

/// Rows of a tile, and f32 columns of a C tile.
const TR: usize = 16;
/// bf16 depth of one A or B tile (64 bytes a row).
const TK: usize = 32;
/// bf16 values in one packed tile (1 KiB).
const TILE: usize = TR * TK;
/// C block of one task: 2 × 2 tiles.
const BLOCK: usize = 2 * TR;
/// Depth tiles per pass over a row of blocks: the two A tile rows (32 KiB) stay in L1 while
/// every block of the row streams its B tiles from L2.
const KC_TILES: usize = 16;
/// Tile rows per packing task: 128 rows of x, or where x runs along r, 512-byte row pieces.
const PACK_ROWS: usize = 8;

thread_local! {
    /// Two packed tile rows of A, of the task running on this thread; packed B of the call
    /// made from this thread.
    static PACK_A: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
    /// A packed whole by the thread that calls a product whose rows are split over tasks
    /// (`products`), for all of them.
    static PACK_A_SHARED: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
    static PACK_B: Cell<Vec<u16>> = const { Cell::new(Vec::new()) };
    /// Whether this thread is inside `with_tiles`, which configured the tiles already.
    static TILES_ON: Cell<bool> = const { Cell::new(false) };
}

/// Runs f with the tile unit configured once for every product f makes on this thread (the
/// attention kernel's many small ones), instead of once per product.
pub fn with_tiles<R>(f: impl FnOnce() -> R) -> R {
    assert!(available(), "with_tiles: no AMX");
    let _tiles = TileSession::begin();
    f()
}

/// The tile unit configured on this thread while this lives: `ldtilecfg` and `tilerelease`
/// cost about as much as a small product, so a thread configures once per run of products. A
/// session begun inside another shares it.
struct TileSession {
    owner: bool,
}

impl TileSession {
    fn begin() -> TileSession {
        // Without AMX there is nothing to configure: the products run on `block_dot`.
        if TILES_ON.get() || !amx() {
            return TileSession { owner: false };
        }
        // SAFETY: `amx()` requested this process's tile data.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG as *const TileConfig) };
        TILES_ON.set(true);
        TileSession { owner: true }
    }
}

impl Drop for TileSession {
    // Released even on a panic, so that the next product configures afresh.
    fn drop(&mut self) {
        if self.owner {
            TILES_ON.set(false);
            // SAFETY: this session configured the tiles.
            unsafe { asm!("tilerelease") };
        }
    }
}

/// The 64-byte tile configuration (palette 1): all eight tiles 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Packs the logical matrix x (r, p) for r < rows, p < depth into tiles of 16 rows × 32
/// depths, tile (rt, kt) at `(rt * kts + kt) * TILE`, zero-padded; this call the tile rows
/// from `rt0` that `dst` holds. Each tile is a 16 × 16 array of u32 pairs (x(r, 2q),
/// x(r, 2q + 1)) rounded to bf16: indexed [r][q] for A (`vnni` false), and [q][r] for B,
/// where x is Bᵀ and r runs over B's columns. The loop order follows x's layout, so that its
/// rows are read start to end.
///
/// # Safety
/// Needs AVX-512F/BW/BF16; x must hold every element below (rows, depth).
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_tile_rows(
    dst: &mut [u16],
    x: Mat,
    rt0: usize,
    rows: usize,
    depth: usize,
    vnni: bool,
) {
    let kts = depth.div_ceil(TK);
    if kts == 0 {
        return;
    }
    let tile = |dst: &mut [u16], i: usize, kt: usize| {
        let r0 = (rt0 + i) * TR;
        let tile = &mut dst[(i * kts + kt) * TILE..][..TILE];
        if r0 < rows {
            // SAFETY: the caller guarantees AVX-512F/BW/BF16 and that x holds (rows, depth)
            // (this fn's `# Safety`); the tile covers rows r0.. < rows, depths < depth.
            unsafe {
                pack_tile(
                    tile,
                    x,
                    r0,
                    TR.min(rows - r0),
                    kt * TK,
                    TK.min(depth - kt * TK),
                    vnni,
                )
            };
        } else {
            tile.fill(0);
        }
    };
    let tile_rows = dst.len() / (kts * TILE);
    if x.cs == 1 {
        // x's rows run along the depth: each tile row reads its 16 rows start to end.
        for i in 0..tile_rows {
            for kt in 0..kts {
                tile(dst, i, kt);
            }
        }
    } else {
        // x runs along r: a depth tile reads 32 of its lines start to end.
        for kt in 0..kts {
            for i in 0..tile_rows {
                tile(dst, i, kt);
            }
        }
    }
}

/// One tile of `pack_tile_rows`: rows r0..r0 + h and depths p0..p0 + d of x, zero-padded.
///
/// # Safety
/// As for `pack_tile_rows`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_tile(
    tile: &mut [u16],
    x: Mat,
    r0: usize,
    h: usize,
    p0: usize,
    d: usize,
    vnni: bool,
) {
    // SAFETY: the caller guarantees AVX-512F/BW/BF16 (this fn's `# Safety`); every
    // load reads rows r0..r0 + h, depths p0..p0 + d of x, inside x by the same contract (masked
    // to h and d lanes), and the TR stores of 2·TR u16 each fill `tile` (TILE values, sliced
    // by `pack_tile_rows`).
    unsafe {
        if x.cs != 1 && x.rs != 1 {
            for r in 0..TR {
                for k in 0..TK {
                    let v = if r < h && k < d {
                        bf16_bits(x.data[(r0 + r) * x.rs + (p0 + k) * x.cs])
                    } else {
                        0
                    };
                    let (q, half) = (k / 2, k % 2);
                    let u = if vnni { q * TR + r } else { r * TR + q };
                    tile[2 * u + half] = v;
                }
            }
            return;
        }
        // u32 j of the result = (lo[j], hi[j]) from [lo ×16, hi ×16] bf16.
        let interleave: __m512i = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        // Line i of 16 u32 pairs: contiguous along the depth, row r = i with its 32 depths in
        // order; contiguous along r, depth pair q = i for the 16 r's.
        let line = |i: usize| -> __m512i {
            if x.cs == 1 {
                if i >= h {
                    return _mm512_setzero_si512();
                }
                let src = x.data.as_ptr().add((r0 + i) * x.rs + p0);
                let lo = _mm512_maskz_loadu_ps(lane_mask(d), src);
                let hi =
                    _mm512_maskz_loadu_ps(lane_mask(d.saturating_sub(16)), src.wrapping_add(16));
                std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
            } else {
                if 2 * i >= d {
                    return _mm512_setzero_si512();
                }
                let m = lane_mask(h);
                let src = x.data.as_ptr().add(r0 + (p0 + 2 * i) * x.cs);
                let lo = _mm512_maskz_loadu_ps(m, src);
                let hi = if 2 * i + 1 < d {
                    _mm512_maskz_loadu_ps(m, src.add(x.cs))
                } else {
                    _mm512_setzero_ps()
                };
                let both: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_permutexvar_epi16(interleave, both)
            }
        };
        let base = tile.as_mut_ptr();
        let out = |i: usize| base.add(2 * TR * i) as *mut __m512i;
        // A's tile rows are r, B's are q: lines that already are tile rows go straight out.
        if (x.cs == 1) != vnni {
            for i in 0..TR {
                _mm512_storeu_si512(out(i) as *mut _, line(i));
            }
        } else {
            let mut lines = [_mm512_setzero_si512(); TR];
            for (i, l) in lines.iter_mut().enumerate() {
                *l = line(i);
            }
            transpose16(&mut lines);
            for (i, l) in lines.iter().enumerate() {
                _mm512_storeu_si512(out(i) as *mut _, *l);
            }
        }
    }
}

/// f32 → bf16 bits, round to nearest even (what VCVTNE2PS2BF16 does).
fn bf16_bits(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// Sizes this thread's packing buffers for operands up to `long` × `short` either way round
/// (see `kernels::prepare_threads`).
pub(crate) fn reserve(long: usize, short: usize) {
    let b = packed_len(long, short).max(packed_len(short, long));
    // A is packed two tile rows (one task's) at a time, over a depth of at most `long`, or
    // whole where its rows are split (fewer than `split_below` blocks of them).
    let a = 2 * long.div_ceil(TK) * TILE;
    let shared = a * long
        .div_ceil(BLOCK)
        .min(split_below(rayon::current_num_threads()));
    for (slot, n) in [(&PACK_A, a), (&PACK_A_SHARED, shared), (&PACK_B, b)] {
        with_thread_buffer(slot, |v| {
            crate::ensure(v, n);
        });
    }
}

/// Packs Bᵀ = x (rows, depth) whole into `dst` (`packed_len(rows, depth)` values), as
/// ceil(rows / 32) · 2 tile rows (see `pack_tile_rows`): every task of a product reads all of
/// it.
fn pack_b(dst: &mut [u16], x: Mat, rows: usize, depth: usize, threads: usize) {
    let (rts, kts) = (rows.div_ceil(BLOCK) * 2, depth.div_ceil(TK));
    assert_eq!(dst.len(), packed_len(rows, depth), "pack_b: wrong length");
    // SAFETY: `available()` was checked by the caller; the caller bounds-checked x.
    let run = |(i, dst): (usize, &mut [u16])| unsafe {
        pack_tile_rows(dst, x, i * PACK_ROWS, rows, depth, true)
    };
    if threads > 1 && rts > PACK_ROWS {
        dst.par_chunks_mut(PACK_ROWS * kts * TILE)
            .enumerate()
            .for_each(run);
    } else {
        run((0, dst));
    }
}

/// C (+)= the 32 × 32 block from the `kts` consecutive tiles at a[0], a[1] (two tile rows of
/// A) and b[0], b[1] (two tile columns of B), clipped to (h, w) valid rows and columns: on
/// the tile unit (which takes no prefetch hint: `_ahead` is `block_dot`'s). When accumulating,
/// every C tile starts from C's values, the edge tiles' through a buffer too, so that an
/// output's sum is the same whether its tile is whole or clipped: a row's bits do not depend
/// on how many rows run beside it (the server's batch invariance; edge tiles that added C
/// after their products differed from whole ones in the last bit on AMX).
///
/// # Safety
/// AMX tiles configured with `CONFIG` on this thread; c valid for h rows of w columns at ldc.
#[target_feature(enable = "avx512f")]
// the tile unit's raw operands and clip, as the inner loop reads them
#[allow(clippy::too_many_arguments)]
unsafe fn block(
    a: [*const u16; 2],
    b: [*const u16; 2],
    kts: usize,
    c: *mut f32,
    ldc: usize,
    h: usize,
    w: usize,
    accumulate: bool,
    _ahead: usize,
) {
    // SAFETY: the caller configured the tiles with `CONFIG` on this thread and holds
    // c valid for h rows of w columns at ldc (this fn's `# Safety`): full tiles are loaded and
    // stored only where `full` says the 16 × 16 tile lies inside (h, w), edge tiles go through
    // `edge` and read and write only rows < h, columns < w; a[i], b[i] hold `kts` tiles each
    // (the packed rows `products` slices).
    unsafe {
        let stride = ldc * 4;
        let full = |ti: usize, tj: usize| h >= (ti + 1) * TR && w >= (tj + 1) * TR;
        let at = |ti: usize, tj: usize| c.wrapping_add(ti * TR * ldc + tj * TR);
        let clip = |ti: usize, tj: usize| (TR.min(h - ti * TR), TR.min(w - tj * TR));
        macro_rules! init {
        ($t:literal, $ti:literal, $tj:literal) => {
            if accumulate && full($ti, $tj) {
                asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}]"), p = in(reg) at($ti, $tj), s = in(reg) stride);
            } else if accumulate && h > $ti * TR && w > $tj * TR {
                // C's part of an edge tile, zeros past the edge
                let mut edge = [0f32; TR * TR];
                edge_rows(at($ti, $tj), ldc, clip($ti, $tj), &mut edge, false);
                asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}]"), p = in(reg) edge.as_ptr(), s = in(reg) 64usize);
            } else {
                asm!(concat!("tilezero tmm", $t));
            }
        };
    }
        init!("0", 0, 0);
        init!("1", 0, 1);
        init!("2", 1, 0);
        init!("3", 1, 1);
        let ([a0, a1], [b0, b1]) = (a, b);
        for kt in 0..kts {
            let o = kt * TILE;
            // Each load goes just before the first product that needs it, so that loads overlap
            // the products already issued (7-10% faster than four loads up front, in L1).
            asm!(
                "tileloadd tmm4, [{a0} + {s}]",
                "tileloadd tmm6, [{b0} + {s}]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {s}]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {s}]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) a0.add(o),
                a1 = in(reg) a1.add(o),
                b0 = in(reg) b0.add(o),
                b1 = in(reg) b1.add(o),
                s = in(reg) 64usize,
            );
        }
        macro_rules! store {
        ($t:literal, $ti:literal, $tj:literal) => {
            if full($ti, $tj) {
                asm!(concat!("tilestored [{p} + {s}], tmm", $t), p = in(reg) at($ti, $tj), s = in(reg) stride);
            } else if h > $ti * TR && w > $tj * TR {
                // Only edge tiles go through this buffer (zeroing it for every block costs).
                let mut edge = [0f32; TR * TR];
                asm!(concat!("tilestored [{p} + {s}], tmm", $t), p = in(reg) edge.as_mut_ptr(), s = in(reg) 64usize);
                // (C is in the sum already when accumulating: `init!`)
                edge_rows(at($ti, $tj), ldc, clip($ti, $tj), &mut edge, true);
            }
        };
    }
        store!("0", 0, 0);
        store!("1", 0, 1);
        store!("2", 1, 0);
        store!("3", 1, 1);
    }
}

/// An edge tile's way through the tile unit: copies the (hh, ww) corner of the C tile at
/// `tile` (rows ldc apart) into the 16 × 16 buffer `edge`, or back from it into C when `back`.
/// One walk over the clipped rows serves both directions, so they cannot disagree on which
/// elements belong to C.
///
/// # Safety
/// `tile` valid for hh rows of ww columns at ldc; hh, ww at most 16.
unsafe fn edge_rows(
    tile: *mut f32,
    ldc: usize,
    (hh, ww): (usize, usize),
    edge: &mut [f32; TR * TR],
    back: bool,
) {
    for r in 0..hh {
        // SAFETY: row r of the clipped tile lies inside C (this fn's `# Safety`).
        let row = unsafe { std::slice::from_raw_parts_mut(tile.add(r * ldc), ww) };
        let buffered = &mut edge[r * TR..r * TR + ww];
        if back {
            row.copy_from_slice(buffered);
        } else {
            buffered.copy_from_slice(row);
        }
    }
}

/// Rows of C that `block_dot` keeps in registers at a time: 8 rows × 2 × 16 columns = 16
/// accumulators, enough to hide VDPBF16PS's latency, with B's two registers reused 8 times.
const DOT_ROWS: usize = 8;

/// `block` on AVX512_BF16 alone, from the same packed tiles: a B tile row (a depth pair of 16
/// columns) is one register, and each A pair (row r, depths 2q and 2q + 1) is broadcast
/// against it, VDPBF16PS adding both products into f32 lanes. With `ahead` > 0 the rows ask
/// for B's values `ahead` elements on (the next block's tiles) into L2 as they read this
/// block's, the first group of rows for one half of the columns and the second for the
/// other, so that the memory streams while both run: a hint, which reads nothing.
///
/// # Safety
/// Needs AVX-512F/BF16; the pointers hold `kts` tiles each; c valid for h rows of w columns
/// at ldc.
#[target_feature(enable = "avx512f,avx512bf16")]
// `block`'s signature: the two kernels are picked by one fn pointer
#[allow(clippy::too_many_arguments)]
unsafe fn block_dot(
    a: [*const u16; 2],
    b: [*const u16; 2],
    kts: usize,
    c: *mut f32,
    ldc: usize,
    h: usize,
    w: usize,
    accumulate: bool,
    ahead: usize,
) {
    // SAFETY: the caller guarantees AVX-512F/BF16, `kts` tiles behind each of a[0],
    // a[1], b[0], b[1], and c valid for h rows of w columns at ldc (this fn's `# Safety`): the
    // loads stay inside the tiles (kt < kts, q < TR, r < DOT_ROWS), and the stores write rows
    // < h (clamped to BLOCK) masked to the first w columns.
    unsafe {
        let h = h.min(BLOCK);
        for g in 0..h.div_ceil(DOT_ROWS) {
            // rows g·8 .. g·8 + 8 of the block: half of A tile row g / 2; a last group of
            // fewer rows in as many registers as it needs (a lone row: decoding under batch
            // invariance), each row's sums the same either way
            let a = a[g / 2].add((g % 2) * DOT_ROWS * TK) as *const i32;
            let c = c.add(g * DOT_ROWS * ldc);
            // the next block's B into L2 as this one's is read: the first group fetches the
            // half that pairs with b[0] and the second the other (a lone group both)
            let ahead = match (g, h > DOT_ROWS) {
                (0, false) => [ahead; 2],
                (0, true) => [ahead, 0],
                (1, _) => [0, ahead],
                _ => [0; 2],
            };
            match h - g * DOT_ROWS {
                1 => dot_rows::<1>(a, b, kts, c, ldc, 1, w, accumulate, ahead),
                2 => dot_rows::<2>(a, b, kts, c, ldc, 2, w, accumulate, ahead),
                r @ 3..=4 => dot_rows::<4>(a, b, kts, c, ldc, r, w, accumulate, ahead),
                r => dot_rows::<DOT_ROWS>(a, b, kts, c, ldc, r.min(DOT_ROWS), w, accumulate, ahead),
            }
        }
    }
}

/// `block_dot` for R ≤ 8 rows of A from `a` (rows at TK apart within each tile), of which
/// the first `h` are stored: 2R accumulators, B's two registers reused R times; `ahead[i]`
/// (> 0) fetches b[i]'s values that far on.
///
/// # Safety
/// As for `block_dot`, with `a` inside A's packed tiles and c valid for h rows.
#[target_feature(enable = "avx512f,avx512bf16")]
// `block_dot`'s operands, for one group of its rows
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn dot_rows<const R: usize>(
    a: *const i32,
    b: [*const u16; 2],
    kts: usize,
    c: *mut f32,
    ldc: usize,
    h: usize,
    w: usize,
    accumulate: bool,
    ahead: [usize; 2],
) {
    // SAFETY: as for `block_dot` (r < R ≤ DOT_ROWS stays inside the group's tile rows).
    unsafe {
        let (m0, m1) = (lane_mask(w), lane_mask(w.saturating_sub(TR)));
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for kt in 0..kts {
            let (at, o) = (a.add(kt * TILE / 2), kt * TILE);
            for q in 0..TR {
                let b0: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b[0].add(o + 2 * TR * q) as *const _));
                let b1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(b[1].add(o + 2 * TR * q) as *const _));
                for (b, ahead) in b.into_iter().zip(ahead) {
                    if ahead > 0 {
                        let p = b.wrapping_add(o + 2 * TR * q + ahead);
                        _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
                    }
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let pair: __m512bh =
                        std::mem::transmute(_mm512_set1_epi32(*at.add(r * TR + q)));
                    acc[0] = _mm512_dpbf16_ps(acc[0], pair, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], pair, b1);
                }
            }
        }
        for (r, &[mut x0, mut x1]) in acc.iter().enumerate().take(h) {
            let row = c.add(r * ldc);
            if accumulate {
                x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, row));
                x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, row.add(TR)));
            }
            _mm512_mask_storeu_ps(row, m0, x0);
            _mm512_mask_storeu_ps(row.add(TR), m1, x1);
        }
    }
}

/// C (+)= a · b with bf16 operands, on a CPU where `available()`; C's reach is checked where
/// the tiles are stored (`SharedMut`).
pub fn gemm(d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    assert!(available(), "bf16 gemm: the CPU has no AVX512_BF16");
    let out = SharedOut {
        dst: SharedMut::new(out.dst),
        rs: out.rs,
        accumulate: out.accumulate,
    };
    // SAFETY: dst is exclusively borrowed by `out` for this call.
    unsafe { gemm_shared(d, a, b, out, threads) }
}

/// `gemm` into a destination whose rows interleave with data other threads own (one head of a
/// (T, NH, d) tensor, in the attention kernel).
///
/// # Safety
/// No other thread may access rows 0..m (`out.rs` apart) of n columns of the output meanwhile.
pub(crate) unsafe fn gemm_shared(d: Dims, a: Mat, b: Mat, out: SharedOut, threads: usize) {
    with_thread_buffer(&PACK_B, |pb| {
        let dst = crate::ensure(pb, packed_len(d.n, d.k));
        pack_b(dst, b.transposed(), d.n, d.k, threads);
        let b = PackedB {
            tiles: pb,
            row: b_row(d.k),
        };
        // SAFETY: B was just packed whole; the caller keeps the output's rows to this call
        // (this fn's `# Safety`, which `products` repeats).
        unsafe { products(d, a, b, out, threads) };
    });
}

/// Packs the weight w (oc, c) of a linear layer, row-major as in torch `Linear`, as the B
/// operand of x · wᵀ, once, for `gemm_packed` (inference, where the weights do not change).
pub fn pack_weight(w: &[f32], oc: usize, c: usize) -> Vec<u16> {
    let mut buf = vec![0; packed_len(oc, c)];
    pack_weight_into(&mut buf, w, oc, c);
    buf
}

/// `pack_weight` into `dst` (`packed_len(oc, c)` values): a place in a buffer that holds
/// every matrix's tiles (`Bf16Weights`).
pub fn pack_weight_into(dst: &mut [u16], w: &[f32], oc: usize, c: usize) {
    assert!(w.len() >= oc * c, "pack_weight: {} < {oc}×{c}", w.len());
    pack_b(dst, Mat::rows(w, c), oc, c, 1);
}

/// Length of `pack_weight(w, oc, c)`.
pub fn packed_len(oc: usize, c: usize) -> usize {
    oc.div_ceil(BLOCK) * 2 * c.div_ceil(TK) * TILE
}

/// Outputs o0..o0 + 16 of x (n ≤ 4 rows of c) · wᵀ, a register per row, for decoding: read
/// from the tile row o0 / 16 of w's tiles (`pack_weight`), so that one bf16 copy serves prefill
/// and decode. A tile row holds two depths of 16 outputs, widened exactly to f32 and
/// multiplied by the f32 inputs.
///
/// # Safety
/// Needs AVX-512F; `tiles` holds w packed by `pack_weight`, with o0 < its outputs.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn tile_row_sums(
    x: &[f32],
    tiles: &[u16],
    o0: usize,
    n: usize,
    c: usize,
) -> [__m512; 4] {
    let (kts, rt) = (c.div_ceil(TK), o0 / TR);
    let row = &tiles[rt * kts * TILE..(rt + 1) * kts * TILE];
    assert!(n <= 4 && x.len() >= n * c, "tile_row_sums: {n} rows of {c}");
    // SAFETY: AVX-512F is the caller's contract; `row` is kts tiles and x holds n rows of c.
    unsafe {
        match n {
            1 => row_sums::<1>(x, row, c),
            2 => row_sums::<2>(x, row, c),
            3 => row_sums::<3>(x, row, c),
            _ => row_sums::<4>(x, row, c),
        }
    }
}

/// `tile_row_sums` for R rows. The tiles of a tile row follow each other by depth, so depth
/// pair p's 16 outputs lie at TR·p in `row`. Each row sums in four chains, the even and the odd
/// depth of alternate pairs: with one chain a lone row waited on an FMA's latency for each 32
/// bytes of weights, which on a 2 GHz core is about the memory's rate. The tile rows, read once
/// a token, are asked for ahead as they go (`prefetch_stream`).
///
/// # Safety
/// AVX-512F; `row` holds c.div_ceil(TK) tiles, x at least R rows of c.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn row_sums<const R: usize>(x: &[f32], row: &[u16], c: usize) -> [__m512; 4] {
    macro_rules! pair {
        ($p:expr) => {
            widen_pair(row.as_ptr().add(TR * $p))
        };
    }
    macro_rules! at {
        ($r:expr, $p:expr) => {
            _mm512_set1_ps(*x.as_ptr().add($r * c + $p))
        };
    }
    // each row's four chains
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    // SAFETY: AVX-512F is the caller's; p < c is even, so the 32 values at TR·p end at
    // TR·(p + 2), and the even p + 2 ≤ c + 1 is at most TK·kts (even, ≥ c): inside the kts·TILE
    // of `row`. r < R and p + i < c keep x's reads inside R rows of c.
    unsafe {
        // 1. Two pairs at a time, into four chains.
        let mut p = 0;
        while p + 4 <= c {
            crate::prefetch_stream(row.as_ptr().wrapping_add(TR * p));
            crate::prefetch_stream(row.as_ptr().wrapping_add(TR * (p + 2)));
            let ((e0, o0), (e1, o1)) = (pair!(p), pair!(p + 2));
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_fmadd_ps(e0, at!(r, p), a[0]);
                a[1] = _mm512_fmadd_ps(o0, at!(r, p + 1), a[1]);
                a[2] = _mm512_fmadd_ps(e1, at!(r, p + 2), a[2]);
                a[3] = _mm512_fmadd_ps(o1, at!(r, p + 3), a[3]);
            }
            p += 4;
        }
        // 2. The last one to three depths.
        while p < c {
            let (e, o) = pair!(p);
            for (r, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_fmadd_ps(e, at!(r, p), a[0]);
                if p + 1 < c {
                    a[1] = _mm512_fmadd_ps(o, at!(r, p + 1), a[1]);
                }
            }
            p += 2;
        }
    }
    // 3. The chains' sum, row by row.
    let mut sums = [_mm512_setzero_ps(); 4];
    for (s, a) in sums.iter_mut().zip(&acc) {
        *s = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
    }
    sums
}

/// The 32 bf16 at `p` (16 pairs of depths) widened to f32: the even depths, the odd.
///
/// # Safety
/// AVX-512F; 64 bytes readable at p.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen_pair(p: *const u16) -> (__m512, __m512) {
    // SAFETY: the caller's contract.
    let v = unsafe { _mm512_loadu_si512(p as *const _) };
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let even = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
    (even, _mm512_castsi512_ps(_mm512_and_si512(v, high)))
}

/// `gemm` with B already packed (`PackedB`), on a CPU where `available()`.
pub fn gemm_packed(d: Dims, a: Mat, b: &PackedB, out: Out, threads: usize) {
    assert!(available(), "bf16 gemm: the CPU has no AVX512_BF16");
    let out = SharedOut {
        dst: SharedMut::new(out.dst),
        rs: out.rs,
        accumulate: out.accumulate,
    };
    // SAFETY: dst is exclusively borrowed by `out` for this call.
    unsafe { products(d, a, *b, out, threads) }
}

/// Distance between consecutive tile rows of a packed B of depth k (`pack_b`).
fn b_row(k: usize) -> usize {
    k.div_ceil(TK) * TILE
}

/// B (k × n) packed in bf16 tiles (`pack_b` of Bᵀ), for products over ranges of its columns
/// and depth: a linear layer's weight packed once for inference (`weight`), or an attention
/// task's keys and values, against each query block and head in turn (`pack`, through
/// `small::with_packed`).
#[derive(Clone, Copy)]
pub struct PackedB<'a> {
    tiles: &'a [u16],
    /// distance between consecutive tile rows: the tiles of one depth
    row: usize,
}

impl<'a> PackedB<'a> {
    /// No operand: a placeholder, never multiplied.
    pub(crate) const EMPTY: PackedB<'static> = PackedB { tiles: &[], row: 0 };

    /// Packs b (k × n) into buf, one thread. The caller bounds-checked b and `available()`.
    pub(crate) fn pack(buf: &'a mut Vec<u16>, b: Mat, k: usize, n: usize) -> PackedB<'a> {
        let tiles = crate::ensure(buf, packed_len(n, k));
        pack_b(tiles, b.transposed(), n, k, 1);
        PackedB {
            tiles,
            row: b_row(k),
        }
    }

    /// The weight (oc, c) that `pack_weight` packed, as the B (c × oc) of x · wᵀ.
    pub fn weight(tiles: &'a [u16], oc: usize, c: usize) -> PackedB<'a> {
        assert_eq!(
            tiles.len(),
            packed_len(oc, c),
            "PackedB: not a ({oc}, {c}) weight"
        );
        PackedB {
            tiles,
            row: b_row(c),
        }
    }

    /// C (m × n) (+)= a (m × k) · B[p0..p0 + k, j0..j0 + n] on this thread (inside
    /// `with_tiles`); j0 a multiple of 32 and p0 of 32. Where k is not a multiple of 32, the
    /// packed rows past p0 + k meet A's zero padding.
    ///
    /// # Safety
    /// As for `gemm_shared`.
    pub(crate) unsafe fn gemm(&self, d: Dims, (j0, p0): (usize, usize), a: Mat, out: SharedOut) {
        if d.m == 0 || d.n == 0 {
            return;
        }
        assert!(a.fits(d.m, d.k), "PackedB::gemm: A too small");
        assert!(
            j0 % BLOCK == 0 && p0 % TK == 0,
            "PackedB: ({j0}, {p0}) off the tiles"
        );
        let at = 2 * (j0 / BLOCK) * self.row + (p0 / TK) * TILE;
        let b = PackedB {
            tiles: &self.tiles[at..],
            row: self.row,
        };
        // SAFETY: the tiles from `at` are this packed B's, at its row distance (`products`
        // checks their length); the output is the caller's alone (this fn's `# Safety`).
        unsafe { products(d, a, b, out, 1) }
    }
}

/// Block rows of C below which `products` splits each over runs of its column blocks: with
/// fewer, a task per block row would leave threads idle (a decoding step's one block row) or
/// unevenly loaded (a prefill of 37 rows: a block of 32 and one of 5), unless the threads
/// share them evenly, whole.
fn split_below(threads: usize) -> usize {
    4 * threads
}

/// C (+)= A · B, 32 × 32 blocks of C at a time. With many block rows (or one thread, or
/// whole rows the threads share evenly), a task per two tile rows of A, which it packs itself
/// and keeps in L1 for its products; with fewer than `split_below(threads)`, a task per block
/// row and run of C's column blocks, about `split_below(threads)` tasks in all, reading A
/// packed beforehand (with the weights packed: a prefill chunk of 37 rows 1.24–1.36×, of 100
/// rows 1.18–1.24×; 16 and 64 rows level). A block's sums do not depend on the split.
///
/// # Safety
/// As for `gemm_shared`.
unsafe fn products(d: Dims, a: Mat, b: PackedB, out: SharedOut, threads: usize) {
    let (
        Dims { m, n, k },
        PackedB {
            tiles: pb,
            row: b_row,
        },
    ) = (d, b);
    let kts = k.div_ceil(TK);
    assert!(
        kts * TILE <= b_row && pb.len() >= (2 * n.div_ceil(BLOCK) - 1) * b_row + kts * TILE,
        "bf16 products: packed B too small"
    );
    let row = kts * TILE;
    // 1. the split: block rows alone, or each over runs of column blocks (A packed here)
    let (blocks, col_blocks) = (m.div_ceil(BLOCK), n.div_ceil(BLOCK));
    // (whole block rows that the threads share evenly are not split)
    let even = blocks.is_multiple_of(threads) && m.is_multiple_of(BLOCK);
    let splits = match threads > 1 && blocks < split_below(threads) && !even {
        true => split_below(threads).div_ceil(blocks).min(col_blocks),
        false => 1,
    };
    let per_split = col_blocks.div_ceil(splits);
    with_thread_buffer(&PACK_A_SHARED, |shared| {
        let whole = (splits > 1).then(|| {
            let whole = crate::ensure(shared, 2 * blocks * row);
            // SAFETY: AVX512_BF16 is available and a holds (m, k) (the caller's checks);
            // each call packs the one tile row its chunk holds.
            let pack =
                |(i, t): (usize, &mut [u16])| unsafe { pack_tile_rows(t, a, i, m, k, false) };
            whole.par_chunks_mut(row).enumerate().for_each(pack);
            &*whole
        });
        // 2. the tasks, (block row, run of column blocks), the block rows interleaved so
        // that each thread's share mixes long and short ones
        let task = |t: usize| {
            let (bi, js) = (t % blocks, t / blocks);
            let cols = js * per_split..((js + 1) * per_split).min(col_blocks);
            with_thread_buffer(&PACK_A, |pa| {
                let a_rows: &[u16] = match whole {
                    Some(w) => &w[bi * 2 * row..(bi + 1) * 2 * row],
                    None => {
                        let a_rows = crate::ensure(pa, 2 * row);
                        // SAFETY: as above; these are this task's two tile rows.
                        unsafe { pack_tile_rows(a_rows, a, 2 * bi, m, k, false) };
                        a_rows
                    }
                };
                // SAFETY: the task writes only its rows bi·32.. of its columns, which the
                // caller bounds-checked; with AMX the caller's session configured the tiles.
                unsafe { block_row(a_rows, pb, b_row, kts, (bi, cols), d, out) };
            })
        };
        let tasks = blocks * splits;
        if threads > 1 && tasks > 1 {
            (0..tasks)
                .into_par_iter()
                .for_each_init(TileSession::begin, |_, t| task(t));
        } else {
            let _tiles = TileSession::begin();
            (0..tasks).for_each(task);
        }
    })
}

/// Phase 3 of `products`: C's block row `bi` over the column blocks `cols`, from its two
/// packed tile rows of A, `a` (`row` values each), and B's tiles from `pb`, `b_row` apart.
///
/// # Safety
/// As for `products`; no other task writes these blocks of C.
unsafe fn block_row(
    a: &[u16],
    pb: &[u16],
    b_row: usize,
    kts: usize,
    (bi, cols): (usize, std::ops::Range<usize>),
    Dims { m, n, .. }: Dims,
    out: SharedOut,
) {
    let row = kts * TILE;
    let col_blocks = n.div_ceil(BLOCK);
    let (i0, rs) = (bi * BLOCK, out.rs);
    let block = if amx() { block } else { block_dot };
    for kc in (0..kts).step_by(KC_TILES) {
        let kn = KC_TILES.min(kts - kc);
        for bj in cols.clone() {
            let j0 = bj * BLOCK;
            // the next block's B, also past the task's columns (the next task's, most often
            // this worker's next: bf16 decode at 16 rows 1.08×)
            let ahead = if bj + 1 < col_blocks { 2 * b_row } else { 0 };
            // SAFETY: the tile pointers stay inside the packed rows (kc + kn ≤ kts) and B's
            // checked length; the block of C is this task's (this fn's `# Safety`).
            unsafe {
                let b = pb.as_ptr().add(2 * bj * b_row);
                block(
                    [a.as_ptr().add(kc * TILE), a.as_ptr().add(row + kc * TILE)],
                    [b.add(kc * TILE), b.add(b_row + kc * TILE)],
                    kn,
                    out.dst.ptr(
                        i0 * rs + j0,
                        (BLOCK.min(m - i0) - 1) * rs + BLOCK.min(n - j0),
                    ),
                    rs,
                    m - i0,
                    n - j0,
                    out.accumulate || kc > 0,
                    ahead,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batch invariance (the server's): each row of a packed product gets the same bits alone
    /// as among up to 40 others, on one thread or two (the few-row groups of `block_dot` and
    /// the column split of `products` included), with and without accumulation.
    #[test]
    fn each_row_gets_the_same_bits_alone_or_among_others() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (c, oc) in [(70, 45), (128, 200)] {
            let w: Vec<f32> = (0..oc * c)
                .map(|i| ((i * 29 % 83) as f32 - 41.0) / 11.0)
                .collect();
            let packed = pack_weight(&w, oc, c);
            let pw = PackedB::weight(&packed, oc, c);
            for n in [2, 3, 5, 9, 17, 41] {
                let x: Vec<f32> = (0..n * c)
                    .map(|i| ((i * 13 % 97) as f32 - 48.0) / 9.0)
                    .collect();
                for (threads, accumulate) in [(1, false), (2, false), (2, true)] {
                    let run = |rows: &[f32], m: usize| {
                        // each row starts from the same values (accumulate), by column
                        let mut y: Vec<f32> = (0..m * oc).map(|i| (i % oc % 7) as f32).collect();
                        let out = Out::new(&mut y, oc, accumulate);
                        let d = Dims::new(m, oc, c);
                        pool.install(|| gemm_packed(d, Mat::rows(rows, c), &pw, out, threads));
                        y
                    };
                    let all = run(&x, n);
                    for r in 0..n {
                        let alone = run(&x[r * c..(r + 1) * c], 1);
                        for (o, (a, b)) in alone.iter().zip(&all[r * oc..(r + 1) * oc]).enumerate()
                        {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{n} rows, {threads} threads: ({r}, {o}): {a} vs {b}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// n input rows and an oc × c weight of small values with many bits.
    fn inputs_and_weight(n: usize, c: usize, oc: usize) -> (Vec<f32>, Vec<f32>) {
        let x = (0..n * c).map(|i| ((i * 13 % 97) as f32 - 48.0) / 9.0);
        let w = (0..oc * c).map(|i| ((i * 29 % 83) as f32 - 41.0) / 11.0);
        (x.collect(), w.collect())
    }

    /// A pre-packed weight gives the same bits as packing it on the fly.
    #[test]
    fn a_prepacked_weight_matches_packing_per_call() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        let (n, c, oc) = (37, 70, 45);
        let (x, w) = inputs_and_weight(n, c, oc);
        let packed = pack_weight(&w, oc, c);
        assert_eq!(packed.len(), packed_len(oc, c));
        for threads in [1, 2] {
            let (mut a, mut b) = (vec![0f32; n * oc], vec![0f32; n * oc]);
            let (d, x) = (Dims::new(n, oc, c), Mat::rows(&x, c));
            gemm(d, x, Mat::t(&w, c), Out::set(&mut a, oc), threads);
            let pw = PackedB::weight(&packed, oc, c);
            gemm_packed(d, x, &pw, Out::set(&mut b, oc), threads);
            assert_eq!(a, b);
            assert!(a.iter().any(|&v| v != 0.0));
        }
    }

    /// Decoding (up to four rows, `tile_row_sums`) reads the same tiles: each row against the
    /// bf16-rounded weight, at depths that end in a whole pair of pairs, a pair, or one depth.
    #[test]
    fn decoding_rows_match_the_rounded_weight() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        for (c, oc) in [(3, 17), (68, 45), (69, 45), (70, 45), (71, 33), (130, 16)] {
            let (x, w) = inputs_and_weight(4, c, oc);
            let packed = pack_weight(&w, oc, c);
            for rows in 1..=4 {
                let mut y = vec![0.25f32; rows * oc];
                let weight = crate::gemm::Weight {
                    f32: &w,
                    bf16: None,
                    tiles: Some(&packed),
                    quant: None,
                    panels: None,
                };
                crate::gemm::matmul_forward(
                    &mut y,
                    &x,
                    weight,
                    rows,
                    c,
                    oc,
                    true,
                    crate::Precision::F32,
                );
                for r in 0..rows {
                    for o in 0..oc {
                        let want: f64 = 0.25
                            + (0..c)
                                .map(|p| x[r * c + p] as f64 * round(w[o * c + p]))
                                .sum::<f64>();
                        let got = y[r * oc + o] as f64;
                        assert!(
                            (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{r},{o}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// `block_dot` alone (the kernel of CPUs without AMX, which an AMX CPU's products never
    /// reach): one 32 × 32 block over three depth tiles, clipped and accumulating.
    #[test]
    fn dot_block_equals_the_product_of_rounded_operands() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        let (m, n, k) = (32, 32, 3 * TK);
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.3) / 7.0)
            .collect();
        let bt: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 89) as f32 - 44.1) / 9.0)
            .collect();
        let (mut pa, mut pb) = (vec![0u16; 2 * 3 * TILE], vec![0u16; 2 * 3 * TILE]);
        // SAFETY: AVX512_BF16 is available; both operands hold (32, k).
        unsafe {
            pack_tile_rows(&mut pa, Mat::rows(&a, k), 0, m, k, false);
            pack_tile_rows(&mut pb, Mat::rows(&bt, k), 0, n, k, true);
        }
        for (h, w, accumulate) in [
            (32, 32, false),
            (19, 7, true),
            (8, 17, false),
            (1, 32, true),
        ] {
            let ld = 40;
            let mut c = vec![0.5f32; m * ld];
            let row = 3 * TILE;
            // SAFETY: as above; c holds 32 rows of ld ≥ 32 columns.
            unsafe {
                block_dot(
                    [pa.as_ptr(), pa.as_ptr().add(row)],
                    [pb.as_ptr(), pb.as_ptr().add(row)],
                    3,
                    c.as_mut_ptr(),
                    ld,
                    h,
                    w,
                    accumulate,
                    0,
                );
            }
            for i in 0..m {
                for j in 0..ld {
                    let got = c[i * ld + j] as f64;
                    if i >= h || j >= w {
                        assert_eq!(got, 0.5, "({i},{j}) outside {h}x{w} was written");
                        continue;
                    }
                    let exact: f64 = (0..k)
                        .map(|p| round(a[i * k + p]) * round(bt[j * k + p]))
                        .sum();
                    let want = exact + if accumulate { 0.5 } else { 0.0 };
                    let scale: f64 = (0..k)
                        .map(|p| (a[i * k + p] * bt[j * k + p]).abs() as f64)
                        .sum();
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + scale),
                        "({i},{j}): {got} vs {want}"
                    );
                }
            }
        }
    }

    fn round(v: f32) -> f64 {
        half::bf16::from_f32(v).to_f64()
    }

    /// Against the exact product of the bf16-rounded operands: every layout, ragged edges in
    /// all three dimensions, accumulating, threaded and not.
    #[test]
    fn product_equals_the_product_of_rounded_operands() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        for (m, n, k) in [
            (1, 1, 1),
            (13, 31, 7),
            (40, 17, 65),
            (64, 96, 64),
            (70, 33, 300),
        ] {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.3) / 7.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 89) as f32 - 44.1) / 9.0)
                .collect();
            let at: Vec<f32> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|idx| b[(idx % k) * n + idx / k]).collect();
            // a strided layout (neither stride 1) takes the scalar packing path
            let (ldx, mut a2) = (k + 2, vec![0f32; m * (k + 2) * 2]);
            for i in 0..m {
                for p in 0..k {
                    a2[i * 2 * ldx + 2 * p] = a[i * k + p];
                }
            }
            let lhs = [
                Mat::rows(&a, k),
                Mat::t(&at, m),
                Mat {
                    data: &a2,
                    rs: 2 * ldx,
                    cs: 2,
                },
            ];
            let rhs = [Mat::rows(&b, n), Mat::t(&bt, k)];
            for threads in [1, 2] {
                for (li, l) in lhs.iter().enumerate() {
                    for (ri, r) in rhs.iter().enumerate() {
                        let ld = n + 3;
                        let mut out = vec![0.5f32; m * ld];
                        let o = Out::new(&mut out, ld, li == 0);
                        gemm(Dims::new(m, n, k), *l, *r, o, threads);
                        for i in 0..m {
                            for j in 0..ld {
                                let exact: f64 = if j < n {
                                    (0..k)
                                        .map(|p| round(a[i * k + p]) * round(b[p * n + j]))
                                        .sum()
                                } else {
                                    0.0
                                };
                                let want = if j >= n || li == 0 {
                                    0.5 + exact
                                } else {
                                    exact
                                };
                                let got = out[i * ld + j] as f64;
                                let scale: f64 = (0..k.max(1))
                                    .map(|p| {
                                        if j < n {
                                            (a[i * k + p] * b[p * n + j]).abs() as f64
                                        } else {
                                            0.0
                                        }
                                    })
                                    .sum();
                                assert!(
                                    (got - want).abs() <= 1e-5 * (1.0 + scale),
                                    "{m}x{n}x{k} lhs{li} rhs{ri} t{threads} ({i},{j}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

//! Quantised linear layers (`--quant q8_0|q4_0`): weights in the GGUF blocks of block.rs, the
//! input quantised per block of 32 to int8 on the fly (`QuantAct`, as llama.cpp quantises its
//! activations to q8_0), and each output the f32 sum over blocks of an int32 block dot product
//! times both blocks' scales.
//!
//! The engines that run the products: on x86-64 `Engine::Vnni` (vnni.rs, AVX512-VNNI's
//! `vpdpbusd`) where the CPU has it, else `Engine::Avx2` (avx2.rs, `vpmaddubsw`: the same tiles
//! and sums, the same bits) where it has AVX2; on ARM64 `Engine::Sdot` (sdot.rs, `sdot` by
//! lane: the same tiles, the same bits) where the CPU has `dotprod`, `Engine::Smmla` (the
//! same, with Q8_0's GEMM blocks on `smmla`) where it has `i8mm` too, else `Engine::Neon`
//! (neon.rs, widening multiplies `smlal`/`sadalp`: the same tiles, the same bits); else
//! `Engine::Portable` (plain integer loops whose FMA gives the same bits again). Tests run every one the CPU has
//! (`matmul_on`). A product of up to `GEMV_ROWS` input rows (decoding) reads every weight once,
//! for those rows together; longer ones (prefill) run as a blocked GEMM over tiles of input and
//! weight rows. Both split the weight rows (and the GEMM the input rows) over the rayon pool.

/// `SimdDots` for the engine module it is called in, from that module's `dots` and `lanes`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! simd_dots {
    ($engine:ident, $sum:ty) => {
        pub(super) struct $engine;

        impl super::SimdDots for $engine {
            type Sum = $sum;
            unsafe fn dots<const R: usize, const T: usize>(
                x: &QuantAct,
                xr: [usize; R],
                kind: QuantKind,
                tl: Tiling,
                ts: [&[u8]; T],
                next: crate::NextLines,
            ) -> [[Self::Sum; T]; R] {
                // SAFETY: the trait's contract is `dots`'s.
                unsafe { dots(x, xr, kind, tl, ts, next) }
            }
            unsafe fn lanes(s: Self::Sum) -> TileSums {
                // SAFETY: the trait's contract: this engine's CPU features.
                unsafe { lanes(s) }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
pub mod block;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod sdot;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
pub(crate) use vnni::block_quants;

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::NextLines;
pub use block::{dequantize, quantize, QuantKind, BLOCK};
use rayon::prelude::*;

/// A weight (rows, cols) as torch `Linear` holds it, each row quantised in blocks of 32, held
/// in the engines' layout: tiles of `TILE_ROWS` rows (the last padded with zero rows), each
/// one stretch of memory in which the tile's rows lie side by side, one per int32 lane
/// (`Tiling`). Q8_0's quants are stored as q + 128, Q4_0's bytes as GGUF packs them.
/// `gguf_bytes` gives the GGUF blocks back.
#[derive(Clone, Debug)]
pub struct QuantMatrix {
    pub kind: QuantKind,
    pub rows: usize,
    pub cols: usize,
    /// the tiles, one after another
    data: Lines,
}

/// Bytes in whole cache lines, the first at a multiple of 64 (a `Vec<u8>` this large starts 16
/// bytes into a page): the VNNI engine reads a tile's chunks with aligned 64-byte loads, which
/// fault off a line (and straddling loads had made the products about 6% slower).
#[derive(Clone, Debug)]
struct Lines(Vec<Line>);

#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([u8; 64]);

impl Lines {
    /// `n` zero bytes, a multiple of 64.
    fn zeroed(n: usize) -> Lines {
        assert!(n.is_multiple_of(64), "Lines: {n} bytes is not whole lines");
        Lines(vec![Line([0; 64]); n / 64])
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 bytes without padding (repr(C) of [u8; 64]); the vector holds
        // len() of them.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), 64 * self.0.len()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), 64 * self.0.len()) }
    }
}

/// Weight rows a tile holds side by side, one per lane of a 16-lane register: a product sums
/// sixteen outputs in one register, block after block, and needs no sum across lanes. Decoding
/// reads a whole tile at once, one stream of memory (rows kept apart made as many short
/// streams, which the hardware prefetchers followed at well under half the memory's rate).
pub const TILE_ROWS: usize = 16;

/// Where element e of block b of an input row sits among its quants: in order.
pub fn x_at(b: usize, e: usize) -> usize {
    b * BLOCK + e
}

/// The layout of one tile, in the order a product reads it: first the scales, block after
/// block, each block's sixteen (f16 bits, little-endian) side by side, row i's at 2i (one
/// 32-byte load), padded to a whole cache line; then the quants, block after block, each
/// block's in 64-byte chunks: chunk k holds quant bytes 4k..4k + 4 of each of the tile's rows,
/// row i's in bytes 4i..4i + 4 (int32 lane i), so that one `vpdpbusd` against four bytes of
/// the input adds them into all sixteen rows' sums.
#[derive(Clone, Copy)]
pub(crate) struct Tiling {
    /// blocks per row
    pub blocks: usize,
    /// bytes of one block's quants
    pub qb: usize,
}

impl Tiling {
    fn new(kind: QuantKind, cols: usize) -> Tiling {
        Tiling {
            blocks: cols / BLOCK,
            qb: kind.quant_bytes(),
        }
    }

    /// Bytes of the scales, whole cache lines.
    pub fn scale_bytes(self) -> usize {
        (2 * TILE_ROWS * self.blocks).next_multiple_of(64)
    }

    /// Bytes of a tile: whole cache lines.
    pub fn bytes(self) -> usize {
        self.scale_bytes() + TILE_ROWS * self.blocks * self.qb
    }

    /// Where row i's scale of block b starts in its tile.
    pub fn scale_at(self, i: usize, b: usize) -> usize {
        2 * (b * TILE_ROWS + i)
    }

    /// Where chunk k of block b (quant bytes 4k..4k + 4 of every row of the tile) starts in
    /// its tile: on a cache line.
    pub fn chunk_at(self, b: usize, k: usize) -> usize {
        self.scale_bytes() + 64 * (b * self.qb / 4 + k)
    }

    /// Where row i's quant byte j of block b sits in its tile (Q8_0: element j; Q4_0: packed
    /// byte j, elements j and j + 16).
    pub fn quant_at(self, i: usize, b: usize, j: usize) -> usize {
        self.chunk_at(b, j / 4) + 4 * i + j % 4
    }
}

impl QuantMatrix {
    /// `w` (rows × cols, row-major) quantised; `None` when `cols` is not a multiple of 32.
    pub fn new(kind: QuantKind, w: &[f32], rows: usize, cols: usize) -> Option<QuantMatrix> {
        assert_eq!(w.len(), rows * cols, "QuantMatrix::new: wrong size");
        if !cols.is_multiple_of(BLOCK) {
            return None;
        }
        let tl = Tiling::new(kind, cols);
        let mut data = Lines::zeroed(rows.div_ceil(TILE_ROWS) * tl.bytes());
        // 1. each row's blocks (tiles in parallel), placed in the engines' layout
        data.bytes_mut()
            .par_chunks_mut(tl.bytes())
            .zip(w.par_chunks(TILE_ROWS * cols))
            .for_each(|(tile, w)| {
                let mut blk = [0u8; BLOCK];
                for (i, w) in w.chunks(cols).enumerate() {
                    for (b, x) in w.chunks_exact(BLOCK).enumerate() {
                        let x = x.try_into().expect("a block");
                        let d = block::quantize_block(kind, x, &mut blk);
                        tile[tl.scale_at(i, b)..][..2].copy_from_slice(&d.to_le_bytes());
                        for (j, &q) in blk[..tl.qb].iter().enumerate() {
                            tile[tl.quant_at(i, b, j)] = match kind {
                                QuantKind::Q8_0 => q ^ 0x80,
                                QuantKind::Q4_0 => q,
                            };
                        }
                    }
                }
            });
        Some(QuantMatrix {
            kind,
            rows,
            cols,
            data,
        })
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.cols / BLOCK
    }

    fn tiling(&self) -> Tiling {
        Tiling::new(self.kind, self.cols)
    }

    /// The GGUF tensor data: every block (scale, then quants), row after row, as a GGUF file
    /// stores a (rows, cols) tensor of this kind (ggml's `ne` = [cols, rows]).
    pub fn gguf_bytes(&self) -> Vec<u8> {
        let (nb, qb) = (self.blocks(), self.kind.quant_bytes());
        let mut out = Vec::with_capacity(self.rows * nb * self.kind.block_bytes());
        for r in 0..self.rows {
            for b in 0..nb {
                out.extend_from_slice(&self.scale(r, b).to_le_bytes());
                out.extend((0..qb).map(|j| self.quant(r, b, j)));
            }
        }
        out
    }

    /// The values the blocks stand for, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        dequantize(self.kind, &self.gguf_bytes()).expect("whole blocks")
    }

    /// Bytes the products read: quants and scales.
    pub fn bytes(&self) -> usize {
        self.data.bytes().len()
    }

    /// Tile t: rows t · `TILE_ROWS` on.
    fn tile(&self, t: usize) -> &[u8] {
        let tb = self.tiling().bytes();
        &self.data.bytes()[t * tb..(t + 1) * tb]
    }

    /// Row r's scale of block b, as f16 bits.
    fn scale(&self, r: usize, b: usize) -> u16 {
        let at = self.tiling().scale_at(r % TILE_ROWS, b);
        let t = self.tile(r / TILE_ROWS);
        u16::from_le_bytes([t[at], t[at + 1]])
    }

    /// Row r's quant byte j of block b as GGUF stores it (Q8_0: element j as i8 bits; Q4_0:
    /// packed byte j).
    fn quant(&self, r: usize, b: usize, j: usize) -> u8 {
        let at = self.tiling().quant_at(r % TILE_ROWS, b, j);
        let q = self.tile(r / TILE_ROWS)[at];
        match self.kind {
            QuantKind::Q8_0 => q ^ 0x80,
            QuantKind::Q4_0 => q,
        }
    }
}

/// Which code runs the integer dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// AVX-512 with VNNI (`vpdpbusd`: unsigned × signed bytes into int32)
    Vnni,
    /// AVX2 with FMA and F16C (`vpmaddubsw` then `vpmaddwd`)
    Avx2,
    /// ARM64 with `dotprod` (`sdot` by lane: signed bytes into int32)
    Sdot,
    /// ARM64 with `i8mm` and `dotprod`: `Sdot` with Q8_0's GEMM blocks on `smmla` (2 × 8 by
    /// 8 × 2 signed bytes into int32)
    Smmla,
    /// ARM64 without `dotprod` (`smlal`: signed bytes into int16, `sadalp` on into int32)
    Neon,
    /// plain loops, on any CPU
    Portable,
}

/// Set by `force_portable`: `Engine::detect` then answers `Portable` on any CPU.
static FORCED_PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// With `on`, every quantised product runs on the `Portable` engine, whatever the CPU has:
/// what `--quant` runs on a CPU without AVX2, on this one (tests compare the engines).
/// Process-wide; turn it on or off only while no quantised product runs.
pub fn force_portable(on: bool) {
    FORCED_PORTABLE.store(on, std::sync::atomic::Ordering::SeqCst);
}

impl Engine {
    /// `Vnni` where the CPU has AVX512-VNNI (with AVX-512F/BW), else `Avx2` where it has
    /// AVX2 (with FMA and F16C); on ARM64 `Smmla` where it has `i8mm` and `dotprod`, else
    /// `Sdot` where it has `dotprod`, else `Neon`; else `Portable`; always `Portable` under
    /// `force_portable(true)`.
    pub fn detect() -> Engine {
        let forced = FORCED_PORTABLE.load(std::sync::atomic::Ordering::SeqCst);
        match Engine::available() {
            _ if forced => Engine::Portable,
            engines => engines[0],
        }
    }

    /// Its name in benchmarks: "vnni", "avx2", "sdot", "smmla", "neon" or "portable".
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vnni => "vnni",
            Engine::Avx2 => "avx2",
            Engine::Sdot => "sdot",
            Engine::Smmla => "smmla",
            Engine::Neon => "neon",
            Engine::Portable => "portable",
        }
    }

    /// The engines this CPU runs, fastest first (`Portable` last, always there; `Neon` on
    /// every ARM64 CPU, behind the `dotprod` ones); detected once, since every product asks.
    pub fn available() -> &'static [Engine] {
        static ENGINES: std::sync::OnceLock<Vec<Engine>> = std::sync::OnceLock::new();
        ENGINES.get_or_init(|| {
            let mut engines = Vec::with_capacity(4);
            if cpu_has_vnni() {
                engines.push(Engine::Vnni);
            }
            #[cfg(target_arch = "x86_64")]
            if avx2::available() {
                engines.push(Engine::Avx2);
            }
            if crate::gemm::cpu::dotprod() && crate::gemm::cpu::i8mm() {
                engines.push(Engine::Smmla);
            }
            if crate::gemm::cpu::dotprod() {
                engines.push(Engine::Sdot);
            }
            if crate::gemm::cpu::neon() {
                engines.push(Engine::Neon);
            }
            engines.push(Engine::Portable);
            engines
        })
    }
}

/// Whether this CPU has AVX512-VNNI with AVX-512F/BW (detected once).
fn cpu_has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// An input (n, cols) quantised per block of 32 to int8, as Q8_0 quantises (`d = max|x|/127`,
/// `q = round(x/d)`), but with the scale kept in f32; quants at `x_at`.
pub struct QuantAct {
    n: usize,
    /// blocks of a row
    stride: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    /// −offset · Σq per block, exact in int32: what the VNNI engine's unsigned weights
    /// (`offset`) add to each block's integer dot product, taken back out before it is scaled
    corr: Vec<i32>,
}

impl QuantAct {
    /// `x` (n, cols) quantised for products with `kind` weights.
    pub fn new(x: &[f32], n: usize, cols: usize, kind: QuantKind) -> QuantAct {
        assert!(cols.is_multiple_of(BLOCK) && x.len() >= n * cols);
        let stride = cols / BLOCK;
        // this thread's buffers of its last input, which every element below overwrites: a
        // prefill's inputs were fresh pages, zeroed by the kernel, at each product
        let (mut qs, mut d, mut corr) = SPARE.take();
        qs.resize(n * stride * BLOCK, 0);
        d.resize(n * stride, 0.0);
        corr.resize(n * stride, 0);
        let mut a = QuantAct {
            n,
            stride,
            qs,
            d,
            corr,
        };
        let offset = offset(kind);
        // (each row of x a chunk of exactly `cols`)
        let x = &x[..n * cols];
        let one = |((q, d), (c, x)): (_, (_, &[f32]))| quantize_row(x, q, d, c, offset);
        if n > 1 && n * cols >= 1 << 14 {
            // rows in even shares for the threads, at least 8 Ki values to a share
            let min_rows = (1 << 13) / cols + 1;
            let qd = a.qs.par_chunks_mut(stride * BLOCK);
            let qd = qd.zip(a.d.par_chunks_mut(stride));
            qd.zip(a.corr.par_chunks_mut(stride).zip(x.par_chunks(cols)))
                .with_min_len(min_rows)
                .for_each(one);
        } else {
            let qd = a.qs.chunks_mut(stride * BLOCK).zip(a.d.chunks_mut(stride));
            qd.zip(a.corr.chunks_mut(stride).zip(x.chunks(cols)))
                .for_each(one);
        }
        a
    }

    fn row(&self, r: usize) -> (&[i8], &[f32], &[i32]) {
        let s = self.stride;
        (
            &self.qs[r * s * BLOCK..(r + 1) * s * BLOCK],
            &self.d[r * s..(r + 1) * s],
            &self.corr[r * s..(r + 1) * s],
        )
    }
}

thread_local! {
    /// The buffers of the last `QuantAct` dropped on this thread, for the next one.
    static SPARE: std::cell::Cell<(Vec<i8>, Vec<f32>, Vec<i32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new(), Vec::new())) };
}

impl Drop for QuantAct {
    fn drop(&mut self) {
        let bufs = (
            std::mem::take(&mut self.qs),
            std::mem::take(&mut self.d),
            std::mem::take(&mut self.corr),
        );
        SPARE.set(bufs);
    }
}

/// One input row's blocks: quants, scales and the VNNI engine's corrections; sixteen lanes at
/// a time where the CPU has AVX-512 (`vnni::quantize_row`), eight where it has AVX2
/// (`avx2::quantize_row`): the same bytes.
fn quantize_row(x: &[f32], qs: &mut [i8], d: &mut [f32], corr: &mut [i32], offset: i32) {
    #[cfg(target_arch = "x86_64")]
    if cpu_has_vnni() {
        // SAFETY: the CPU has AVX-512F/BW (with VNNI).
        return unsafe { vnni::quantize_row(x, qs, d, corr, offset) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        // SAFETY: the CPU has AVX2.
        return unsafe { avx2::quantize_row(x, qs, d, corr, offset) };
    }
    quantize_row_scalar(x, qs, d, corr, offset)
}

/// `quantize_row`, one element at a time.
fn quantize_row_scalar(x: &[f32], qs: &mut [i8], d: &mut [f32], corr: &mut [i32], offset: i32) {
    for (b, x) in x.chunks_exact(BLOCK).enumerate() {
        let (scale, q) = block::q8_quants(x);
        let mut sum = 0i32;
        for (e, q) in q.into_iter().enumerate() {
            qs[x_at(b, e)] = q;
            sum += q as i32;
        }
        d[b] = scale;
        corr[b] = -offset * sum;
    }
}

/// What the VNNI engine adds to each weight quant to make it unsigned: Q8_0's i8 with its top
/// bit flipped is q + 128; Q4_0's nibbles are q + 8 already.
fn offset(kind: QuantKind) -> i32 {
    match kind {
        QuantKind::Q8_0 => 128,
        QuantKind::Q4_0 => 8,
    }
}

/// Up to this many input rows, a product reads each weight row once for all of them (decoding).
pub const GEMV_ROWS: usize = 4;
/// Weight rows per task: whole tiles.
const ROW_CHUNK: usize = 64;
const _: () = assert!(ROW_CHUNK.is_multiple_of(TILE_ROWS));
/// Input rows per GEMM task.
const ACT_CHUNK: usize = 64;

/// out (n, w.rows) = x · wᵀ (or += with `accumulate`) for a quantised input, on the engine
/// this CPU has.
pub fn matmul(out: &mut [f32], x: &QuantAct, w: &QuantMatrix, accumulate: bool) {
    matmul_on(Engine::detect(), &mut [(out, w)], x, accumulate)
}

/// out = x · wᵀ for each (out, w) of `parts`, weights that read the same input (q, k and v;
/// gate and up), in one parallel region, on a chosen engine (one of `Engine::available`).
pub fn matmul_on(
    engine: Engine,
    parts: &mut [(&mut [f32], &QuantMatrix)],
    x: &QuantAct,
    accumulate: bool,
) {
    assert!(
        Engine::available().contains(&engine),
        "{engine:?}: not on this CPU"
    );
    let n = x.n;
    let act_chunk = if n <= GEMV_ROWS { GEMV_ROWS } else { ACT_CHUNK };
    let ti = n.div_ceil(act_chunk);
    // 1. each part's output, and its tasks: (input rows, weight rows) tiles
    let jobs: Vec<(crate::SharedMut, &QuantMatrix, usize)> = parts
        .iter_mut()
        .map(|(out, w)| {
            assert!(out.len() >= n * w.rows, "quant matmul: out too small");
            assert_eq!(x.stride, w.blocks(), "quant matmul: widths differ");
            (
                crate::SharedMut::new(out),
                *w,
                ti * w.rows.div_ceil(ROW_CHUNK),
            )
        })
        .collect();
    let task = |mut t: usize| {
        let (out, w, _) = *jobs
            .iter()
            .find(|j| {
                let here = t < j.2;
                if !here {
                    t -= j.2;
                }
                here
            })
            .expect("a task of some part");
        let (oc, tw) = (w.rows, w.rows.div_ceil(ROW_CHUNK));
        let (rows, outs) = (
            (t / tw) * act_chunk..((t / tw + 1) * act_chunk).min(n),
            (t % tw) * ROW_CHUNK..((t % tw + 1) * ROW_CHUNK).min(oc),
        );
        // 2. each output of the tile: Σ over blocks of (int dot) · d_w · d_x, handed over in
        // runs of a row's consecutive outputs (a tile's sixteen)
        // SAFETY: outputs (rows × outs) belong to this task alone, and lie inside `out`
        // (asserted above).
        let put = |r: usize, o: usize, v: &[f32]| unsafe {
            let y = out.slice(r * oc + o, v.len());
            match accumulate {
                true => y.iter_mut().zip(v).for_each(|(y, v)| *y += v),
                false => y.copy_from_slice(v),
            }
        };
        match engine {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the assert above checked that the CPU has the engine's instructions.
            Engine::Vnni => unsafe {
                engine_tile::<vnni::Vnni, { vnni::NX }, { vnni::NT }>(x, w, rows, outs, put)
            },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Engine::Avx2 => unsafe {
                engine_tile::<avx2::Avx2, { avx2::NX }, { avx2::NT }>(x, w, rows, outs, put)
            },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            Engine::Sdot => unsafe {
                engine_tile::<sdot::Sdot, { sdot::NX }, { sdot::NT }>(x, w, rows, outs, put)
            },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            Engine::Smmla => unsafe {
                engine_tile::<sdot::Smmla, { sdot::NX }, { sdot::NT }>(x, w, rows, outs, put)
            },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: as above.
            Engine::Neon => unsafe {
                engine_tile::<neon::Neon, { neon::NX }, { neon::NT }>(x, w, rows, outs, put)
            },
            _ => portable_tile(x, w, rows, outs, put),
        }
    };
    let tasks: usize = jobs.iter().map(|j| j.2).sum();
    let macs: usize = jobs.iter().map(|j| n * j.1.rows * j.1.cols).sum();
    if tasks > 1 && macs >= super::gemm::PARALLEL_THRESHOLD / 4 {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One input row's sums with the sixteen weight rows of a tile, lane i for the tile's row i.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) type TileSums = [f32; TILE_ROWS];

/// A SIMD engine's block sums, as `engine_tile` runs them: `dots` gives the sums of input rows
/// `xr` with the sixteen rows of each tile of `ts` (lane i for a tile's row i), in the
/// engine's registers, which `lanes` stores.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) trait SimdDots {
    /// sixteen f32 lanes: one register on AVX-512, two on AVX2
    type Sum: Copy;
    /// # Safety
    /// The engine's CPU features; the rows exist; each of `ts` is a tile of `tl`.
    unsafe fn dots<const R: usize, const T: usize>(
        x: &QuantAct,
        xr: [usize; R],
        kind: QuantKind,
        tl: Tiling,
        ts: [&[u8]; T],
        next: NextLines,
    ) -> [[Self::Sum; T]; R];
    /// # Safety
    /// The engine's CPU features.
    unsafe fn lanes(s: Self::Sum) -> TileSums;
}

/// The outputs (rows × outs) on engine E, handed to `put(row, first out, values)`: one input
/// row a tile at a time (decoding), or `NX` input rows against `NT` tiles a step (fewer rows
/// at the end), in `simd_tile`'s loop.
///
/// # Safety
/// The CPU has E's features; `rows` and `outs` lie inside `x` and `w`, `outs` from a tile.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe fn engine_tile<E: SimdDots, const NX: usize, const NT: usize>(
    x: &QuantAct,
    w: &QuantMatrix,
    rows: std::ops::Range<usize>,
    outs: std::ops::Range<usize>,
    put: impl Fn(usize, usize, &[f32]),
) {
    let (tl, kind) = (w.tiling(), w.kind);
    // (fewer than NX rows' sums in NX rows, the rest copies of the first, not used)
    fn pad<S: Copy, const R: usize, const NX: usize, const NT: usize>(
        s: [[S; NT]; R],
    ) -> [[S; NT]; NX] {
        std::array::from_fn(|j| if j < R { s[j] } else { s[0] })
    }
    // SAFETY: the features are this function's contract; `simd_tile` hands rows of `rows`
    // and tiles of `outs`, which lie inside x and w.
    let one = |r: usize, t: &[u8]| unsafe {
        let [[v]] = E::dots::<1, 1>(x, [r], kind, tl, [t], NextLines::NONE);
        E::lanes(v)
    };
    // SAFETY: as for `one`.
    let step = |xr: [usize; NX], left: usize, ts: [&[u8]; NT], next: NextLines| unsafe {
        let s: [[E::Sum; NT]; NX] = match left {
            1 => pad(E::dots::<1, NT>(x, [xr[0]], kind, tl, ts, next)),
            2 => pad(E::dots::<2, NT>(x, [xr[0], xr[1]], kind, tl, ts, next)),
            _ => E::dots::<NX, NT>(x, xr, kind, tl, ts, next),
        };
        s.map(|s| s.map(|v| E::lanes(v)))
    };
    simd_tile::<NX, NT>(w, rows, outs, put, one, step)
}

/// What a SIMD engine's `dots` reads: where each tile starts, and each input row's quants,
/// scales and corrections (checked to hold the tiling's blocks). Made once a call, it asks for
/// the tiles' scales whole: a short stretch of their own, too short for the hardware
/// prefetchers to follow.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) struct Operands<'a, const R: usize, const T: usize> {
    pub tiles: [*const u8; T],
    pub xq: [&'a [i8]; R],
    pub xd: [&'a [f32]; R],
    // (the ARM engine makes its weights signed and needs no correction)
    #[cfg_attr(target_arch = "aarch64", allow(dead_code))]
    pub xc: [&'a [i32]; R],
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl<'a, const R: usize, const T: usize> Operands<'a, R, T> {
    pub fn new(x: &'a QuantAct, xr: [usize; R], tl: Tiling, ts: [&[u8]; T]) -> Self {
        assert!(ts.iter().all(|t| t.len() >= tl.bytes()));
        let rows = xr.map(|r| x.row(r));
        assert!(rows
            .iter()
            .all(|(q, d, _)| q.len() >= tl.blocks * BLOCK && d.len() >= tl.blocks));
        for t in ts {
            // (a line of 64 bytes every 16 values)
            crate::prefetch(t.as_ptr().cast(), tl.scale_bytes() / 4);
        }
        Operands {
            tiles: ts.map(|t| t.as_ptr()),
            xq: rows.map(|r| r.0),
            xd: rows.map(|r| r.1),
            xc: rows.map(|r| r.2),
        }
    }

    /// Block b's first chunk in each tile and first quant in each input row.
    ///
    /// # Safety
    /// Block b lies inside the tiles (`new` checked their length).
    #[inline(always)]
    pub unsafe fn block(&self, tl: Tiling, b: usize) -> ([*const u8; T], [*const i8; R]) {
        let (mut wp, mut xp) = ([std::ptr::null(); T], [std::ptr::null(); R]);
        for (w, t) in wp.iter_mut().zip(self.tiles) {
            // SAFETY: the block's chunks lie inside the tile (the caller's contract).
            *w = unsafe { t.add(tl.chunk_at(b, 0)) };
        }
        for (x, q) in xp.iter_mut().zip(self.xq) {
            *x = q[x_at(b, 0)..].as_ptr();
        }
        (wp, xp)
    }
}

/// The loop of both SIMD engines over a task's outputs (rows × outs; `outs` from a tile):
/// one input row a tile at a time (`one`: decoding, one stream of memory; two or four tiles
/// at once, more streams, ran slower both from L3 and from memory), or `NT` tiles at a time
/// against `NX` input rows at a time (`step(rows, valid, tiles, next)`, rows past the end
/// repeat the last one and only the `valid` first count), each step fetching its share of the
/// next tiles into L2 block by block (`NextLines`, spread where a burst at the step's start
/// queued its prefetches and held the step up: the first read of a tile is from memory;
/// the steps after it find it in cache), past the task's last tile too: the next task's
/// first, which the same worker most often runs next. Each tile's rows past `outs` (the
/// padding) are dropped.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn simd_tile<const NX: usize, const NT: usize>(
    w: &QuantMatrix,
    rows: std::ops::Range<usize>,
    outs: std::ops::Range<usize>,
    put: impl Fn(usize, usize, &[f32]),
    one: impl Fn(usize, &[u8]) -> TileSums,
    step: impl Fn([usize; NX], usize, [&[u8]; NT], NextLines) -> [[TileSums; NT]; NX],
) {
    assert!(rows.start < rows.end && outs.end <= w.rows && outs.start.is_multiple_of(TILE_ROWS));
    let tl = w.tiling();
    let tiles = outs.start / TILE_ROWS..outs.end.div_ceil(TILE_ROWS);
    let emit = |r: usize, t: usize, s: &TileSums| {
        let o0 = t * TILE_ROWS;
        match outs.end - o0 >= TILE_ROWS {
            true => put(r, o0, s),
            false => put(r, o0, &s[..outs.end - o0]),
        }
    };
    if rows.len() == 1 {
        for t in tiles {
            emit(rows.start, t, &one(rows.start, w.tile(t)));
        }
        return;
    }
    let last = w.rows.div_ceil(TILE_ROWS);
    for t0 in tiles.clone().step_by(NT) {
        let ts: [&[u8]; NT] = std::array::from_fn(|k| w.tile((t0 + k).min(tiles.end - 1)));
        let first_next = last.min(t0 + NT);
        let lines = tl.bytes() / 64 * (last.min(t0 + 2 * NT) - first_next);
        let from = w
            .data
            .bytes()
            .as_ptr()
            .wrapping_add(first_next * tl.bytes());
        let steps = rows.len().div_ceil(NX);
        for (i, r0) in rows.clone().step_by(NX).enumerate() {
            let next = NextLines::share(from, lines, i, steps);
            let left = (rows.end - r0).min(NX);
            let s = step(
                std::array::from_fn(|j| r0 + j.min(left - 1)),
                left,
                ts,
                next,
            );
            for (j, s) in s.iter().enumerate().take(left) {
                for (k, v) in s.iter().enumerate().take(tiles.end - t0) {
                    emit(r0 + j, t0 + k, v);
                }
            }
        }
    }
}

/// The outputs (rows × outs), one plain integer dot product per block.
fn portable_tile(
    x: &QuantAct,
    w: &QuantMatrix,
    rows: std::ops::Range<usize>,
    outs: std::ops::Range<usize>,
    put: impl Fn(usize, usize, &[f32]),
) {
    let nb = w.blocks();
    for o in outs {
        for r in rows.clone() {
            let (xq, xd, _) = x.row(r);
            let mut sum = 0f32;
            for b in 0..nb {
                let (q, x) = (|j| w.quant(o, b, j), |e| xq[x_at(b, e)] as i32);
                let dot: i32 = match w.kind {
                    QuantKind::Q8_0 => (0..BLOCK).map(|e| q(e) as i8 as i32 * x(e)).sum(),
                    QuantKind::Q4_0 => (0..BLOCK / 2)
                        .map(|j| {
                            let byte = q(j);
                            ((byte & 15) as i32 - 8) * x(j)
                                + ((byte >> 4) as i32 - 8) * x(j + BLOCK / 2)
                        })
                        .sum(),
                };
                // the SIMD engines' convert and FMA: every engine gives the same bits
                let scale = half::f16::from_bits(w.scale(o, b)).to_f32() * xd[b];
                sum = (dot as f32).mul_add(scale, sum);
            }
            put(r, o, &[sum]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: usize, outlier: bool) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (((i * 7919 + seed * 104729) % 1009) as f32 / 504.5 - 1.0) * 0.7;
                if outlier && i % 97 == 5 {
                    v * 40.0
                } else {
                    v
                }
            })
            .collect()
    }

    /// Both engines against f32 references on ragged shapes (odd block counts, weight rows
    /// and input rows off every tile size, an odd number of tiles, decoding's 1–4 rows and a
    /// multi-task GEMM):
    /// against the product of the dequantised weights with the dequantised input, to f32
    /// rounding; against the plain f32 product, to the error of int8 and int4 quantisation.
    #[test]
    fn engines_match_f32_references_on_ragged_shapes() {
        let engines = Engine::available();
        for (n, c, oc) in [
            (1, 32, 1),
            (1, 96, 67),
            (3, 160, 130),
            (4, 64, 5),
            (5, 96, 9),
            (70, 544, 131),
            (2, 896, 19),
            (130, 64, 70),
        ] {
            let (x, w) = (data(n * c, 1, true), data(oc * c, 2, false));
            for kind in QuantKind::ALL {
                let qw = QuantMatrix::new(kind, &w, oc, c).unwrap();
                let qx = QuantAct::new(&x, n, c, kind);
                let (wd, xd) = (qw.dequantize(), dequant_act(&qx, n, c));
                for &engine in engines {
                    let mut got = vec![0.5; n * oc];
                    matmul_on(engine, &mut [(&mut got[..], &qw)], &qx, true);
                    for r in 0..n {
                        for o in 0..oc {
                            let dot = |a: &[f32], b: &[f32]| -> f64 {
                                (0..c)
                                    .map(|j| a[r * c + j] as f64 * b[o * c + j] as f64)
                                    .sum()
                            };
                            let g = got[r * oc + o] as f64 - 0.5;
                            let (exact, f) = (dot(&xd, &wd), dot(&x, &w));
                            let scale: f64 = (0..c)
                                .map(|j| (xd[r * c + j] * wd[o * c + j]).abs() as f64)
                                .sum();
                            assert!(
                                (g - exact).abs() <= 1e-5 * scale + 1e-6,
                                "{engine:?} {kind} {n}x{c}x{oc} ({r},{o}): {g} vs {exact}"
                            );
                            // against f32: within what the quantisation errors can add up to
                            let bound: f64 = (0..c)
                                .map(|j| {
                                    let (xi, wi) = (r * c + j, o * c + j);
                                    ((xd[xi] - x[xi]).abs() * wd[wi].abs()
                                        + x[xi].abs() * (wd[wi] - w[wi]).abs())
                                        as f64
                                })
                                .sum();
                            assert!(
                                (g - f).abs() <= 1.001 * bound + 1e-5 * scale + 1e-6,
                                "{engine:?} {kind} ({r},{o}): {g} vs f32 {f}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The largest products the int8 instructions meet: every weight and input quant at full
    /// scale (Q8_0 ±127 and −128 against ±127; Q4_0's nibbles 0 and 15 against ±127), each
    /// sign pattern, where an int16 pair sum (`vpmaddubsw`) would saturate if the engine let
    /// it: each engine's sum equals the exact one, computed in i64 from the same quants.
    #[test]
    fn full_scale_quants_do_not_saturate() {
        let (n, c, oc) = (4, 128, 20);
        // weight row o: ±1 in a pattern, Q8_0 quantises each block to ±127 (d = 1/127); every
        // third row −1 then +1s in each block, which Q4_0 quantises to nibbles 0 then 15 (a
        // block's sum of nibble products at its largest against the all-positive input)
        let w: Vec<f32> = (0..oc * c)
            .map(|i| match (i / c % 3, i % 32) {
                (0, 0) => -1.0,
                (0, _) => 1.0,
                _ if (i / c + i % c / 3) % 2 == 0 => 1.0,
                _ => -1.0,
            })
            .collect();
        for kind in QuantKind::ALL {
            let qw = QuantMatrix::new(kind, &w, oc, c).unwrap();
            // input row r: the signs of weight row r (every pair at its largest), their
            // opposite, alternating, then all positive
            let x: Vec<f32> = (0..n * c)
                .map(|i| match i / c {
                    0 => w[i % c],
                    1 => -w[c + i % c],
                    2 => [1.0, -1.0][i % 2],
                    _ => 1.0,
                })
                .collect();
            let qx = QuantAct::new(&x, n, c, kind);
            let (wd, xd) = (qw.dequantize(), dequant_act(&qx, n, c));
            for &engine in Engine::available() {
                let mut got = vec![0f32; n * oc];
                matmul_on(engine, &mut [(&mut got[..], &qw)], &qx, false);
                for r in 0..n {
                    for o in 0..oc {
                        let exact: f64 = (0..c)
                            .map(|j| xd[r * c + j] as f64 * wd[o * c + j] as f64)
                            .sum();
                        let g = got[r * oc + o] as f64;
                        assert!(
                            (g - exact).abs() <= 1e-5 * exact.abs().max(1.0),
                            "{engine:?} {kind} ({r},{o}): {g} vs {exact}"
                        );
                    }
                }
            }
        }
    }

    /// A Q8_0 weight quant of −128, which GGUF files may hold though `quantize` never makes
    /// it, by full-scale inputs of either sign: the largest products (128 · 127), where the
    /// NEON engine's int16 runs of two chunks are closest to overflowing; every engine gives
    /// the portable loops' bits, and those are the exact sums.
    #[test]
    fn q8_weights_of_minus_128_do_not_overflow() {
        let (n, c, oc) = (3, 96, 20);
        let mut qw = QuantMatrix::new(QuantKind::Q8_0, &vec![1.0; oc * c], oc, c).unwrap();
        let tl = qw.tiling();
        for o in 0..oc {
            for (b, j) in (0..c / BLOCK).flat_map(|b| (0..BLOCK).map(move |j| (b, j))) {
                // stored as q + 128 (top bit flipped): −128 is 0
                let at = (o / TILE_ROWS) * tl.bytes() + tl.quant_at(o % TILE_ROWS, b, j);
                qw.data.bytes_mut()[at] = if (o + j) % 5 == 0 { 0xff } else { 0 };
            }
        }
        let x: Vec<f32> = (0..n * c).map(|i| [-1.0, 1.0, -1.0][i / c]).collect();
        let qx = QuantAct::new(&x, n, c, QuantKind::Q8_0);
        let (wd, xd) = (qw.dequantize(), dequant_act(&qx, n, c));
        let bits = |engine| {
            let mut got = vec![0f32; n * oc];
            matmul_on(engine, &mut [(&mut got[..], &qw)], &qx, false);
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let portable = bits(Engine::Portable);
        for (i, &g) in portable.iter().enumerate() {
            let (r, o) = (i / oc, i % oc);
            let exact: f64 = (0..c)
                .map(|j| xd[r * c + j] as f64 * wd[o * c + j] as f64)
                .sum();
            let g = f32::from_bits(g) as f64;
            assert!(
                (g - exact).abs() <= 1e-5 * exact.abs(),
                "({r},{o}): {g} vs {exact}"
            );
        }
        for &engine in Engine::available() {
            assert_eq!(bits(engine), portable, "{engine:?}");
        }
    }

    /// Every engine, the portable loops too, takes the same exact integer block sums and
    /// scales them with the same f32 operations (a convert, a product of the scales, an FMA) in
    /// the same order: the same bits, so that a model gives the same text on every CPU.
    #[test]
    fn every_engine_gives_the_same_bits() {
        let simd = Engine::available();
        for (n, c, oc) in [(1, 544, 131), (9, 96, 40), (70, 64, 33)] {
            let (x, w) = (data(n * c, 8, true), data(oc * c, 9, false));
            for kind in QuantKind::ALL {
                let qw = QuantMatrix::new(kind, &w, oc, c).unwrap();
                let qx = QuantAct::new(&x, n, c, kind);
                let bits: Vec<Vec<u32>> = simd
                    .iter()
                    .map(|&engine| {
                        let mut got = vec![0f32; n * oc];
                        matmul_on(engine, &mut [(&mut got[..], &qw)], &qx, false);
                        got.iter().map(|v| v.to_bits()).collect()
                    })
                    .collect();
                for (e, b) in simd.iter().zip(&bits).skip(1) {
                    assert!(b == &bits[0], "{e:?} vs {:?}, {kind} {n}x{c}x{oc}", simd[0]);
                }
            }
        }
    }

    /// Decoding's step (one input row against one tile of weight rows) and the GEMM's (up to
    /// four input rows against two tiles) do the same arithmetic for each output: every row
    /// of a product of many input rows is, bit for bit, that row's product alone.
    #[test]
    fn a_rows_product_alone_matches_it_among_many_bit_for_bit() {
        // 9, 10 and 11 rows: the GEMM's last step takes 1, 2 or 3 of them; 41 rows of 512:
        // the input quantised in parallel shares of rows
        for (n, c, oc) in [(9, 544, 75), (10, 96, 40), (11, 64, 33), (41, 512, 24)] {
            rows_alone_and_among_many(n, c, oc);
        }
    }

    fn rows_alone_and_among_many(n: usize, c: usize, oc: usize) {
        let (x, w) = (data(n * c, 5, true), data(oc * c, 6, false));
        for kind in QuantKind::ALL {
            let qw = QuantMatrix::new(kind, &w, oc, c).unwrap();
            for &engine in Engine::available() {
                let mut all = vec![0f32; n * oc];
                let qx = QuantAct::new(&x, n, c, kind);
                matmul_on(engine, &mut [(&mut all[..], &qw)], &qx, false);
                for r in 0..n {
                    let mut one = vec![0f32; oc];
                    let qx = QuantAct::new(&x[r * c..(r + 1) * c], 1, c, kind);
                    matmul_on(engine, &mut [(&mut one[..], &qw)], &qx, false);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&one),
                        bits(&all[r * oc..(r + 1) * oc]),
                        "{engine:?} {kind} {r}"
                    );
                }
            }
        }
    }

    /// The input's values back; each within half a step (d/2) of the input.
    fn dequant_act(a: &QuantAct, n: usize, c: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * c];
        for r in 0..n {
            let (q, d, _) = a.row(r);
            for j in 0..c {
                out[r * c + j] = q[x_at(j / BLOCK, j % BLOCK)] as f32 * d[j / BLOCK];
            }
        }
        out
    }

    /// The vector quantisers (VNNI's, AVX2's) give the scalar one's bytes, ties (x/d ending in
    /// exactly .5, rounded away from zero) included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_quantisers_match_the_scalar_one() {
        // block 0: d = 1 exactly, so the halves are ties; then ordinary and all-zero blocks
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        x[31] = 127.0;
        x[30] = -126.5;
        x.extend(data(32 * 6, 7, true));
        x.extend([0.0; 32]);
        let nb = x.len() / BLOCK;
        let fresh = || (vec![0i8; nb * BLOCK], vec![0f32; nb], vec![0i32; nb]);
        let ((mut q1, mut d1, mut c1), (mut q2, mut d2, mut c2)) = (fresh(), fresh());
        quantize_row_scalar(&x, &mut q1, &mut d1, &mut c1, 128);
        // each block's correction takes the offset back out of its sum: −128 · Σq
        for (b, &c) in c1.iter().enumerate() {
            let sum: i32 = (0..BLOCK).map(|e| q1[x_at(b, e)] as i32).sum();
            assert_eq!(c, -128 * sum, "block {b}");
        }
        if cpu_has_vnni() {
            // SAFETY: the CPU has AVX-512F/BW.
            unsafe { vnni::quantize_row(&x, &mut q2, &mut d2, &mut c2, 128) };
            assert_eq!((&q1, &d1, &c1), (&q2, &d2, &c2), "vnni");
        }
        if avx2::available() {
            (q2, d2, c2) = fresh();
            // SAFETY: the CPU has AVX2.
            unsafe { avx2::quantize_row(&x, &mut q2, &mut d2, &mut c2, 128) };
            assert_eq!((&q1, &d1, &c1), (&q2, &d2, &c2), "avx2");
        }
    }

    #[test]
    fn the_input_is_quantised_to_within_half_a_step() {
        let (n, c) = (3, 96);
        let x = data(n * c, 4, true);
        let a = QuantAct::new(&x, n, c, QuantKind::Q8_0);
        let back = dequant_act(&a, n, c);
        for r in 0..n {
            let d = a.row(r).1;
            for j in 0..c {
                let (i, step) = (r * c + j, d[j / BLOCK]);
                assert!(
                    (back[i] - x[i]).abs() <= 0.5001 * step,
                    "{i}: {} vs {}",
                    back[i],
                    x[i]
                );
            }
            assert!(d[..c / BLOCK].iter().all(|&s| s > 0.0));
        }
    }

    #[test]
    fn gguf_bytes_are_the_blocks_of_each_row() {
        let w = data(3 * 64, 3, true);
        for kind in QuantKind::ALL {
            let m = QuantMatrix::new(kind, &w, 3, 64).unwrap();
            assert_eq!(m.gguf_bytes(), quantize(kind, &w).unwrap());
            assert_eq!(m.dequantize(), dequantize(kind, &m.gguf_bytes()).unwrap());
            assert!(QuantMatrix::new(kind, &w, 4, 48).is_none());
        }
    }
}

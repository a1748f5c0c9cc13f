//! Linear layers over the product engine (`super::gemm`), llm.c's `matmul_forward` and
//! `matmul_backward`; decoding's few-row products are matrix-vector products here (`Gemv`),
//! with no packing.

use super::{gemm, threads_for, Dims, Mat, Out, Precision, PARALLEL_THRESHOLD};
use crate::quant::{QuantAct, QuantMatrix};
use crate::Grad;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A linear layer's weight (OC, C) as in torch `Linear`, and optionally the bf16 copies that
/// inference reads with `--bf16` (see `Workspace::keep_bf16_weights`): its rows, which
/// decoding's matrix-vector products read (half the bytes from memory), and its bf16 tiles
/// (`bf16::pack_weight`), which longer forwards multiply without packing it again; or its
/// Q8_0/Q4_0 blocks (`--quant`), which every product then reads instead
/// (`kernels::quant`); or, in f32, its panels (`Workspace::keep_f32_panels`), which a batch's
/// decoding reads.
#[derive(Clone, Copy)]
pub struct Weight<'a> {
    pub f32: &'a [f32],
    pub bf16: Option<&'a [u16]>,
    pub tiles: Option<&'a [u16]>,
    pub quant: Option<&'a QuantMatrix>,
    /// the f32 weights in panels (`panels::pack`), which products of a few rows read
    pub panels: Option<&'a [f32]>,
}

impl<'a> From<&'a [f32]> for Weight<'a> {
    fn from(f32: &'a [f32]) -> Self {
        Weight {
            f32,
            bf16: None,
            tiles: None,
            quant: None,
            panels: None,
        }
    }
}

/// inp is (N, C), w is (OC, C); out (N, OC) = inp · wᵀ (or += with `accumulate`).
// llm.c's linear-layer signature (out, inp, w, N, C, OC), plus accumulate and precision
#[allow(clippy::too_many_arguments)]
pub fn matmul_forward<'a>(
    out: &mut [f32],
    inp: &[f32],
    w: impl Into<Weight<'a>>,
    n: usize,
    c: usize,
    oc: usize,
    accumulate: bool,
    precision: Precision,
) {
    let w = w.into();
    if let Some(q) = w.quant {
        assert!(q.rows == oc && q.cols == c && inp.len() >= n * c);
        let x = QuantAct::new(inp, n, c, q.kind);
        return crate::quant::matmul(out, &x, q, accumulate);
    }
    if n <= gemv_rows(&w) {
        return gemv(&[Gemv::new(out, inp, w, n, c, oc, accumulate)]);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(tiles), true) = (w.tiles, precision.is_bf16()) {
        assert!(
            out.len() >= n * oc && inp.len() >= n * c,
            "matmul_forward: too small"
        );
        let threads = threads_for(n, oc, c);
        let (x, w) = (
            Mat::rows(inp, c),
            super::bf16::PackedB::weight(tiles, oc, c),
        );
        let out = Out::new(out, oc, accumulate);
        return super::bf16::gemm_packed(Dims::new(n, oc, c), x, &w, out, threads);
    }
    let (x, w) = (Mat::rows(inp, c), Mat::t(w.f32, c));
    gemm(
        Dims::new(n, oc, c),
        x,
        w,
        Out::new(out, oc, accumulate),
        precision,
    );
}

/// out (N, OC) = inp (N, C) · wᵀ for each (out, w, OC) of `parts`, weights that read the same
/// input (q, k and v; gate and up). Decoding's matrix-vector products all run in one parallel
/// region, where one region per weight would wait for the slowest task three times; longer
/// inputs run as one f32 product whose B and C come in parts (`sgemm_parts`), so that the
/// input is packed once and the threads meet once; under bf16, one product after another.
pub fn matmul_forward_each(
    parts: &mut [(&mut [f32], Weight, usize)],
    inp: &[f32],
    n: usize,
    c: usize,
    precision: Precision,
) {
    // quantised weights of one kind: the input quantised once, every part in one region
    let kind_of = |p: &(&mut [f32], Weight, usize)| p.1.quant.map(|q| q.kind);
    let kind = parts.first().and_then(kind_of);
    if let Some(kind) = kind.filter(|_| parts.iter().all(|p| kind_of(p) == kind)) {
        let x = QuantAct::new(inp, n, c, kind);
        let mut qparts: Vec<(&mut [f32], &QuantMatrix)> = parts
            .iter_mut()
            .map(|(out, w, oc)| {
                let q = w.quant.expect("every part is quantised");
                assert!(q.rows == *oc && q.cols == c);
                (&mut **out, q)
            })
            .collect();
        let engine = crate::quant::Engine::detect();
        return crate::quant::matmul_on(engine, &mut qparts, &x, false);
    }
    if parts.len() <= GEMV_PARTS && parts.iter().all(|p| n <= gemv_rows(&p.1)) {
        // on the stack: a decoding step allocates nothing (tests/no_alloc.rs)
        let count = parts.len();
        let mut each = parts
            .iter_mut()
            .map(|(out, w, oc)| Gemv::new(out, inp, *w, n, c, *oc, false));
        let jobs: [Gemv; GEMV_PARTS] = std::array::from_fn(|_| {
            each.next()
                .unwrap_or_else(|| Gemv::new(&mut [], inp, (&[][..]).into(), n, c, 0, false))
        });
        return gemv(&jobs[..count]);
    }
    use super::cpu::Isa;
    use super::f32::{sgemm_parts, Part, MAX_PARTS};
    if let Some(isa) = Isa::detect().filter(|_| !precision.is_bf16() && parts.len() <= MAX_PARTS) {
        // (sgemm_parts checks that input, outputs and weights hold what it reads and writes)
        let (count, width) = (parts.len(), parts.iter().map(|p| p.2).sum());
        let mut each = parts
            .iter_mut()
            .map(|(out, w, oc)| Part::new(out, *oc, *oc, Mat::t(w.f32, c)));
        let cols: [Part; MAX_PARTS] = std::array::from_fn(|_| each.next().unwrap_or(Part::NONE));
        let (cols, threads) = (&cols[..count], threads_for(n, width, c));
        return sgemm_parts(isa, (n, c), Mat::rows(inp, c), cols, false, threads);
    }
    for (out, w, oc) in parts.iter_mut() {
        matmul_forward(out, inp, *w, n, c, *oc, false, precision);
    }
}

/// Up to this many input rows (decoding), a product is a few matrix-vector products: each weight
/// row is read once and dotted with every input row, with no packing.
const GEMV_ROWS: usize = 4;

/// 0, or the most rows that the server decodes at once (see `set_batch_invariant`).
static INVARIANT_ROWS: AtomicUsize = AtomicUsize::new(0);

/// With `rows` > 0, a product's every output is the same to the last bit whatever the number
/// of input rows beside its own, up to `rows` of them and beyond: products of f32 weights
/// with at most `max(rows, GRID_ROWS)` input rows all take the matrix-vector path's `dot_grid`
/// sums (each output summed in one order, however rows and outputs are grouped), and bf16
/// tiles always take the packed product (which sums each output in one order for any number
/// of rows). The server turns it on with its `--parallel`, so that a request's numbers do not
/// depend on how many others decode beside it; longer inputs (prefill chunks) take the packed
/// product as usual, which is deterministic for a given chunk. 0 turns it off. Process-wide.
pub fn set_batch_invariant(rows: usize) {
    INVARIANT_ROWS.store(rows, Ordering::Relaxed);
}

/// Whether products must give a row the same bits whatever rows run beside it.
fn invariant() -> bool {
    INVARIANT_ROWS.load(Ordering::Relaxed) > 0
}

/// Up to how many input rows a product with weight `w` takes the matrix-vector path.
fn gemv_rows(w: &Weight) -> usize {
    match INVARIANT_ROWS.load(Ordering::Relaxed) {
        0 if w.panels.is_some() => GRID_ROWS,
        0 => GEMV_ROWS,
        _ if w.tiles.is_some() => 0,
        rows => rows.max(GRID_ROWS),
    }
}

/// Up to this many rows `dot_grid` beats packing the weights for one product (f32, 1408 × 512
/// from memory, 2 threads: 94 against 61 GFLOP/s at 16 rows, 137 against 133 at 64; packing
/// wins from about 128), so that the server's short prefill chunks take it too.
pub const GRID_ROWS: usize = 64;

/// Most weights that `matmul_forward_each` runs in one matrix-vector region (q, k and v).
const GEMV_PARTS: usize = 4;

/// Weight rows per rayon task in `gemv`.
const GEMV_CHUNK: usize = 64;

/// A GEMV reads every weight once and is bound by memory bandwidth, which one core cannot
/// saturate: it splits across threads from a quarter of `PARALLEL_THRESHOLD` (diff_v2's K/V
/// projections at the bench preset, 128 × 256, ran on one thread and cost decode 15%).
const GEMV_PARALLEL_THRESHOLD: usize = PARALLEL_THRESHOLD / 4;

/// One matrix-vector product of decoding: out (n, oc) (+)= x (n, c) · wᵀ for few rows n
/// (`gemv_rows`), in tasks of GEMV_CHUNK outputs (`run`).
struct Gemv<'a> {
    out: crate::SharedMut,
    /// `out` stays borrowed while the tasks write it through the raw pointer.
    _out: std::marker::PhantomData<&'a mut [f32]>,
    x: &'a [f32],
    w: Weight<'a>,
    n: usize,
    c: usize,
    oc: usize,
    accumulate: bool,
}

impl<'a> Gemv<'a> {
    fn new(
        out: &'a mut [f32],
        x: &'a [f32],
        w: Weight<'a>,
        n: usize,
        c: usize,
        oc: usize,
        accumulate: bool,
    ) -> Self {
        assert!(out.len() >= n * oc && x.len() >= n * c);
        assert!(w.f32.len() >= oc * c, "matmul_forward: weight too small");
        Gemv {
            out: crate::SharedMut::new(out),
            _out: std::marker::PhantomData,
            x,
            w,
            n,
            c,
            oc,
            accumulate,
        }
    }

    fn tasks(&self) -> usize {
        self.oc.div_ceil(GEMV_CHUNK)
    }

    /// Outputs ti·GEMV_CHUNK.. of every row. The weight's form picks the kernel: its bf16 tiles
    /// (`--bf16`, at most GEMV_ROWS rows), its f32 panels (several rows, or a lone one that a
    /// batch must match), f32 rows in `dot_grid` blocks, else a dot per output over its bf16 or
    /// f32 row.
    fn run(&self, ti: usize) {
        let outs = ti * GEMV_CHUNK..((ti + 1) * GEMV_CHUNK).min(self.oc);
        #[cfg(target_arch = "x86_64")]
        let (x, n, c) = (self.x, self.n, self.c);
        #[cfg(target_arch = "x86_64")]
        if let Some(tiles) = self.w.tiles {
            assert!(n <= GEMV_ROWS);
            // SAFETY: AVX-512F is present wherever tiles exist.
            return self.blocks16(outs, |o0, _| unsafe {
                super::bf16::tile_row_sums(x, tiles, o0, n, c)
            });
        }
        // (a lone row keeps `lone_row`'s streaming where no batch must match it)
        if let Some(p) = self.w.panels.filter(|_| self.n > 1 || invariant()) {
            return self.panel_rows(outs, p);
        }
        #[cfg(target_arch = "x86_64")]
        if self.w.bf16.is_none() && super::cpu::avx512f() {
            return self.grid(outs);
        }
        match self.w.bf16 {
            Some(wb) => self.dots(outs, wb, crate::dot_bf16),
            None => self.dots(outs, self.w.f32, crate::dot),
        }
    }

    /// The outputs `outs` of every row, sixteen outputs at a time, each block in `dot_grid`s:
    /// four rows by four outputs while four rows are left (each weight row read once for
    /// four input rows), then two by eight or one by sixteen. Rows and outputs past the end
    /// repeat the last one, and their sums are dropped. From four rows, the block's row
    /// groups share fetching the next block's weights as they go, each a quarter (`Ahead`),
    /// also where the next block is the next task's (at the task's end, which the same
    /// worker most often runs next: left to the hardware, every task's first block came
    /// cold from memory; with both, f32 decoding at `medium` and 16 rows 1.12×).
    #[cfg(target_arch = "x86_64")]
    fn grid(&self, outs: Range<usize>) {
        if self.n == 1 {
            return self.lone_row(outs);
        }
        for o0 in outs.clone().step_by(16) {
            let h = 16.min(outs.end - o0);
            // (a lone row is bound by memory, and the hardware's prefetching serves it better)
            let ahead = if o0 + 16 < self.oc && self.n >= 4 {
                16 * self.c
            } else {
                0
            };
            let groups = self.n.div_ceil(4).min(4);
            let (mut r0, mut group) = (0, 0);
            while r0 < self.n {
                let ahead = Ahead {
                    values: ahead,
                    group: group % groups,
                    groups,
                };
                r0 += match self.n - r0 {
                    1 => self.grid_block::<1, 16>(r0, o0, h, ahead),
                    2 => self.grid_block::<2, 8>(r0, o0, h, ahead),
                    _ => self.grid_block::<4, 4>(r0, o0, h, ahead),
                };
                group += 1;
            }
        }
    }

    /// Rows r0..r0 + R by outputs o0..o0 + h, O outputs at a time; returns the rows done.
    /// The weight rows `ahead.values` on are fetched as it goes, for its share of them.
    #[cfg(target_arch = "x86_64")]
    fn grid_block<const R: usize, const O: usize>(
        &self,
        r0: usize,
        o0: usize,
        h: usize,
        ahead: Ahead,
    ) -> usize {
        let (n, c, w) = (self.n, self.c, self.w.f32);
        let rows = R.min(n - r0);
        let xs = std::array::from_fn(|i| self.x[(r0 + i).min(n - 1) * c..].as_ptr());
        for s in (0..h).step_by(O) {
            let ws = std::array::from_fn(|j| w[(o0 + (s + j).min(h - 1)) * c..].as_ptr());
            let mut sums = [0f32; 16];
            // SAFETY: AVX-512F was detected (`run`); every row pointer has c values in bounds
            // (rows < n of x, outputs < oc of w: `Gemv::new`).
            unsafe {
                let v = crate::dot_grid::<R, O, f32>(xs, ws, c, ahead.at(s));
                std::arch::x86_64::_mm512_storeu_ps(sums.as_mut_ptr(), v);
            }
            for i in 0..rows {
                for j in 0..O.min(h - s) {
                    // SAFETY: output o0 + s + j belongs to this task alone.
                    let y = unsafe { self.out.slice((r0 + i) * self.oc + o0 + s + j, 1) };
                    let v = sums[i * O + j];
                    y[0] = if self.accumulate { y[0] + v } else { v };
                }
            }
        }
        rows
    }

    /// `grid` for one input row: an output at a time (`dot_tree`, each summed as `dot_grid`
    /// sums it), so that a lone sequence streams one weight row at a time, start to end (at
    /// `medium`, 2 threads: 1.17× the one by sixteen blocks at depth 0, 1.2× at `large`),
    /// asking for the weights ahead as it goes (`prefetch_stream`).
    #[cfg(target_arch = "x86_64")]
    fn lone_row(&self, outs: Range<usize>) {
        let (c, w) = (self.c, self.w.f32);
        // SAFETY: outputs `outs` belong to this task alone.
        let y = unsafe { self.out.slice(outs.start, outs.len()) };
        for (y, o) in y.iter_mut().zip(outs) {
            // SAFETY: AVX-512F was detected (`run`); x holds c values, and weight row o < oc
            // c values in bounds (`Gemv::new`).
            let [[v]] = unsafe {
                crate::dot_tree::<1, 1, 0, &[f32]>(&self.x[..c], [&w[o * c..][..c]], true)
            };
            *y = if self.accumulate { *y + v } else { v };
        }
    }

    /// The outputs `outs` (whole panels but the matrix's last) from the weights' panels, up to
    /// `PANEL_ROWS` rows a pass over each panel. With the panels in huge pages (one buffer,
    /// `F32Panels`), a lone row streams them as fast as `lone_row` streams the weights' rows
    /// (each panel in small pages of its own: 0.7× at `medium`).
    fn panel_rows(&self, outs: Range<usize>, p: &[f32]) {
        use super::panels::{rows, PANEL, PANEL_ROWS};
        use crate::NextLines;
        let (n, c) = (self.n, self.c);
        let passes = n.div_ceil(PANEL_ROWS);
        for o0 in outs.step_by(PANEL) {
            let panel = &p[o0 * c..][..PANEL * c];
            let h = PANEL.min(self.oc - o0);
            // With two passes or more over a panel, the passes after the first reread it from
            // cache while the memory would idle: each pass fetches its share of the next panel
            // (the next task's after the task's last, which this worker most often runs next).
            let following = (passes > 1 && o0 + PANEL < self.oc)
                .then(|| p.as_ptr().wrapping_add((o0 + PANEL) * c));
            for (pass, r0) in (0..n).step_by(PANEL_ROWS).enumerate() {
                let x = &self.x[r0 * c..];
                // (16 f32 a cache line)
                let next = following.map_or(NextLines::NONE, |f| {
                    NextLines::share(f, PANEL * c / 16, pass, passes)
                });
                match n - r0 {
                    1 => self.put(r0, o0, h, &rows::<1>(x, c, panel, next)),
                    2 => self.put(r0, o0, h, &rows::<2>(x, c, panel, next)),
                    3 => self.put(r0, o0, h, &rows::<3>(x, c, panel, next)),
                    4 => self.put(r0, o0, h, &rows::<4>(x, c, panel, next)),
                    5 => self.put(r0, o0, h, &rows::<5>(x, c, panel, next)),
                    6 => self.put(r0, o0, h, &rows::<6>(x, c, panel, next)),
                    7 => self.put(r0, o0, h, &rows::<7>(x, c, panel, next)),
                    _ => self.put(r0, o0, h, &rows::<PANEL_ROWS>(x, c, panel, next)),
                }
            }
        }
    }

    /// Stores (or adds) the first `h` sums of each row of `sums` at rows r0.. and outputs o0...
    fn put(&self, r0: usize, o0: usize, h: usize, sums: &[[f32; super::panels::PANEL]]) {
        for (i, s) in sums.iter().enumerate() {
            // SAFETY: outputs o0..o0 + h of every row belong to this task alone.
            let y = unsafe { self.out.slice((r0 + i) * self.oc + o0, h) };
            for (y, &v) in y.iter_mut().zip(s) {
                *y = if self.accumulate { *y + v } else { v };
            }
        }
    }

    /// The outputs `outs`, one `dot` of a weight row (f32 or bf16) per output and input row.
    fn dots<T>(&self, outs: Range<usize>, w: &[T], dot: impl Fn(&[f32], &[T]) -> f32) {
        let (n, c, oc) = (self.n, self.c, self.oc);
        for o in outs {
            let row = &w[o * c..(o + 1) * c];
            for r in 0..n {
                let v = dot(&self.x[r * c..(r + 1) * c], row);
                // SAFETY: output o belongs to this task alone.
                let y = unsafe { self.out.slice(r * oc + o, 1) };
                y[0] = if self.accumulate { y[0] + v } else { v };
            }
        }
    }

    /// The outputs `outs` sixteen at a time: `sums(o0, h)` gives one register per input row
    /// for outputs o0..o0 + h, stored (or added) into out.
    #[cfg(target_arch = "x86_64")]
    fn blocks16(
        &self,
        outs: Range<usize>,
        sums: impl Fn(usize, usize) -> [std::arch::x86_64::__m512; 4],
    ) {
        use std::arch::x86_64::*;
        for o0 in outs.clone().step_by(16) {
            let h = 16.min(outs.end - o0);
            let y = sums(o0, h);
            let m = crate::lane_mask(h);
            for (r, y) in y.iter().enumerate().take(self.n) {
                // SAFETY: AVX-512F is present (the callers checked); outputs o0..o0+h of row r
                // are in bounds (Gemv::new) and belong to this task alone.
                unsafe {
                    let o = self.out.ptr(r * self.oc + o0, h);
                    let v = if self.accumulate {
                        _mm512_add_ps(*y, _mm512_maskz_loadu_ps(m, o))
                    } else {
                        *y
                    };
                    _mm512_mask_storeu_ps(o, m, v);
                }
            }
        }
    }
}

/// Which of the next block's weight rows a group of input rows fetches as it reads this block:
/// the four-row runs u with u mod `groups` = `group`, so that the block's groups (up to four)
/// each fetch a quarter, spread over the block's time (one group fetching all of it asked
/// for more than the memory delivers in its share of the time).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Ahead {
    /// values from a weight row to its row in the next block; 0: fetch nothing
    values: usize,
    group: usize,
    groups: usize,
}

#[cfg(target_arch = "x86_64")]
impl Ahead {
    /// The distance `dot_grid` fetches at for the outputs from s of a block, 0 if not this
    /// group's.
    fn at(self, s: usize) -> usize {
        if (s / 4) % self.groups == self.group {
            self.values
        } else {
            0
        }
    }
}

/// Runs every task of `jobs`, across the pool when they read enough weights to need more than
/// one core's memory bandwidth.
fn gemv(jobs: &[Gemv]) {
    let tasks: usize = jobs.iter().map(Gemv::tasks).sum();
    let run = |mut t: usize| {
        for j in jobs {
            if t < j.tasks() {
                return j.run(t);
            }
            t -= j.tasks();
        }
    };
    let weights: usize = jobs.iter().map(|j| j.oc * j.c).sum();
    if tasks > 1 && weights >= GEMV_PARALLEL_THRESHOLD {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// dinp (N, C) = (or +=) dout · w, and accumulates dw (OC, C) += doutᵀ · inp.
// llm.c's linear-layer signature (dinp, dw, dout, inp, w, N, C, OC), plus precision
#[allow(clippy::too_many_arguments)]
pub fn matmul_backward(
    dinp: Grad,
    dw: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    w: &[f32],
    n: usize,
    c: usize,
    oc: usize,
    precision: Precision,
) {
    let (dinp, accumulate) = dinp.parts();
    let (dout_rows, w) = (Mat::rows(dout, oc), Mat::rows(w, c));
    gemm(
        Dims::new(n, c, oc),
        dout_rows,
        w,
        Out::new(dinp, c, accumulate),
        precision,
    );
    let (dout_t, inp) = (Mat::t(dout, oc), Mat::rows(inp, c));
    gemm(Dims::new(oc, c, n), dout_t, inp, Out::add(dw, c), precision);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_naive_triple_loop() {
        for (n, c, oc) in [
            (37, 19, 23),
            (1, 300, 200),
            (3, 40, 130),
            (1, 17, 35),
            (1, 5, 3),
        ] {
            check_matmul(n, c, oc);
        }
    }

    /// The matrix-vector path gives each row the same bits whether it is multiplied alone or
    /// among up to 21 others (what the server's batch invariance rests on).
    #[test]
    fn matrix_vector_rows_get_the_same_bits_alone_or_in_a_batch() {
        rows_alone_or_in_a_batch(&[2, 3, 4, 5, 7, 16, 22], |w, xs, out, n, c, oc, acc, _| {
            gemv(&[Gemv::new(out, xs, w.into(), n, c, oc, acc)])
        });
    }

    /// With the weights also in panels, a batch's rows (2 to 22) take the panel products and
    /// get the bits a lone row gets from the panels (the server's lone row, under
    /// `set_batch_invariant`).
    #[test]
    fn panel_rows_get_the_same_bits_alone_or_in_a_batch() {
        rows_alone_or_in_a_batch(
            &[2, 3, 7, 8, 9, 16, 22],
            |w, xs, out, n, c, oc, acc, alone| {
                let p = super::super::panels::pack(w, oc, c);
                let weight = Weight {
                    panels: Some(&p),
                    ..Weight::from(w)
                };
                let g = Gemv::new(out, xs, weight, n, c, oc, acc);
                match alone {
                    // through the panels task by task, not `gemv`'s dispatch
                    true => (0..g.tasks()).for_each(|t| {
                        g.panel_rows(t * GEMV_CHUNK..((t + 1) * GEMV_CHUNK).min(oc), &p)
                    }),
                    false => gemv(&[g]),
                }
            },
        );
    }

    /// Each of 22 rows gets the same bits from `product(w, rows, out, n, c, oc, accumulate,
    /// alone)` alone as among the first n rows for each n of `batches`, over ragged widths
    /// (tails of the 16-column blocks, of the 16- and 32-output blocks, of the 64-output tasks)
    /// and with accumulation; and the sums are right (against f64).
    fn rows_alone_or_in_a_batch(
        batches: &[usize],
        product: impl Fn(&[f32], &[f32], &mut [f32], usize, usize, usize, bool, bool),
    ) {
        use crate::testutil::randn;
        for (c, oc) in [(37, 70), (512, 130), (16, 17), (100, 3), (1, 64)] {
            let (w, x, base) = (
                randn(oc * c, 1, 1.0),
                randn(22 * c, 2, 1.0),
                randn(22 * oc, 3, 1.0),
            );
            for accumulate in [false, true] {
                let run = |rows: std::ops::Range<usize>, alone: bool| {
                    let n = rows.len();
                    let mut out = base[rows.start * oc..rows.end * oc].to_vec();
                    let xs = &x[rows.start * c..rows.end * c];
                    product(&w, xs, &mut out, n, c, oc, accumulate, alone);
                    out
                };
                let alone: Vec<f32> = (0..22).flat_map(|r| run(r..r + 1, true)).collect();
                for &n in batches {
                    assert_eq!(run(0..n, false), alone[..n * oc], "c {c} oc {oc} n {n}");
                }
                for (i, &y) in alone.iter().enumerate() {
                    let (r, o) = (i / oc, i % oc);
                    let dot: f64 = (0..c)
                        .map(|k| x[r * c + k] as f64 * w[o * c + k] as f64)
                        .sum();
                    let want = dot + if accumulate { base[i] as f64 } else { 0.0 };
                    assert!((y as f64 - want).abs() < 1e-4 * (1.0 + c as f64).sqrt());
                }
            }
        }
    }

    /// Weights that share an input give, together, the bits each gives alone: decoding's
    /// single parallel region (n ≤ GEMV_ROWS, here large enough to run in parallel, with
    /// ragged chunks) and longer inputs (one product in parts of ragged widths, over several
    /// row blocks and threads, and past one KC slice of depth) alike; stale outputs are
    /// overwritten.
    #[test]
    fn products_sharing_an_input_match_each_alone() {
        for (c, n) in [(100, 1), (100, 3), (100, 9), (100, 300), (300, 250)] {
            products_sharing_an_input(c, n);
        }
    }

    fn products_sharing_an_input(c: usize, n: usize) {
        let ocs = [70, 130, 35];
        let ws: Vec<Vec<f32>> = ocs
            .iter()
            .enumerate()
            .map(|(i, &oc)| {
                (0..oc * c)
                    .map(|j| ((j * 7 + i) % 17) as f32 - 8.0)
                    .collect()
            })
            .collect();
        let inp: Vec<f32> = (0..n * c).map(|i| ((i * 5) % 13) as f32 / 4.0).collect();
        let mut outs: Vec<Vec<f32>> = ocs.iter().map(|&oc| vec![7.0; n * oc]).collect();
        let [a, b, d] = &mut outs[..] else {
            unreachable!()
        };
        matmul_forward_each(
            &mut [
                (&mut a[..], Weight::from(&ws[0][..]), ocs[0]),
                (&mut b[..], Weight::from(&ws[1][..]), ocs[1]),
                (&mut d[..], Weight::from(&ws[2][..]), ocs[2]),
            ],
            &inp,
            n,
            c,
            Precision::F32,
        );
        for ((got, w), &oc) in outs.iter().zip(&ws).zip(&ocs) {
            let mut want = vec![0.0; n * oc];
            matmul_forward(&mut want, &inp, &w[..], n, c, oc, false, Precision::F32);
            assert_eq!(got, &want, "n {n}, oc {oc}");
        }
    }

    /// A part whose dst is shorter than its rows reach is refused before the kernel's raw
    /// pointers write anything.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[should_panic(expected = "sgemm:")]
    fn a_part_too_small_for_its_rows_is_refused() {
        use crate::gemm::{
            cpu::Isa,
            f32::{sgemm_parts, Part},
        };
        let (m, k, n) = (20, 8, 16);
        let (a, b) = (vec![1.0; m * k], vec![1.0; k * n]);
        let mut short = vec![0.0; (m - 1) * n];
        let part = Part::new(&mut short, n, n, Mat::rows(&b, n));
        // (a CPU with no kernel is refused by the same assert's "sgemm: the CPU has no")
        let isa = Isa::detect().unwrap_or(Isa::Avx2);
        sgemm_parts(isa, (m, k), Mat::rows(&a, k), &[part], false, 1);
    }

    /// Parts with row-major B packed in parallel from one KC slice: the pass is cut into two
    /// groups of column panels, the cut falling inside the second part, and each part's rows
    /// are read across all of its panels at once. Every part matches its own product.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn parts_packed_in_column_groups_match_each_product() {
        use crate::gemm::{
            cpu::Isa,
            f32::{sgemm_parts, Part},
        };
        let (m, k) = (50, 200);
        let widths = [70, 130, 35];
        let a: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        let bs: Vec<Vec<f32>> = widths
            .iter()
            .map(|&n| {
                (0..k * n)
                    .map(|i| ((i * 53 % 89) as f32 - 44.0) / 44.0)
                    .collect()
            })
            .collect();
        for (isa, threads) in Isa::available_all().flat_map(|i| [(i, 1), (i, 2)]) {
            let mut outs: Vec<Vec<f32>> = widths.iter().map(|&n| vec![0.0; m * n]).collect();
            let [o0, o1, o2] = &mut outs[..] else {
                unreachable!()
            };
            let parts = [
                Part::new(o0, widths[0], widths[0], Mat::rows(&bs[0], widths[0])),
                Part::new(o1, widths[1], widths[1], Mat::rows(&bs[1], widths[1])),
                Part::new(o2, widths[2], widths[2], Mat::rows(&bs[2], widths[2])),
            ];
            sgemm_parts(isa, (m, k), Mat::rows(&a, k), &parts, false, threads);
            for ((out, b), &n) in outs.iter().zip(&bs).zip(&widths) {
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                            .sum();
                        let got = out[i * n + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{isa:?} {threads} threads, width {n} ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    fn check_matmul(n: usize, c: usize, oc: usize) {
        let inp: Vec<f32> = (0..n * c).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let w: Vec<f32> = (0..oc * c).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let mut out = vec![1.0; n * oc];
        matmul_forward(&mut out, &inp, &w[..], n, c, oc, true, Precision::F32);
        for i in 0..n {
            for o in 0..oc {
                let r: f32 = (0..c).map(|j| inp[i * c + j] * w[o * c + j]).sum();
                assert_eq!(out[i * oc + o], 1.0 + r);
            }
        }
    }
}

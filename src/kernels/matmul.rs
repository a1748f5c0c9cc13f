//! Linear layers. Every matrix product in difftx goes through `sgemm`: our own AVX-512 kernel
//! (kernels/sgemm_avx512.rs) where the CPU has it, else the `gemm` crate; with
//! `Precision::Bf16` (an AVX512_BF16 CPU), bf16 operands (kernels/bf16.rs: AMX tiles or
//! VDPBF16PS).

pub use super::precision::{bf16_available, Precision};
use super::Grad;
use gemm::Parallelism;
use rayon::prelude::*;
use std::ops::Range;

/// Products smaller than this many multiply-adds run on one thread.
const PARALLEL_THRESHOLD: usize = 1 << 16;

/// A strided matrix operand: element (i, j) is at `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major (rows, cols) matrix.
    pub fn rows(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major matrix with `cols` columns.
    pub fn t(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }
    /// This matrix transposed: the same elements, strides swapped.
    pub fn transposed(self) -> Self {
        Mat {
            data: self.data,
            rs: self.cs,
            cs: self.rs,
        }
    }
    /// The matrix from element (r, c) on.
    pub fn from(self, r: usize, c: usize) -> Self {
        Mat {
            data: &self.data[r * self.rs + c * self.cs..],
            ..self
        }
    }
    /// Whether `data` holds every element of a (rows, cols) matrix at these strides.
    pub fn fits(&self, rows: usize, cols: usize) -> bool {
        self.data.len() >= extent(rows, cols, self.rs, self.cs)
    }
}

/// How many elements a (rows, cols) matrix at strides rs, cs spans from its first.
pub(crate) fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// Threads a product of m·n·k multiply-adds is split over.
fn threads_for(m: usize, n: usize, k: usize) -> usize {
    if m * n * k < PARALLEL_THRESHOLD {
        1
    } else {
        rayon::current_num_threads()
    }
}

/// Which implementation runs a product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// always the `gemm` crate (for comparison)
    GemmCrate,
    /// f32 on difftx's AVX-512 kernel where the CPU has AVX-512F, else the `gemm` crate
    F32,
    /// bf16 where the CPU has AVX512_BF16 (else as `F32`)
    Bf16,
}

impl From<Precision> for Backend {
    fn from(p: Precision) -> Backend {
        match p {
            Precision::F32 => Backend::F32,
            Precision::Bf16 => Backend::Bf16,
        }
    }
}

/// dst (m, n), row-major with row stride `dst_rs`: dst = a (m, k) · b (k, n), or dst += a · b,
/// with operands in `precision`.
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    a: Mat,
    b: Mat,
    precision: Precision,
) {
    sgemm_with(precision.into(), m, n, k, dst, dst_rs, accumulate, a, b)
}

/// `sgemm` on a chosen backend.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with(
    backend: Backend,
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    a: Mat,
    b: Mat,
) {
    assert!(dst.len() >= extent(m, n, dst_rs, 1), "sgemm: dst too small");
    assert!(a.fits(m, k), "sgemm: lhs too small");
    assert!(b.fits(k, n), "sgemm: rhs too small");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                dst[i * dst_rs..i * dst_rs + n].fill(0.0);
            }
        }
        return;
    }
    let threads = threads_for(m, n, k);
    #[cfg(target_arch = "x86_64")]
    if backend == Backend::Bf16 && super::bf16::available() {
        super::bf16::gemm(m, n, k, dst, dst_rs, accumulate, a, b, threads);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if backend != Backend::GemmCrate && super::sgemm_avx512::available() {
        super::sgemm_avx512::sgemm(m, n, k, dst, dst_rs, accumulate, a, b, threads);
        return;
    }
    let par = if threads == 1 {
        Parallelism::None
    } else {
        Parallelism::Rayon(rayon::current_num_threads())
    };
    // SAFETY: the asserts above bound every index the strides reach inside the slices, and
    // `dst` is borrowed mutably so it cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// A linear layer's weight (OC, C) as in torch `Linear`, and optionally the bf16 copies that
/// inference reads with `--bf16` (see `Workspace::keep_bf16_weights`): its rows, which
/// decoding's matrix-vector products read (half the bytes from memory), and its bf16 tiles
/// (`bf16::pack_weight`), which longer forwards multiply without packing it again.
#[derive(Clone, Copy)]
pub struct Weight<'a> {
    pub f32: &'a [f32],
    pub bf16: Option<&'a [u16]>,
    pub tiles: Option<&'a [u16]>,
}

impl<'a> From<&'a [f32]> for Weight<'a> {
    fn from(f32: &'a [f32]) -> Self {
        Weight {
            f32,
            bf16: None,
            tiles: None,
        }
    }
}

/// inp is (N, C), w is (OC, C); out (N, OC) = inp · wᵀ (or += with `accumulate`).
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
    if n <= GEMV_ROWS {
        return gemv(&[Gemv::new(out, inp, w, n, c, oc, accumulate)]);
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(tiles), true) = (w.tiles, precision.is_bf16()) {
        assert!(
            out.len() >= n * oc && inp.len() >= n * c,
            "matmul_forward: too small"
        );
        let threads = threads_for(n, oc, c);
        let x = Mat::rows(inp, c);
        return super::bf16::gemm_packed(n, oc, c, out, oc, accumulate, x, tiles, threads);
    }
    sgemm(
        n,
        oc,
        c,
        out,
        oc,
        accumulate,
        Mat::rows(inp, c),
        Mat::t(w.f32, c),
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
    if n <= GEMV_ROWS {
        let jobs: Vec<Gemv> = parts
            .iter_mut()
            .map(|(out, w, oc)| Gemv::new(out, inp, *w, n, c, *oc, false))
            .collect();
        return gemv(&jobs);
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::sgemm_avx512::{sgemm_parts, Part, MAX_PARTS};
        if !precision.is_bf16() && parts.len() <= MAX_PARTS && super::sgemm_avx512::available() {
            // (sgemm_parts checks that input, outputs and weights hold what it reads and writes)
            let (count, width) = (parts.len(), parts.iter().map(|p| p.2).sum());
            let mut each = parts
                .iter_mut()
                .map(|(out, w, oc)| Part::new(out, *oc, *oc, Mat::t(w.f32, c)));
            let cols: [Part; MAX_PARTS] =
                std::array::from_fn(|_| each.next().unwrap_or(Part::NONE));
            let (cols, threads) = (&cols[..count], threads_for(n, width, c));
            return sgemm_parts(n, c, Mat::rows(inp, c), cols, false, threads);
        }
    }
    for (out, w, oc) in parts.iter_mut() {
        matmul_forward(out, inp, *w, n, c, *oc, false, precision);
    }
}

/// Up to this many input rows (decoding), a product is a few matrix-vector products: each weight
/// row is read once and dotted with every input row, with no packing.
const GEMV_ROWS: usize = 4;

/// Weight rows per rayon task in `gemv`.
const GEMV_CHUNK: usize = 64;

/// A GEMV reads every weight once and is bound by memory bandwidth, which one core cannot
/// saturate: it splits across threads from a quarter of `PARALLEL_THRESHOLD` (diff_v2's K/V
/// projections at the bench preset, 128 × 256, ran on one thread and cost decode 15%).
const GEMV_PARALLEL_THRESHOLD: usize = PARALLEL_THRESHOLD / 4;

/// One matrix-vector product of decoding: out (n, oc) (+)= x (n, c) · wᵀ for n ≤ GEMV_ROWS, in
/// tasks of GEMV_CHUNK outputs (`run`).
struct Gemv<'a> {
    out: super::SharedMut,
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
        assert!(n <= GEMV_ROWS && out.len() >= n * oc && x.len() >= n * c);
        assert!(w.f32.len() >= oc * c, "matmul_forward: weight too small");
        Gemv {
            out: super::SharedMut::new(out),
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
    /// (`--bf16`), f32 rows sixteen at a time for one input row, else a dot per output
    /// over its bf16 or f32 row.
    fn run(&self, ti: usize) {
        let outs = ti * GEMV_CHUNK..((ti + 1) * GEMV_CHUNK).min(self.oc);
        let (x, n, c) = (self.x, self.n, self.c);
        #[cfg(target_arch = "x86_64")]
        if let Some(tiles) = self.w.tiles {
            // SAFETY: AVX-512F is present wherever tiles exist.
            return self.blocks16(outs, |o0, _| unsafe {
                super::bf16::tile_row_sums(x, tiles, o0, n, c)
            });
        }
        #[cfg(target_arch = "x86_64")]
        if n == 1 && self.w.bf16.is_none() && super::sgemm_avx512::available() {
            use std::arch::x86_64::_mm512_setzero_ps;
            let w = self.w.f32;
            // SAFETY: AVX-512F was detected; rows o0..o0+h of w are in bounds (Gemv::new).
            return self.blocks16(outs, |o0, h| unsafe {
                let z = _mm512_setzero_ps();
                [
                    super::dot_rows16(&x[..c], w.as_ptr().add(o0 * c), c, h),
                    z,
                    z,
                    z,
                ]
            });
        }
        match self.w.bf16 {
            Some(wb) => self.dots(outs, wb, super::dot_bf16),
            None => self.dots(outs, self.w.f32, super::dot),
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
            let m = super::lane_mask(h);
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
    sgemm(
        n,
        c,
        oc,
        dinp,
        c,
        accumulate,
        Mat::rows(dout, oc),
        Mat::rows(w, c),
        precision,
    );
    let (dout_t, inp) = (Mat::t(dout, oc), Mat::rows(inp, c));
    sgemm(oc, c, n, dw, c, true, dout_t, inp, precision);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every layout the model uses (plain, transposed lhs, transposed rhs), ragged edges in
    /// all three dimensions, depth past one packed slice, threaded and accumulating.
    #[test]
    fn sgemm_matches_f64_reference_for_all_layouts_and_edges() {
        let shapes = [
            (1, 1, 1),
            (13, 31, 7),
            (29, 33, 300),
            (150, 70, 530),
            (64, 96, 64),
            // ragged last row panels of 4 and 5-6 rows, with full and narrow (≤ 16) column panels
            (18, 40, 20),
            (47, 17, 30),
            (48, 10, 30),
            // packs B in parallel (kc·n ≥ 2^15): by slices, and one slice by column groups
            (40, 200, 300),
            (40, 200, 200),
            // wider than one pass of packed B holds (32 panels): a pass per KC slice
            (30, 1100, 300),
            // deep and short: the depth is split across the threads, with a ragged last slice
            (40, 33, 1100),
        ];
        for (m, n, k) in shapes {
            let a: Vec<f32> = (0..m * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect();
            let b: Vec<f32> = (0..k * n)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 44.0)
                .collect();
            let mut want = vec![0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] = (0..k)
                        .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                        .sum();
                }
            }
            // the same matrices stored transposed
            let at: Vec<f32> = (0..k * m).map(|idx| a[(idx % m) * k + idx / m]).collect();
            let bt: Vec<f32> = (0..n * k).map(|idx| b[(idx % k) * n + idx / k]).collect();
            let lhs = [Mat::rows(&a, k), Mat::t(&at, m)];
            let rhs = [Mat::rows(&b, n), Mat::t(&bt, k)];
            for (li, l) in lhs.iter().enumerate() {
                for (ri, r) in rhs.iter().enumerate() {
                    // accumulating onto 0.5, or overwriting it
                    for (acc, base) in [(true, 0.5), (false, 0.0)] {
                        let mut out = vec![0.5f32; m * (n + 3)];
                        sgemm(m, n, k, &mut out, n + 3, acc, *l, *r, Precision::F32);
                        for i in 0..m {
                            for j in 0..n + 3 {
                                let got = out[i * (n + 3) + j] as f64;
                                let exp = if j < n { base + want[i * n + j] } else { 0.5 };
                                assert!(
                                    (got - exp).abs() < 1e-4 * (1.0 + exp.abs()),
                                    "{m}x{n}x{k} lhs{li} rhs{ri} acc {acc} ({i},{j}): {got} vs {exp}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

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
        use crate::kernels::sgemm_avx512::{sgemm_parts, Part};
        let (m, k, n) = (20, 8, 16);
        let (a, b) = (vec![1.0; m * k], vec![1.0; k * n]);
        let mut short = vec![0.0; (m - 1) * n];
        let part = Part::new(&mut short, n, n, Mat::rows(&b, n));
        sgemm_parts(m, k, Mat::rows(&a, k), &[part], false, 1);
    }

    /// Parts with row-major B packed in parallel from one KC slice: the pass is cut into two
    /// groups of column panels, the cut falling inside the second part, and each part's rows
    /// are read across all of its panels at once. Every part matches its own product.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn parts_packed_in_column_groups_match_each_product() {
        use crate::kernels::sgemm_avx512::{available, sgemm_parts, Part};
        if !available() {
            return;
        }
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
        for threads in [1, 2] {
            let mut outs: Vec<Vec<f32>> = widths.iter().map(|&n| vec![0.0; m * n]).collect();
            let [o0, o1, o2] = &mut outs[..] else {
                unreachable!()
            };
            let parts = [
                Part::new(o0, widths[0], widths[0], Mat::rows(&bs[0], widths[0])),
                Part::new(o1, widths[1], widths[1], Mat::rows(&bs[1], widths[1])),
                Part::new(o2, widths[2], widths[2], Mat::rows(&bs[2], widths[2])),
            ];
            sgemm_parts(m, k, Mat::rows(&a, k), &parts, false, threads);
            for ((out, b), &n) in outs.iter().zip(&bs).zip(&widths) {
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                            .sum();
                        let got = out[i * n + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "{threads} threads, width {n} ({i},{j}): {got} vs {want}"
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

//! Linear layers over the product engine (`super::gemm`), llm.c's `matmul_forward` and
//! `matmul_backward`; decoding's few-row products are matrix-vector products here (`Gemv`),
//! with no packing.

use super::{gemm, threads_for, Dims, Mat, Out, Precision, PARALLEL_THRESHOLD};
use crate::kernels::quant::{QuantAct, QuantMatrix};
use crate::kernels::Grad;
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

/// A linear layer's weight (OC, C) as in torch `Linear`, and optionally the bf16 copies that
/// inference reads with `--bf16` (see `Workspace::keep_bf16_weights`): its rows, which
/// decoding's matrix-vector products read (half the bytes from memory), and its bf16 tiles
/// (`bf16::pack_weight`), which longer forwards multiply without packing it again; or its
/// Q8_0/Q4_0 blocks (`--quant`), which every product then reads instead
/// (`kernels::quant`).
#[derive(Clone, Copy)]
pub struct Weight<'a> {
    pub f32: &'a [f32],
    pub bf16: Option<&'a [u16]>,
    pub tiles: Option<&'a [u16]>,
    pub quant: Option<&'a QuantMatrix>,
}

impl<'a> From<&'a [f32]> for Weight<'a> {
    fn from(f32: &'a [f32]) -> Self {
        Weight {
            f32,
            bf16: None,
            tiles: None,
            quant: None,
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
        return crate::kernels::quant::matmul(out, &x, q, accumulate);
    }
    if n <= gemv_rows() {
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
        let engine = crate::kernels::quant::Engine::detect();
        return crate::kernels::quant::matmul_on(engine, &mut qparts, &x, false);
    }
    if n <= gemv_rows() {
        let jobs: Vec<Gemv> = parts
            .iter_mut()
            .map(|(out, w, oc)| Gemv::new(out, inp, *w, n, c, *oc, false))
            .collect();
        return gemv(&jobs);
    }
    #[cfg(target_arch = "x86_64")]
    {
        use super::f32_avx512::{sgemm_parts, Part, MAX_PARTS};
        if !precision.is_bf16() && parts.len() <= MAX_PARTS && super::cpu::avx512f() {
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

/// Whether products of few rows take the matrix-vector path (see `set_batch_invariant`).
static GEMV_ON: AtomicBool = AtomicBool::new(true);

/// With `on`, every product runs as the packed one, whatever its number of rows: a row's
/// output is then the same to the last bit whether it is multiplied alone or with others
/// (the packed product sums each output in the same order for any number of rows, while the
/// matrix-vector path sums in another order). The server turns it on, so that a request's
/// numbers do not depend on how many others decode beside it; it costs single-sequence decode
/// speed (the weights are packed on every product). Process-wide.
pub fn set_batch_invariant(on: bool) {
    GEMV_ON.store(!on, Ordering::Relaxed);
}

fn gemv_rows() -> usize {
    if GEMV_ON.load(Ordering::Relaxed) {
        GEMV_ROWS
    } else {
        0
    }
}

/// Weight rows per rayon task in `gemv`.
const GEMV_CHUNK: usize = 64;

/// A GEMV reads every weight once and is bound by memory bandwidth, which one core cannot
/// saturate: it splits across threads from a quarter of `PARALLEL_THRESHOLD` (diff_v2's K/V
/// projections at the bench preset, 128 × 256, ran on one thread and cost decode 15%).
const GEMV_PARALLEL_THRESHOLD: usize = PARALLEL_THRESHOLD / 4;

/// One matrix-vector product of decoding: out (n, oc) (+)= x (n, c) · wᵀ for n ≤ GEMV_ROWS, in
/// tasks of GEMV_CHUNK outputs (`run`).
struct Gemv<'a> {
    out: crate::kernels::SharedMut,
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
            out: crate::kernels::SharedMut::new(out),
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
        if n == 1 && self.w.bf16.is_none() && super::cpu::avx512f() {
            use std::arch::x86_64::_mm512_setzero_ps;
            let w = self.w.f32;
            // SAFETY: AVX-512F was detected; rows o0..o0+h of w are in bounds (Gemv::new).
            return self.blocks16(outs, |o0, h| unsafe {
                let z = _mm512_setzero_ps();
                [
                    crate::kernels::dot_rows16(&x[..c], w.as_ptr().add(o0 * c), c, h),
                    z,
                    z,
                    z,
                ]
            });
        }
        match self.w.bf16 {
            Some(wb) => self.dots(outs, wb, crate::kernels::dot_bf16),
            None => self.dots(outs, self.w.f32, crate::kernels::dot),
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
            let m = crate::kernels::lane_mask(h);
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
        use crate::kernels::gemm::f32_avx512::{sgemm_parts, Part};
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
        use crate::kernels::gemm::cpu::avx512f as available;
        use crate::kernels::gemm::f32_avx512::{sgemm_parts, Part};
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

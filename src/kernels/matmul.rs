//! Linear layers. Every matrix product in difftx goes through `sgemm`: our own AVX-512 kernel
//! (kernels/sgemm_avx512.rs) where the CPU has it, else the `gemm` crate; with `set_bf16(true)`
//! and an AMX CPU, bf16 operands on the tile unit (kernels/bf16_amx.rs).

use super::Grad;
use gemm::Parallelism;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Whether `data` holds every element of a (rows, cols) matrix at these strides.
    pub fn fits(&self, rows: usize, cols: usize) -> bool {
        self.data.len() >= extent(rows, cols, self.rs, self.cs)
    }
}

fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
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
    /// bf16 on AMX if `set_bf16(true)` took effect; else difftx's AVX-512 kernel where the CPU
    /// has AVX-512F, else the `gemm` crate
    Auto,
    /// always the `gemm` crate (for comparison)
    GemmCrate,
    /// f32 on difftx's AVX-512 kernel (or the `gemm` crate), whatever `set_bf16` says
    F32,
    /// bf16 on AMX where available (else as `F32`), whatever `set_bf16` says
    Bf16,
}

static BF16: AtomicBool = AtomicBool::new(false);

/// Routes every `sgemm` (the linear layers and the LM head, forward and backward) through bf16
/// operands on AMX, or back to f32. Returns whether bf16 is now in effect: false on a CPU or
/// kernel without AMX bf16 tiles, where products stay f32.
pub fn set_bf16(on: bool) -> bool {
    let on = on && bf16_available();
    BF16.store(on, Ordering::Relaxed);
    on
}

/// Whether this CPU and kernel can run the bf16 path (AMX bf16 tiles).
pub fn bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::bf16_amx::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether products run in bf16 (see `set_bf16`).
pub fn bf16() -> bool {
    BF16.load(Ordering::Relaxed)
}

/// dst (m, n), row-major with row stride `dst_rs`: dst = a (m, k) · b (k, n), or dst += a · b.
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
) {
    sgemm_with(Backend::Auto, m, n, k, dst, dst_rs, accumulate, a, b)
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
    if (backend == Backend::Bf16 || backend == Backend::Auto && bf16())
        && super::bf16_amx::available()
    {
        super::bf16_amx::gemm(m, n, k, dst, dst_rs, accumulate, a, b, threads);
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
/// decoding's matrix-vector products read (half the bytes from memory), and its AMX tiles
/// (`bf16_amx::pack_weight`), which longer forwards multiply without packing it again.
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
pub fn matmul_forward<'a>(
    out: &mut [f32],
    inp: &[f32],
    w: impl Into<Weight<'a>>,
    n: usize,
    c: usize,
    oc: usize,
    accumulate: bool,
) {
    let w = w.into();
    #[cfg(target_arch = "x86_64")]
    if let (Some(tiles), true) = (w.tiles, n <= GEMV_ROWS) {
        let parallel = oc * c >= GEMV_PARALLEL_THRESHOLD;
        return super::bf16_amx::gemv_tiles(out, inp, tiles, n, c, oc, accumulate, parallel);
    }
    #[cfg(target_arch = "x86_64")]
    if n == 1 && w.bf16.is_none() && super::sgemm_avx512::available() {
        let parallel = oc * c >= GEMV_PARALLEL_THRESHOLD;
        return gemv1_avx512(out, inp, w.f32, c, oc, accumulate, parallel);
    }
    if n <= GEMV_ROWS {
        return match w.bf16 {
            Some(wb) => gemv(out, inp, wb, n, c, oc, accumulate, super::dot_bf16),
            None => gemv(out, inp, w.f32, n, c, oc, accumulate, super::dot),
        };
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(tiles), true) = (w.tiles, bf16()) {
        assert!(
            out.len() >= n * oc && inp.len() >= n * c,
            "matmul_forward: too small"
        );
        let threads = threads_for(n, oc, c);
        let x = Mat::rows(inp, c);
        return super::bf16_amx::gemm_packed(n, oc, c, out, oc, accumulate, x, tiles, threads);
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
    );
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

/// out (N, OC) (+)= inp (N, C) · wᵀ for N ≤ GEMV_ROWS, parallel over output features; `dot`
/// reads a weight row of either element type.
#[allow(clippy::too_many_arguments)]
fn gemv<T: Sync>(
    out: &mut [f32],
    inp: &[f32],
    w: &[T],
    n: usize,
    c: usize,
    oc: usize,
    accumulate: bool,
    dot: impl Fn(&[f32], &[T]) -> f32 + Sync,
) {
    assert!(out.len() >= n * oc && inp.len() >= n * c && w.len() >= oc * c);
    let dst = super::SharedMut::new(out);
    let tasks = oc.div_ceil(GEMV_CHUNK);
    let run = |ti: usize| {
        for o in ti * GEMV_CHUNK..((ti + 1) * GEMV_CHUNK).min(oc) {
            let row = &w[o * c..(o + 1) * c];
            for r in 0..n {
                let v = dot(&inp[r * c..(r + 1) * c], row);
                // SAFETY: output feature o belongs to task ti alone.
                let y = unsafe { dst.slice(r * oc + o, 1) };
                y[0] = if accumulate { y[0] + v } else { v };
            }
        }
    };
    if tasks > 1 && oc * c >= GEMV_PARALLEL_THRESHOLD {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// out (OC) (+)= w (OC, C) · x for one input row (batch-1 decoding): sixteen weight rows at a
/// time, one accumulator register each, then one 16 × 16 transpose turns the sixteen
/// registers into the sixteen sums, instead of reducing each row's partial sums apart.
#[cfg(target_arch = "x86_64")]
fn gemv1_avx512(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    c: usize,
    oc: usize,
    accumulate: bool,
    parallel: bool,
) {
    use std::arch::x86_64::*;
    assert!(out.len() >= oc && x.len() >= c && w.len() >= oc * c);
    /// # Safety
    /// AVX-512F; rows o0..o0 + h of w and outputs o0..o0 + h are in bounds.
    #[target_feature(enable = "avx512f")]
    unsafe fn rows16(x: &[f32], w: &[f32], c: usize, o0: usize, h: usize) -> __m512 {
        let mut acc = [_mm512_setzero_si512(); 16];
        for p in (0..c).step_by(16) {
            let m = super::lane_mask(c - p);
            let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(p));
            for (i, a) in acc.iter_mut().enumerate().take(h) {
                let wv = _mm512_maskz_loadu_ps(m, w.as_ptr().add((o0 + i) * c + p));
                *a = _mm512_castps_si512(_mm512_fmadd_ps(wv, xv, _mm512_castsi512_ps(*a)));
            }
        }
        super::transpose16(&mut acc);
        acc.iter().fold(_mm512_setzero_ps(), |s, v| {
            _mm512_add_ps(s, _mm512_castsi512_ps(*v))
        })
    }
    // SAFETY: AVX-512F was detected by the caller; rows o0..o0+h of w are in bounds
    // (asserted above).
    gemv_blocks16(out, 1, oc, accumulate, parallel, |o0, h| unsafe {
        [
            rows16(x, w, c, o0, h),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
            _mm512_setzero_ps(),
        ]
    });
}

/// The output side of the AVX-512 matrix-vector products (`gemv1_avx512`, and
/// `bf16_amx::gemv_tiles`): for each block of 16 outputs o0..o0 + h, `sums(o0, h)` gives one
/// register per input row r < n, stored (or added) into out (n, oc), in tasks of
/// `GEMV_CHUNK` outputs, across the pool when `parallel`.
#[cfg(target_arch = "x86_64")]
pub(crate) fn gemv_blocks16(
    out: &mut [f32],
    n: usize,
    oc: usize,
    accumulate: bool,
    parallel: bool,
    sums: impl Fn(usize, usize) -> [std::arch::x86_64::__m512; 4] + Sync,
) {
    use std::arch::x86_64::*;
    assert!(n <= 4 && out.len() >= n * oc, "gemv_blocks16: {n} rows");
    let dst = super::SharedMut::new(out);
    let run = |ti: usize| {
        for o0 in (ti * GEMV_CHUNK..((ti + 1) * GEMV_CHUNK).min(oc)).step_by(16) {
            let h = 16.min(oc - o0);
            let y = sums(o0, h);
            let m = super::lane_mask(h);
            for (r, y) in y.iter().enumerate().take(n) {
                // SAFETY: AVX-512F is present (the callers checked); outputs o0..o0+h of row r
                // are in bounds (asserted above) and belong to task ti alone.
                unsafe {
                    let o = dst.ptr(r * oc + o0, h);
                    let v = if accumulate {
                        _mm512_add_ps(*y, _mm512_maskz_loadu_ps(m, o))
                    } else {
                        *y
                    };
                    _mm512_mask_storeu_ps(o, m, v);
                }
            }
        }
    };
    let tasks = oc.div_ceil(GEMV_CHUNK);
    if parallel && tasks > 1 {
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
    );
    sgemm(oc, c, n, dw, c, true, Mat::t(dout, oc), Mat::rows(inp, c));
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
            // packs B in parallel (kc·n ≥ 2^15)
            (40, 200, 300),
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
                    let mut out = vec![0.5f32; m * (n + 3)];
                    sgemm(m, n, k, &mut out, n + 3, true, *l, *r);
                    for i in 0..m {
                        for j in 0..n + 3 {
                            let got = out[i * (n + 3) + j] as f64;
                            let exp = if j < n { 0.5 + want[i * n + j] } else { 0.5 };
                            assert!(
                                (got - exp).abs() < 1e-4 * (1.0 + exp.abs()),
                                "{m}x{n}x{k} lhs{li} rhs{ri} ({i},{j}): {got} vs {exp}"
                            );
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

    fn check_matmul(n: usize, c: usize, oc: usize) {
        let inp: Vec<f32> = (0..n * c).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let w: Vec<f32> = (0..oc * c).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let mut out = vec![1.0; n * oc];
        matmul_forward(&mut out, &inp, &w[..], n, c, oc, true);
        for i in 0..n {
            for o in 0..oc {
                let r: f32 = (0..c).map(|j| inp[i * c + j] * w[o * c + j]).sum();
                assert_eq!(out[i * oc + o], 1.0 + r);
            }
        }
    }
}

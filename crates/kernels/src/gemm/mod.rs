//! Every matrix product in difftx: C (m × n) (+)= A (m × k) · B (k × n), through `gemm`. The
//! engines behind it:
//!
//! - f32.rs: our own BLIS-style f32 product, on the AVX-512 micro-kernel (f32_avx512.rs)
//!   where the CPU has AVX-512F, else on the AVX2 one (f32_avx2.rs) where it has AVX2 and FMA;
//!   f32_kernel.rs, below the three, says what a micro-kernel provides and packs its panels;
//! - bf16.rs: bf16 operands (AMX tiles, or VDPBF16PS) under `Precision::Bf16`; on ARM64,
//!   bf16_neon.rs (BFMMLA), a micro-kernel of f32.rs's driver;
//! - the `gemm` crate elsewhere (and for comparison, `Backend::GemmCrate`);
//! - small.rs: the attention kernel's small cache-resident products (no packing in f32);
//! - linear.rs: the linear layers over them (`matmul_forward`, `matmul_backward`, llm.c's
//!   names), and decoding's matrix-vector products.

#[cfg(target_arch = "x86_64")]
pub mod bf16;
#[cfg(target_arch = "aarch64")]
mod bf16_neon;
pub mod cpu;
pub mod f32;
#[cfg(target_arch = "x86_64")]
pub mod f32_avx2;
#[cfg(target_arch = "x86_64")]
pub mod f32_avx512;
mod f32_kernel;
#[cfg(target_arch = "aarch64")]
pub mod f32_neon;
pub mod linear;
pub mod panels;
pub mod small;

pub use super::precision::Precision;
use gemm::Parallelism;
pub use linear::{matmul_backward, matmul_forward, matmul_forward_each, Weight};

/// Products smaller than this many multiply-adds run on one thread.
pub(crate) const PARALLEL_THRESHOLD: usize = 1 << 16;

/// The shape of a product: C (m × n) = A (m × k) · B (k × n).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Dims {
    pub fn new(m: usize, n: usize, k: usize) -> Dims {
        Dims { m, n, k }
    }
}

/// Where a product goes: C, row-major at row stride `rs`, overwritten or (`accumulate`) added
/// to.
pub struct Out<'a> {
    pub dst: &'a mut [f32],
    pub rs: usize,
    pub accumulate: bool,
}

impl<'a> Out<'a> {
    /// dst = A · B
    pub fn set(dst: &'a mut [f32], rs: usize) -> Self {
        Out {
            dst,
            rs,
            accumulate: false,
        }
    }
    /// dst += A · B
    pub fn add(dst: &'a mut [f32], rs: usize) -> Self {
        Out {
            dst,
            rs,
            accumulate: true,
        }
    }
    /// dst = (or += with `accumulate`) A · B
    pub fn new(dst: &'a mut [f32], rs: usize, accumulate: bool) -> Self {
        Out {
            dst,
            rs,
            accumulate,
        }
    }
}

/// `Out` for a C whose rows interleave with data that other threads own (one head of a
/// (T, NH, d) tensor, in the attention kernel): written through a `SharedMut`, which checks
/// every reach against its buffer.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut {
    pub dst: super::SharedMut,
    pub rs: usize,
    pub accumulate: bool,
}

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
pub(crate) fn threads_for(m: usize, n: usize, k: usize) -> usize {
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
    /// f32 on difftx's kernels where the CPU has AVX-512F or AVX2 and FMA, else the `gemm`
    /// crate
    F32,
    /// bf16 where the CPU has AVX512_BF16 or, on ARM64, bf16 (else as `F32`)
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

/// C (+)= A · B with operands in `precision`, on as many threads as its size is worth.
pub fn gemm(d: Dims, a: Mat, b: Mat, out: Out, precision: Precision) {
    gemm_on(precision.into(), d, a, b, out)
}

/// `gemm` on a chosen backend.
pub fn gemm_on(backend: Backend, d: Dims, a: Mat, b: Mat, out: Out) {
    let Dims { m, n, k } = d;
    let Out {
        dst,
        rs: dst_rs,
        accumulate,
    } = out;
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
    if backend == Backend::Bf16 && cpu::avx512_bf16() {
        bf16::gemm(d, a, b, Out::new(dst, dst_rs, accumulate), threads);
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if backend == Backend::Bf16 && cpu::arm_bf16() {
        f32::gemm_bf16(d, a, b, Out::new(dst, dst_rs, accumulate), threads);
        return;
    }
    if let Some(isa) = cpu::Isa::detect().filter(|_| backend != Backend::GemmCrate) {
        f32::gemm(isa, d, a, b, Out::new(dst, dst_rs, accumulate), threads);
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
                    // each of difftx's kernels this CPU has, and the `gemm` crate
                    let engines = cpu::Isa::available_all().map(Some).chain([None]);
                    let runs = engines.flat_map(|e| [(e, true, 0.5), (e, false, 0.0)]);
                    for (engine, acc, base) in runs {
                        let mut out = vec![0.5f32; m * (n + 3)];
                        let (d, o) = (Dims::new(m, n, k), Out::new(&mut out, n + 3, acc));
                        match engine {
                            Some(isa) => f32::gemm(isa, d, *l, *r, o, threads_for(m, n, k)),
                            None => gemm_on(Backend::GemmCrate, d, *l, *r, o),
                        }
                        for i in 0..m {
                            for j in 0..n + 3 {
                                let got = out[i * (n + 3) + j] as f64;
                                let exp = if j < n { base + want[i * n + j] } else { 0.5 };
                                assert!(
                                    (got - exp).abs() < 1e-4 * (1.0 + exp.abs()),
                                    "{engine:?} {m}x{n}x{k} lhs{li} rhs{ri} acc {acc} ({i},{j}): {got} vs {exp}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

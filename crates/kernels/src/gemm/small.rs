//! C (m × n) (+)= A (m × k) · B (k × n) for the small, cache-resident operands inside the
//! attention kernel (a query block against a key tile). In f32 nothing is packed: A is read
//! through strides (so Aᵀ costs nothing), B and C by rows, in register tiles: AVX-512's of MR
//! rows × 32 columns where the CPU has it, else AVX2's of 6 × 16, NEON's of 6 × 16 on ARM64,
//! plain loops elsewhere. Under `--bf16` both operands are rounded to bf16 and multiplied by
//! gemm/bf16.rs, like the linear layers.

use super::{Dims, Mat, SharedOut};

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The operands of `with_packed`.
    static PACKED: std::cell::Cell<Vec<Vec<u16>>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The most operands `with_packed` packs at once (an attention task's keys, values and the
/// queries and output gradients of its heads).
pub const MAX_PACKED: usize = 16;

/// Sizes this thread's `with_packed` buffers for attention operands of `keys` rows by head
/// widths dk and dv (the keys, values, queries and output gradients of a task, either way
/// round), so that no step allocates them later.
#[cfg(target_arch = "x86_64")]
pub(crate) fn reserve(keys: usize, dk: usize, dv: usize) {
    use super::bf16::packed_len;
    let len = [dk, dv]
        .map(|d| packed_len(keys, d).max(packed_len(d, keys)))
        .into_iter()
        .max()
        .unwrap_or(0);
    let mut bufs = PACKED.take();
    bufs.resize_with(bufs.len().max(MAX_PACKED), Vec::new);
    for b in &mut bufs {
        crate::ensure(b, len);
    }
    PACKED.set(bufs);
}

/// A B operand packed once in bf16 tiles (an attention task's keys and values, against each
/// of its query blocks and heads in turn): the one packed-B type, `bf16::PackedB`.
#[cfg(target_arch = "x86_64")]
pub use super::bf16::PackedB;

/// Off x86-64 there are no bf16 tiles: `with_packed` never makes one.
#[cfg(not(target_arch = "x86_64"))]
pub struct PackedB<'a>(std::marker::PhantomData<&'a ()>);

#[cfg(not(target_arch = "x86_64"))]
impl PackedB<'_> {
    /// Never called: no value of this type exists.
    ///
    /// # Safety
    /// None needed.
    pub(crate) unsafe fn gemm(&self, _: Dims, _: (usize, usize), _: Mat, _: SharedOut) {
        unreachable!("PackedB exists only with AVX512_BF16")
    }
}

/// Runs f with every operand b (k × n) of `ops` packed (`PackedB`, in order) and the tile unit
/// configured for their products, where `bf16` and the CPU has AVX512_BF16; with `None` otherwise, and
/// for no operands or more than MAX_PACKED (under bf16 with the tile unit still configured, for
/// products that pack their own operands).
pub fn with_packed<R>(
    bf16: bool,
    ops: &[(Mat, usize, usize)],
    f: impl FnOnce(Option<&[PackedB]>) -> R,
) -> R {
    #[cfg(target_arch = "x86_64")]
    if bf16 && super::cpu::avx512_bf16() {
        if ops.is_empty() || ops.len() > MAX_PACKED {
            return super::bf16::with_tiles(|| f(None));
        }
        for &(b, k, n) in ops {
            assert!(k > 0 && n > 0 && b.fits(k, n), "with_packed: B too small");
        }
        let mut bufs = PACKED.take();
        if bufs.len() < ops.len() {
            bufs.resize_with(ops.len(), Vec::new);
        }
        let r = {
            let mut packed = [PackedB::EMPTY; MAX_PACKED];
            for ((slot, buf), &(b, k, n)) in packed.iter_mut().zip(bufs.iter_mut()).zip(ops) {
                *slot = PackedB::pack(buf, b, k, n);
            }
            super::bf16::with_tiles(|| f(Some(&packed[..ops.len()])))
        };
        PACKED.set(bufs);
        return r;
    }
    let _ = (bf16, ops);
    f(None)
}

/// C (m × n) (+)= A (m × k) · B (k × n; both B and C have n contiguous columns); `bf16`: in
/// bf16 where the CPU has AVX512_BF16 (f32 elsewhere). C comes through a `SharedOut`, for a C
/// whose rows interleave with data that other threads own (one head of a (T, NH, d) tensor).
///
/// # Safety
/// No other thread may access rows `0..m` (`out.rs` apart) of `n` columns of the output
/// meanwhile.
pub(crate) unsafe fn small_gemm(d: Dims, a: Mat, b: Mat, out: SharedOut, bf16: bool) {
    let Dims { m, n, k } = d;
    if m == 0 || n == 0 {
        return;
    }
    assert_eq!(b.cs, 1, "small_gemm: B's columns must be contiguous");
    assert!(a.fits(m, k), "small_gemm: A too small");
    assert!(b.fits(k, n), "small_gemm: B too small");
    #[cfg(target_arch = "x86_64")]
    if bf16 && super::cpu::avx512_bf16() {
        // SAFETY: the caller vouches for C's m rows of n columns, exclusively (this fn's
        // `# Safety`); AVX512_BF16 is available (checked above).
        unsafe { super::bf16::gemm_shared(d, a, b, out, 1) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::cpu::avx512f() {
        // SAFETY: the pointer reaches C's m rows of n columns at out.rs, which `ptr` checks
        // against the output's buffer.
        let c = unsafe { out.dst.ptr(0, super::extent(m, n, out.rs, 1)) };
        // SAFETY: AVX-512F is present; the asserts bound A and B, C is in bounds (above) and
        // the caller's alone.
        unsafe { avx512::small_gemm(d, a, b, (c, out.rs, out.accumulate)) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if super::cpu::avx2_fma() {
        // SAFETY: as for AVX-512 above, with AVX2 and FMA present.
        let c = unsafe { out.dst.ptr(0, super::extent(m, n, out.rs, 1)) };
        // SAFETY: AVX2 and FMA are present; A, B and C are bounded as above.
        unsafe { avx2::small_gemm(d, a, b, (c, out.rs, out.accumulate)) };
        return;
    }
    let _ = bf16;
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: as for AVX-512 above.
        let c = unsafe { out.dst.ptr(0, super::extent(m, n, out.rs, 1)) };
        // SAFETY: NEON, which every ARM64 CPU has; A, B and C are bounded as above.
        unsafe { neon::small_gemm(d, a, b, (c, out.rs, out.accumulate)) };
    }
    #[cfg(not(target_arch = "aarch64"))]
    for r in 0..m {
        // SAFETY: row r < m of C, n values from r·rs, is the caller's to write alone (this
        // fn's `# Safety`); `slice` checks its reach.
        let row = unsafe { out.dst.slice(r * out.rs, n) };
        if !out.accumulate {
            row.fill(0.0);
        }
        for p in 0..k {
            let av = a.data[r * a.rs + p * a.cs];
            for (cv, &bv) in row.iter_mut().zip(&b.data[p * b.rs..p * b.rs + n]) {
                *cv += av * bv;
            }
        }
    }
}

/// The register tiles of an m × n product as AVX2 and NEON take them: (first row, rows ≤ 6,
/// first column, columns ≤ 16), strips of 16 columns left to right, each top to bottom.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn tiles(m: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    (0..n).step_by(16).flat_map(move |j0| {
        (0..m)
            .step_by(6)
            .map(move |r0| (r0, (m - r0).min(6), j0, (n - j0).min(16)))
    })
}

/// `small_gemm` on ARM64: AVX2's tiles (up to six rows × 16 columns, the sums in registers
/// over k) in NEON's four-lane registers, four a row (24 accumulators of the 32 registers). A
/// ragged last strip of fewer than 16 columns reads B's rows through a copy padded with
/// zeros and writes C's columns one at a time (NEON has no masked loads).
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use super::{Dims, Mat};
    use std::arch::aarch64::*;

    /// `super::small_gemm` on NEON registers.
    ///
    /// # Safety
    /// A (m × k) and B (k × n, contiguous columns) in bounds; c (C, row stride, accumulate)
    /// valid for writes of rows 0..m of n columns, which no other thread accesses meanwhile.
    #[target_feature(enable = "neon")]
    pub unsafe fn small_gemm(
        d: Dims,
        a: Mat,
        b: Mat,
        (c, c_rs, accumulate): (*mut f32, usize, bool),
    ) {
        let Dims { m, n, k } = d;
        for (r0, h, j0, w) in super::tiles(m, n) {
            // SAFETY: the caller's contract bounds A's rows r0..r0 + h, B's k rows of the w
            // columns from j0 and C's likewise.
            unsafe {
                let args = (
                    k,
                    a.data.as_ptr().add(r0 * a.rs),
                    (a.rs, a.cs),
                    b.data.as_ptr().add(j0),
                    b.rs,
                    (c.add(r0 * c_rs + j0), c_rs),
                    w,
                    accumulate,
                );
                match h {
                    6 => tile::<6>(args),
                    5 => tile::<5>(args),
                    4 => tile::<4>(args),
                    3 => tile::<3>(args),
                    2 => tile::<2>(args),
                    _ => tile::<1>(args),
                }
            }
        }
    }

    /// (k, A, A's (row, column) strides, B, B row stride, (C, C row stride), columns (≤ 16),
    /// accumulate)
    type TileArgs = (
        usize,
        *const f32,
        (usize, usize),
        *const f32,
        usize,
        (*mut f32, usize),
        usize,
        bool,
    );

    /// H rows × w ≤ 16 columns of C, accumulated over k in registers.
    ///
    /// # Safety
    /// A's H rows, B's k rows of w columns and C's H rows of w columns in bounds.
    #[target_feature(enable = "neon")]
    #[inline]
    unsafe fn tile<const H: usize>(
        (k, a, (a_rs, a_cs), b, b_rs, (c, c_rs), w, accumulate): TileArgs,
    ) {
        // SAFETY: the caller's contract, for the H rows and w columns named; `pad` holds 16.
        unsafe {
            let mut acc = [[vdupq_n_f32(0.0); 4]; H];
            let mut pad = [0f32; 16];
            for p in 0..k {
                let mut row = b.add(p * b_rs);
                if w < 16 {
                    std::ptr::copy_nonoverlapping(row, pad.as_mut_ptr(), w);
                    row = pad.as_ptr();
                }
                let bv = [0, 1, 2, 3].map(|v| vld1q_f32(row.add(4 * v)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = *a.add(r * a_rs + p * a_cs);
                    for (x, bv) in acc.iter_mut().zip(bv) {
                        *x = vfmaq_n_f32(*x, bv, av);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                let cr = c.add(r * c_rs);
                if w == 16 {
                    for (v, &x) in acc.iter().enumerate() {
                        let x = if accumulate {
                            vaddq_f32(x, vld1q_f32(cr.add(4 * v)))
                        } else {
                            x
                        };
                        vst1q_f32(cr.add(4 * v), x);
                    }
                    continue;
                }
                let mut sums = [0f32; 16];
                for (v, &x) in acc.iter().enumerate() {
                    vst1q_f32(sums.as_mut_ptr().add(4 * v), x);
                }
                for (j, &x) in sums[..w].iter().enumerate() {
                    *cr.add(j) = if accumulate { x + *cr.add(j) } else { x };
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::{Dims, Mat};
    use std::arch::x86_64::*;

    /// Register tiles: 6 rows × 64 columns (24 accumulators) while 64 columns remain, then
    /// 8 rows × 32: the wider tile spends one broadcast of A on four FMAs instead of two.
    pub(crate) const WIDE_ROWS: usize = 6;
    const ROWS: usize = 8;

    /// Lanes of columns j0 + 16·v .. for v < NV, masked to the first `w` columns.
    fn masks<const NV: usize>(w: usize) -> [__mmask16; NV] {
        std::array::from_fn(|v| crate::lane_mask(w.saturating_sub(16 * v)))
    }

    /// `super::small_gemm` on AVX-512F registers.
    ///
    /// # Safety
    /// AVX-512F; A (m × k) and B (k × n, contiguous columns) in bounds; c (C, row stride,
    /// accumulate) valid for writes of rows 0..m of n columns, which no other thread accesses
    /// meanwhile.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn small_gemm(
        d: Dims,
        a: Mat,
        b: Mat,
        (c, c_rs, accumulate): (*mut f32, usize, bool),
    ) {
        let (Dims { m, n, k }, b_rs) = (d, b.rs);
        let b = b.data;
        let mut j0 = 0;
        while j0 < n {
            // SAFETY: AVX-512F, A and B in bounds and C valid for m rows of n columns are the
            // caller's contract; each strip covers columns j0..j0 + 64 (or the n − j0 left),
            // inside B's and C's n columns, and column j0 < n is inside both.
            unsafe {
                let bp = b.as_ptr().add(j0);
                let cp = c.add(j0);
                if n - j0 >= 64 {
                    strip::<4>(WIDE_ROWS, m, k, a, bp, b_rs, cp, c_rs, 64, accumulate);
                    j0 += 64;
                } else {
                    strip::<2>(ROWS, m, k, a, bp, b_rs, cp, c_rs, n - j0, accumulate);
                    j0 += 32;
                }
            }
        }
    }

    /// One strip of NV·16 columns (the first `w` of them valid), `rows` rows at a time.
    ///
    /// # Safety
    /// As for `small_gemm`, for the strip's m rows of w columns at b and c.
    #[target_feature(enable = "avx512f")]
    // the inner loop's raw operands, as the register tiles read them: a struct would only be
    // unpacked again at the top
    #[allow(clippy::too_many_arguments)]
    unsafe fn strip<const NV: usize>(
        rows: usize,
        m: usize,
        k: usize,
        a: Mat,
        b: *const f32,
        b_rs: usize,
        c: *mut f32,
        c_rs: usize,
        w: usize,
        accumulate: bool,
    ) {
        // SAFETY: AVX-512F and a, b, c valid for the rows and columns named are
        // the caller's contract; each tile reads H ≤ rows of a, w ≤ 16·NV columns of b (masked) and
        // writes those of c.
        unsafe {
            let mk = masks::<NV>(w.min(16 * NV));
            let mut r0 = 0;
            while r0 < m {
                let h = rows.min(m - r0);
                let ap = a.data.as_ptr().add(r0 * a.rs);
                let args = (
                    k,
                    ap,
                    a.rs,
                    a.cs,
                    b,
                    b_rs,
                    c.add(r0 * c_rs),
                    c_rs,
                    mk,
                    accumulate,
                );
                match h {
                    8 => tile::<8, NV>(args),
                    7 => tile::<7, NV>(args),
                    6 => tile::<6, NV>(args),
                    5 => tile::<5, NV>(args),
                    4 => tile::<4, NV>(args),
                    3 => tile::<3, NV>(args),
                    2 => tile::<2, NV>(args),
                    _ => tile::<1, NV>(args),
                }
                r0 += h;
            }
        }
    }

    /// A (H rows × k, element (r, p) at r·a_rs + p·a_cs) times B (k rows, b_rs apart, of NV·16
    /// columns masked by mk), in registers: one FMA chain over p in order per element.
    ///
    /// # Safety
    /// AVX-512F; A and the masked columns of B must be in bounds.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) unsafe fn products<const H: usize, const NV: usize>(
        k: usize,
        a: *const f32,
        a_rs: usize,
        a_cs: usize,
        b: *const f32,
        b_rs: usize,
        mk: [__mmask16; NV],
    ) -> [[__m512; NV]; H] {
        // SAFETY: AVX-512F and H rows of a, k rows of NV masked registers of b in
        // bounds are the caller's contract.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); NV]; H];
            for p in 0..k {
                let mut bv = [_mm512_setzero_ps(); NV];
                for (v, bv) in bv.iter_mut().enumerate() {
                    *bv = _mm512_maskz_loadu_ps(mk[v], b.add(p * b_rs + 16 * v));
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*a.add(r * a_rs + p * a_cs));
                    for v in 0..NV {
                        row[v] = _mm512_fmadd_ps(av, bv[v], row[v]);
                    }
                }
            }
            acc
        }
    }

    /// (k, A, A row stride, A column stride, B, B row stride, C, C row stride, column masks,
    /// accumulate)
    type TileArgs<const NV: usize> = (
        usize,
        *const f32,
        usize,
        usize,
        *const f32,
        usize,
        *mut f32,
        usize,
        [__mmask16; NV],
        bool,
    );

    /// H rows × NV·16 columns (masked) of C, accumulated over k in registers. Every element is
    /// one FMA chain over p in order, whatever the tile shape.
    ///
    /// # Safety
    /// AVX-512F; A's H rows, B's k rows (masked by mk) and C's H rows (masked by mk) in bounds.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn tile<const H: usize, const NV: usize>(
        (k, a, a_rs, a_cs, b, b_rs, c, c_rs, mk, accumulate): TileArgs<NV>,
    ) {
        // SAFETY: AVX-512F and c valid for H rows at c_rs, masked to mk, are the
        // caller's contract (`strip` passes rows inside its strip).
        unsafe {
            let acc = products::<H, NV>(k, a, a_rs, a_cs, b, b_rs, mk);
            for (r, row) in acc.iter().enumerate() {
                let cr = c.add(r * c_rs);
                for v in 0..NV {
                    let mut x = row[v];
                    if accumulate {
                        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], cr.add(16 * v)));
                    }
                    _mm512_mask_storeu_ps(cr.add(16 * v), mk[v], x);
                }
            }
        }
    }
}

/// `small_gemm` on AVX2 (AMD Zen 2/3, Intel's client cores): register tiles of 6 rows × 16
/// columns, 12 accumulators, two registers of B and a broadcast of A among AVX2's sixteen;
/// each element one FMA chain over p in order, as on AVX-512. (The plain loop, which the
/// compiler vectorises to SSE2 without FMA, took 18% of a `medium` prefill of 512 tokens on a
/// Zen 3.)
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{Dims, Mat};
    use std::arch::x86_64::*;

    /// Loads of columns 8·v.. (v < 2) masked to the first `w` of 16 columns: each lane
    /// whose column is below w has its sign bit set.
    fn masks(w: usize) -> [__m256i; 2] {
        std::array::from_fn(|v| {
            let lanes: [i32; 8] = std::array::from_fn(|l| if 8 * v + l < w { -1 } else { 0 });
            // SAFETY: eight i32 into one 256-bit register.
            unsafe { std::mem::transmute::<[i32; 8], __m256i>(lanes) }
        })
    }

    /// `super::small_gemm` on AVX2 and FMA registers.
    ///
    /// # Safety
    /// AVX2 and FMA; A (m × k) and B (k × n, contiguous columns) in bounds; c (C, row stride,
    /// accumulate) valid for writes of rows 0..m of n columns, which no other thread accesses
    /// meanwhile.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn small_gemm(
        d: Dims,
        a: Mat,
        b: Mat,
        (c, c_rs, accumulate): (*mut f32, usize, bool),
    ) {
        let Dims { m, n, k } = d;
        for (r0, h, j0, w) in super::tiles(m, n) {
            // whole strips load and store plainly, the ragged last one through masks
            let mk = (w < 16).then(|| masks(w));
            // SAFETY: the caller's contract bounds A's rows r0..r0 + h, B's k rows of
            // columns j0.. (masked to the w left) and C's likewise.
            unsafe {
                let args = (
                    k,
                    a.data.as_ptr().add(r0 * a.rs),
                    (a.rs, a.cs),
                    b.data.as_ptr().add(j0),
                    b.rs,
                    c.add(r0 * c_rs + j0),
                    c_rs,
                    mk,
                    accumulate,
                );
                match h {
                    6 => tile::<6>(args),
                    5 => tile::<5>(args),
                    4 => tile::<4>(args),
                    3 => tile::<3>(args),
                    2 => tile::<2>(args),
                    _ => tile::<1>(args),
                }
            }
        }
    }

    /// (k, A, A's (row, column) strides, B, B row stride, C, C row stride, column masks (none:
    /// all 16 columns), accumulate)
    type TileArgs = (
        usize,
        *const f32,
        (usize, usize),
        *const f32,
        usize,
        *mut f32,
        usize,
        Option<[__m256i; 2]>,
        bool,
    );

    /// Columns 8·v.. 8·v + 8 of a row at p: all of them, or those the masks keep.
    ///
    /// # Safety
    /// AVX2; the columns loaded in bounds.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load(p: *const f32, v: usize, mk: Option<[__m256i; 2]>) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe {
            match mk {
                None => _mm256_loadu_ps(p.add(8 * v)),
                Some(mk) => _mm256_maskload_ps(p.add(8 * v), mk[v]),
            }
        }
    }

    /// H rows × 16 columns (masked) of C, accumulated over k in registers.
    ///
    /// # Safety
    /// AVX2 and FMA; A's H rows, B's k rows and C's H rows (the columns masked by mk) in
    /// bounds.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn tile<const H: usize>(
        (k, a, (a_rs, a_cs), b, b_rs, c, c_rs, mk, accumulate): TileArgs,
    ) {
        // SAFETY: the caller's contract, for the H rows and masked columns named.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; H];
            for p in 0..k {
                let b0 = load(b.add(p * b_rs), 0, mk);
                let b1 = load(b.add(p * b_rs), 1, mk);
                for (r, row) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*a.add(r * a_rs + p * a_cs));
                    row[0] = _mm256_fmadd_ps(av, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(av, b1, row[1]);
                }
            }
            for (r, row) in acc.iter().enumerate() {
                let cr = c.add(r * c_rs);
                for (v, &x) in row.iter().enumerate() {
                    let mut x = x;
                    if accumulate {
                        x = _mm256_add_ps(x, load(cr, v, mk));
                    }
                    match mk {
                        None => _mm256_storeu_ps(cr.add(8 * v), x),
                        Some(mk) => _mm256_maskstore_ps(cr.add(8 * v), mk[v], x),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under bf16 the reference multiplies the operands rounded to bf16, whose products are
    /// exact in f32: only the order of the additions differs.
    #[test]
    fn small_gemm_matches_loops_with_strides_and_ragged_edges() {
        let round = |x: f32| half::bf16::from_f32(x).to_f32();
        for bf16 in [false, true] {
            if bf16 && !crate::gemm::cpu::avx512_bf16() {
                eprintln!("skipped bf16: this CPU has no AVX512_BF16");
                continue;
            }
            let r = |x: f32| if bf16 { round(x) } else { x };
            for (m, n, k) in [
                (1, 1, 1),
                (8, 32, 5),
                (13, 70, 33),
                (64, 64, 32),
                (3, 17, 0),
                (32, 130, 40),
                (7, 64, 3),
                (50, 64, 64),
            ] {
                let a: Vec<f32> = (0..m * k * 2)
                    .map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0)
                    .collect();
                let b: Vec<f32> = (0..k * (n + 5))
                    .map(|i| ((i * 7 % 31) as f32 - 15.0) / 9.0)
                    .collect();
                // A stored transposed with a gap: element (r, p) at p * 2m + r
                let at = Mat {
                    data: &a,
                    rs: 1,
                    cs: 2 * m,
                };
                let bm = Mat {
                    data: &b,
                    rs: n + 5,
                    cs: 1,
                };
                let check = |c: &[f32], path: &str| {
                    for row in 0..m {
                        for j in 0..n + 2 {
                            let want: f32 = if j < n {
                                1.0 + (0..k)
                                    .map(|p| r(a[p * 2 * m + row]) * r(b[p * (n + 5) + j]))
                                    .sum::<f32>()
                            } else {
                                1.0
                            };
                            let got = c[row * (n + 2) + j];
                            assert!(
                                (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                                "{path} bf16 {bf16} {m}x{n}x{k} ({row},{j}): {got} vs {want}"
                            );
                        }
                    }
                };
                let (d, rs) = (Dims::new(m, n, k), n + 2);
                let mut c = vec![1.0f32; m * rs];
                let out = SharedOut {
                    dst: crate::SharedMut::new(&mut c),
                    rs,
                    accumulate: true,
                };
                // SAFETY: c holds m rows of n + 2, which only this call writes.
                unsafe { small_gemm(d, at, bm, out, bf16) };
                check(&c, "dispatch");
                // the AVX2 path too where the CPU has it (the dispatch prefers AVX-512)
                #[cfg(target_arch = "x86_64")]
                if !bf16 && crate::gemm::cpu::avx2_fma() {
                    let mut c = vec![1.0f32; m * rs];
                    // SAFETY: AVX2 and FMA detected; c holds m rows of n + 2.
                    unsafe { avx2::small_gemm(d, at, bm, (c.as_mut_ptr(), rs, true)) };
                    check(&c, "avx2");
                }
            }
        }
    }
}

//! Vector helpers every kernel shares: AVX-512 lane masks, the 16 × 16 transpose, the
//! lane sums, prefetch; the lane-parallel reductions and dot products that
//! vectorise without intrinsics; the fast exp and sigmoid.

/// Asks for the cache lines of the `n` values from `at` into L1, ahead of a strided gather
/// (packing, tile copies) whose short runs the hardware prefetcher does not follow. A hint:
/// the address need not lie inside any allocation, since a prefetch never faults.
#[inline]
pub(crate) fn prefetch(at: *const f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..n).step_by(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: PREFETCHT0 (SSE, part of x86_64) reads nothing and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(off) as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, n);
}

/// Asks for the cache line at `at` into L2 (PREFETCHT1), ahead of a stream the hardware
/// prefetcher would start too late: the next block of weights a batch's later passes leave
/// the memory idle for. A hint, which reads nothing: any address will do.
#[inline(always)]
pub(crate) fn prefetch_l2<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        // SAFETY: PREFETCHT1 (SSE, part of x86_64) reads nothing and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(at.cast::<i8>()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Cache lines of the next block of weights (an f32 panel, int8 tiles) that a pass over this
/// one asks the memory for into L2 as it goes, a part at each of its steps: where a batch
/// passes over a block more than once, the passes after the first reread it from cache while
/// the memory would idle. A hint, which reads nothing and changes no sum.
#[derive(Clone, Copy)]
pub struct NextLines {
    /// the first line to fetch (any address: a prefetch never faults)
    from: *const u8,
    /// how many lines from there
    lines: usize,
}

impl NextLines {
    /// Fetch nothing.
    pub const NONE: NextLines = NextLines {
        from: std::ptr::null(),
        lines: 0,
    };

    /// Pass `pass` of `passes`' share of the `lines` cache lines from `from`: as many each,
    /// one after another.
    pub fn share<T>(from: *const T, lines: usize, pass: usize, passes: usize) -> NextLines {
        let each = lines.div_ceil(passes);
        let start = (pass * each).min(lines);
        NextLines {
            from: from.cast::<u8>().wrapping_add(64 * start),
            lines: each.min(lines - start),
        }
    }

    /// The share's lines that step i of `steps` asks for: as many each, in order.
    #[inline(always)]
    fn part(self, i: usize, steps: usize) -> std::ops::Range<usize> {
        let each = self.lines.div_ceil(steps);
        (i * each).min(self.lines)..((i + 1) * each).min(self.lines)
    }

    /// Asks for step i's lines (of `steps`).
    #[inline(always)]
    pub fn fetch(self, i: usize, steps: usize) {
        for l in self.part(i, steps) {
            prefetch_l2(self.from.wrapping_add(64 * l));
        }
    }
}

/// How far ahead of its reads a stream that is read once a token (a lone decoding row's
/// weights) asks for its lines, in bytes. Left to the hardware's prefetchers, f32 decoding at
/// `medium` read its weights at 46–61 GB/s on a Zen 5; asking 16 KiB ahead, at 72–89 GB/s in
/// the same minutes (12 KiB as well; 8 KiB or less and 32 KiB or more less well; PREFETCHT0
/// about as well).
#[cfg(target_arch = "x86_64")]
pub(crate) const STREAM_AHEAD: usize = 16 << 10;

/// Asks for the cache line `STREAM_AHEAD` bytes past `at`, non-temporally (PREFETCHNTA): data
/// read once, which should displace little. A hint, which reads nothing: any address will do.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_stream<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_NTA};
        let ahead = at.cast::<i8>().wrapping_add(STREAM_AHEAD);
        // SAFETY: PREFETCHNTA (SSE, part of x86_64) reads nothing and cannot fault.
        unsafe { _mm_prefetch::<_MM_HINT_NTA>(ahead) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The first `n` of 16 lanes (all of them from 16 on): the mask of a ragged AVX-512 load or
/// store.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn lane_mask(n: usize) -> std::arch::x86_64::__mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as u16
    }
}

/// Transposes a 16 × 16 matrix of 32-bit values (f32 or bf16 pairs) held as 16 rows: pairs of rows interleaved by 32 and
/// then 64 bits leave 4 × 4 blocks transposed inside each 128-bit lane, and two lane shuffles
/// put the blocks in place.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn transpose16(r: &mut [std::arch::x86_64::__m512i; 16]) {
    use std::arch::x86_64::*;
    let mut a = [_mm512_setzero_si512(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    // b[4i + c], lane L: rows 4i..4i+4 of column 4L + c.
    let mut b = [_mm512_setzero_si512(); 16];
    for i in 0..4 {
        b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
    }
    for c in 0..4 {
        let e0 = _mm512_shuffle_i32x4::<0x44>(b[c], b[4 + c]);
        let e1 = _mm512_shuffle_i32x4::<0xee>(b[c], b[4 + c]);
        let e2 = _mm512_shuffle_i32x4::<0x44>(b[8 + c], b[12 + c]);
        let e3 = _mm512_shuffle_i32x4::<0xee>(b[8 + c], b[12 + c]);
        r[c] = _mm512_shuffle_i32x4::<0x88>(e0, e2);
        r[4 + c] = _mm512_shuffle_i32x4::<0xdd>(e0, e2);
        r[8 + c] = _mm512_shuffle_i32x4::<0x88>(e1, e3);
        r[12 + c] = _mm512_shuffle_i32x4::<0xdd>(e1, e3);
    }
}

/// A value of a row that the kernels read and widen to f32 on the fly: f32 itself, or bf16
/// (the `--kv-cache bf16` cache's keys and values, `half::bf16`).
pub trait Elem: Copy + Default + Send + Sync + 'static {
    /// Whether the value is bf16 (a compile-time branch in `load16`).
    const BF16: bool;
    /// Bytes per value.
    const BYTES: usize;
    /// The f32 this value stands for (exact).
    fn widen(self) -> f32;
    /// `x` as this type, rounded to nearest even.
    fn narrow(x: f32) -> Self;
    /// The values themselves where they are f32 (read in place), else `None`.
    fn as_f32(x: &[Self]) -> Option<&[f32]>;
}

impl Elem for f32 {
    const BF16: bool = false;
    const BYTES: usize = 4;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(x: f32) -> f32 {
        x
    }
    fn as_f32(x: &[f32]) -> Option<&[f32]> {
        Some(x)
    }
}

impl Elem for half::bf16 {
    const BF16: bool = true;
    const BYTES: usize = 2;
    /// The upper half of the f32's bits: a shift, as `load16` does 16 at a time.
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self.to_bits())
    }
    #[inline(always)]
    fn narrow(x: f32) -> half::bf16 {
        half::bf16::from_f32(x)
    }
    fn as_f32(_: &[half::bf16]) -> Option<&[f32]> {
        None
    }
}

/// A row of values as `dot_tree` and the decoding attention's weighted rows read it, sixteen
/// lanes of f32 at a time: f32 or bf16 values in place (`&[T]`, `load16`), or a q8_0 KV
/// cache's blocks (`&[kernels::Q8Block]`) widened as they are loaded, to the values
/// `Q8Block::widen` gives. One loop thus serves every element type, with the same FMAs as over
/// the widened values.
#[cfg(target_arch = "x86_64")]
pub(crate) trait Lanes16: Copy {
    /// The number of values.
    fn len(self) -> usize;
    /// Values p..p + min(n, 16) as f32, zero in the lanes past n.
    ///
    /// # Safety
    /// AVX-512F; p + min(n, 16) ≤ len(); for blocks, p a multiple of 16 and n ≥ 16.
    unsafe fn load(self, p: usize, n: usize) -> std::arch::x86_64::__m512;
    /// Where value p lies, for prefetch hints (which read nothing: any address will do).
    fn addr(self, p: usize) -> *const u8;
}

#[cfg(target_arch = "x86_64")]
impl<T: Elem> Lanes16 for &[T] {
    #[inline(always)]
    fn len(self) -> usize {
        <[T]>::len(self)
    }
    #[inline(always)]
    unsafe fn load(self, p: usize, n: usize) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract is `load16`'s.
        unsafe { load16(self.as_ptr().add(p), n) }
    }
    #[inline(always)]
    fn addr(self, p: usize) -> *const u8 {
        self.as_ptr().wrapping_add(p).cast()
    }
}

/// `Lanes16` on AVX2: a row of values as `dot_tree8` and `weighted_row_avx2` read it, eight
/// lanes at a time: f32 or bf16 values in place (`&[T]`, `load8`), or a q8_0 KV cache's
/// blocks (`&[kernels::Q8Block]`) widened as they are loaded, to the values `Q8Block::widen`
/// gives (so the same FMAs as over the widened row, without writing it out first).
#[cfg(target_arch = "x86_64")]
pub(crate) trait Lanes8: Copy {
    /// The number of values.
    fn len(self) -> usize;
    /// Value i, widened to f32 (a ragged tail's, one at a time).
    fn at(self, i: usize) -> f32;
    /// Values p..p + 8 as f32.
    ///
    /// # Safety
    /// AVX2; p + 8 ≤ len(); for blocks, p a multiple of 8.
    unsafe fn load(self, p: usize) -> std::arch::x86_64::__m256;
}

#[cfg(target_arch = "x86_64")]
impl<T: Elem> Lanes8 for &[T] {
    #[inline(always)]
    fn len(self) -> usize {
        <[T]>::len(self)
    }
    #[inline(always)]
    fn at(self, i: usize) -> f32 {
        self[i].widen()
    }
    #[inline(always)]
    unsafe fn load(self, p: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract is `load8`'s.
        unsafe { load8(self.as_ptr().add(p)) }
    }
}

/// The first `n` (at most 16) values from `p` widened to f32, zero in the lanes past `n`: a
/// masked load for f32; for bf16 the 16-bit values zero-extended to 32 bits and shifted into
/// the upper half (a ragged tail is copied out first, so that nothing past `n` is read).
///
/// # Safety
/// AVX-512F; `p..p + min(n, 16)` is in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn load16<T: Elem>(p: *const T, n: usize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees the min(n, 16) values from p in bounds; the masked load
    // and the copy read no further.
    unsafe {
        if !T::BF16 {
            return load_f32(p as *const f32, n);
        }
        let p = p as *const u16;
        let bits = if n >= 16 {
            _mm256_loadu_si256(p as *const __m256i)
        } else {
            bf16_tail(p, n)
        };
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
    }
}

/// The first `n` (at most 16) f32 values from `p`, zero in the lanes past `n`: a plain load
/// where all sixteen are there (a masked one costs the products of a decoding batch about a
/// tenth of their speed on Zen 4, though it reads the same), else a masked one.
///
/// # Safety
/// AVX-512F; `p..p + min(n, 16)` is in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn load_f32(p: *const f32, n: usize) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees min(n, 16) values from p in bounds.
    unsafe {
        if n >= 16 {
            _mm512_loadu_ps(p)
        } else {
            _mm512_maskz_loadu_ps(lane_mask(n), p)
        }
    }
}

/// The n < 16 bf16 values from p, zero-padded to 16: `load16`'s ragged tail, out of line so
/// that the loops around `load16` keep their sums in registers (a copy inlined into them made
/// the compiler keep them on the stack).
///
/// # Safety
/// p..p + n is in bounds.
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
unsafe fn bf16_tail(p: *const u16, n: usize) -> std::arch::x86_64::__m256i {
    let mut tail = [0u16; 16];
    // SAFETY: the caller guarantees n values from p; tail holds 16 ≥ n.
    unsafe {
        std::ptr::copy_nonoverlapping(p, tail.as_mut_ptr(), n.min(16));
        std::arch::x86_64::_mm256_loadu_si256(tail.as_ptr().cast())
    }
}

/// Lane i is the sum of the sixteen lanes of `acc[i]`, each summed as `sum_lanes_tree` sums
/// one vector (lane l with l + 8, then l + 4, l + 2, l + 1), by four levels of adds that halve
/// the registers as they go: at each level two registers' halves are shuffled side by side
/// and added, so the sixteen sums take 30 shuffles and 15 adds (a full transpose first took 64
/// shuffles). The last level leaves vector 4k + c's sum in lane 4c + k; taking the vectors in
/// that transposed order puts sum i in lane i.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sum_lanes16(acc: [std::arch::x86_64::__m512i; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let v: [__m512; 16] = std::array::from_fn(|j| _mm512_castsi512_ps(acc[4 * (j % 4) + j / 4]));
    // lanes l and l + 8 of two vectors: their low halves side by side plus their high halves
    let l1: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // l and l + 4: each 128-bit quarter now holds four of a vector's eight partial sums
    let l2: [__m512; 4] = std::array::from_fn(|q| {
        let (a, b) = (l1[2 * q], l1[2 * q + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // l and l + 2, then l and l + 1, within each quarter
    let l3: [__m512; 2] = std::array::from_fn(|r| {
        let (a, b) = (l2[2 * r], l2[2 * r + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xEE>(a, b),
        )
    });
    _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(l3[0], l3[1]),
        _mm512_shuffle_ps::<0xDD>(l3[0], l3[1]),
    )
}

/// The sum of v's sixteen lanes in the order `sum_lanes16` sums each of its lanes (i with
/// i + 8, then i + 4, i + 2, i + 1): a lone output of `dot_grid`, bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sum_lanes_tree(v: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    sum_lanes8(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
}

/// Each of four registers' lane sums, `sum_lanes_tree` bit for bit (the same pairs added at
/// every level: i with i + 8, i + 4, i + 2, i + 1), with the last three levels run on all four
/// at once: two registers of two rows' eight sums, then one of their four.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn sum_lanes_tree4(v: [std::arch::x86_64::__m512; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    // i + 8: each register's halves added, rows (0, 1) and (2, 3) side by side
    let h = v.map(|v| {
        let hi = _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v));
        _mm256_castps_pd(_mm256_add_ps(
            _mm512_castps512_ps256(v),
            _mm256_castpd_ps(hi),
        ))
    });
    let pair = |a: __m256d, b: __m256d| {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castpd256_pd512(a), b))
    };
    let (ab, cd) = (pair(h[0], h[1]), pair(h[2], h[3]));
    // i + 4: the low and the high quarter of each row's eight, row r's four in quarter r
    let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd);
    let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd);
    let s4 = _mm512_add_ps(lo, hi);
    // i + 2, then i + 1, within each quarter: its first lane holds the row's sum
    let s2 = _mm512_add_ps(s4, _mm512_permute_ps::<0b00_00_11_10>(s4));
    let s1 = _mm512_add_ps(s2, _mm512_permute_ps::<0b00_00_00_01>(s2));
    let mut lanes = [0.0; 16];
    // SAFETY: sixteen f32 into sixteen.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), s1) };
    [lanes[0], lanes[4], lanes[8], lanes[12]]
}

/// The sum of a's eight lanes, i with i + 4, then i + 2, i + 1: the last three levels of
/// `sum_lanes_tree`, and the sums of `dot_tree8`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
pub(crate) fn sum_lanes8(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps::<1>(c, c)))
}

/// Eight values from `p` widened to f32 on AVX2: f32 as they are; bf16 zero-extended to 32
/// bits and shifted into the upper half, as `load16` widens sixteen.
///
/// # Safety
/// AVX2; `p..p + 8` is in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) unsafe fn load8<T: Elem>(p: *const T) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees eight values from p in bounds.
    unsafe {
        if !T::BF16 {
            return _mm256_loadu_ps(p as *const f32);
        }
        let bits = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
    }
}

/// `dot_tree` on AVX2, one row: xs[i] · w for the Q rows of xs (each w.len() long), w loaded
/// (and widened, for bf16 and q8_0: `Lanes8`) once for all of them; FMAs over pairs of blocks
/// of eight columns into two accumulators (so that one block's FMA does not wait for the
/// last), their sum's lanes summed by `sum_lanes8`, and a ragged tail of fewer than eight
/// values added one at a time. With N > 0 the caller has checked w.len() = 16·N, and the loop
/// unrolls.
///
/// # Safety
/// AVX2 and FMA; xs holds Q · w.len() values; where N > 0, w.len() = 16·N; blocks (q8_0) are
/// whole heads (`Lanes8::load`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn dot_tree8<const Q: usize, const N: usize, W: Lanes8>(
    xs: &[f32],
    w: W,
) -> [f32; Q] {
    use std::arch::x86_64::*;
    let len = if N > 0 { 16 * N } else { w.len() };
    let mut acc = [[_mm256_setzero_ps(); 2]; Q];
    // 1. Pairs of eight while they last: a loop of len / 16 trips, which with N > 0 is known
    //    when compiled, so that it unrolls and a q8_0 block's offsets and scale are worked
    //    out once, not per load
    let pairs = len / 16;
    for pair in 0..pairs {
        let p = 16 * pair;
        // SAFETY: p + 16 ≤ len: w holds len values and xs Q·len (the contract).
        unsafe {
            let (w0, w1) = (w.load(p), w.load(p + 8));
            for (i, a) in acc.iter_mut().enumerate() {
                let x = xs.as_ptr().add(i * len + p);
                a[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), a[0]);
                a[1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.add(8)), a[1]);
            }
        }
    }
    // 2. Then one eight where it fits, and the rest one at a time (step 3)
    let mut p = 16 * pairs;
    if p + 8 <= len {
        // SAFETY: p + 8 ≤ len, as above.
        unsafe {
            let w0 = w.load(p);
            for (i, a) in acc.iter_mut().enumerate() {
                let x = xs.as_ptr().add(i * len + p);
                a[0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x), a[0]);
            }
        }
        p += 8;
    }
    // 3. Each query's sum: the two accumulators' lanes, then the ragged tail
    let mut out = [0f32; Q];
    for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        *o = sum_lanes8(_mm256_add_ps(a[0], a[1]));
        for (c, x) in xs[i * len + p..(i + 1) * len].iter().enumerate() {
            *o = x.mul_add(w.at(p + c), *o);
        }
    }
    out
}

/// xs[i] · w_r for the Q rows of xs and each of the R rows `ws` (each `len` long, Lanes16),
/// each summed exactly as `dot_grid` sums its outputs (FMAs over blocks of 16 columns into one
/// accumulator, then `sum_lanes_tree`'s order), each block of w loaded (and widened, for bf16
/// and q8_0) once for all the queries, each block of x once for all the rows. A lone decoding
/// row reads its weight rows one after another, start to end (R = 1), where `dot_grid`'s one
/// by sixteen block streams sixteen at once, and gets the same bits as in a batch; decoding's
/// attention scores four cached key rows at a time for a GQA group's queries (R = 4: sixteen
/// chains in flight, and the four rows' sums reduced together, `sum_lanes_tree4`). With N > 0
/// the caller has checked len = 16·N, and the loop unrolls with every lane on. With `stream`,
/// each step also asks for each w's line `STREAM_AHEAD` bytes on (`prefetch_stream`): a lone
/// row's weights, read once a token.
///
/// # Safety
/// AVX-512F; every w has the same length, and xs holds Q times it; where N > 0, that length
/// is 16·N; blocks (q8_0) are whole heads, 32 values each (`Lanes16::load`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn dot_tree<const R: usize, const Q: usize, const N: usize, W: Lanes16>(
    xs: &[f32],
    ws: [W; R],
    stream: bool,
) -> [[f32; Q]; R] {
    use std::arch::x86_64::*;
    let len = if N > 0 { 16 * N } else { ws[0].len() };
    let mut acc = [[_mm512_setzero_ps(); Q]; R];
    for p in (0..len).step_by(16) {
        // SAFETY: the loads read no further than the len − p values left of each w and of
        // each x row.
        unsafe {
            let xv: [__m512; Q] =
                std::array::from_fn(|i| load_f32(xs.as_ptr().add(i * len + p), len - p));
            for (w, acc) in ws.iter().zip(acc.iter_mut()) {
                if stream {
                    prefetch_stream(w.addr(p));
                }
                let wv = w.load(p, len - p);
                for (a, x) in acc.iter_mut().zip(xv) {
                    *a = _mm512_fmadd_ps(wv, x, *a);
                }
            }
        }
    }
    let mut out = [[0.0; Q]; R];
    if R == 4 {
        for i in 0..Q {
            let sums = sum_lanes_tree4(std::array::from_fn(|r| acc[r][i]));
            for (o, s) in out.iter_mut().zip(sums) {
                o[i] = s;
            }
        }
    } else {
        for (o, a) in out.iter_mut().zip(acc) {
            *o = a.map(|a| sum_lanes_tree(a));
        }
    }
    out
}

/// Lane r·O + o is x_r · w_o for R input rows `xs` and O weight rows `ws` (R·O = 16), each `len`
/// long: one accumulator per pair, FMAs over blocks of 16 columns, then `sum_lanes16` (one
/// 16 × 16 transpose instead of reducing each pair's partial sums apart). Each lane is summed
/// in the same order whatever R and O, so a product's outputs do not depend on how its rows
/// and outputs were grouped: decoding gives a sequence the same numbers
/// whether it runs alone (1 × 16) or in a batch (4 × 4), and a batch reads each weight once
/// for four rows. With `ahead` > 0, each step also asks for the cache line `ahead` values past
/// each weight row's into L2 (the rows a caller reads next, so that their loads from memory
/// overlap this block's arithmetic; a hint, which reads nothing). L2, not L1: sixteen weight
/// rows of a block are as large as L1, which the next block's would evict them from while the
/// other row groups still read them (batch 16, `medium`: 1.09× the decode's tokens/s).
///
/// # Safety
/// AVX-512F; every pointer has `len` values in bounds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn dot_grid<const R: usize, const O: usize, T: Elem>(
    xs: [*const f32; R],
    ws: [*const T; O],
    len: usize,
    ahead: usize,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    debug_assert_eq!(R * O, 16);
    let mut acc = [_mm512_setzero_si512(); 16];
    for p in (0..len).step_by(16) {
        // (loops, not closures: a closure would not inherit this fn's target features)
        let (mut xv, mut wv) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); O]);
        for r in 0..R {
            // SAFETY: p < len, and the loads read no further than len (the contract).
            xv[r] = unsafe { load_f32(xs[r].add(p), len - p) };
        }
        for o in 0..O {
            // SAFETY: as above.
            wv[o] = unsafe { load16(ws[o].add(p), len - p) };
            if ahead > 0 {
                _mm_prefetch::<_MM_HINT_T1>(ws[o].wrapping_add(ahead + p) as *const i8);
            }
        }
        for r in 0..R {
            for o in 0..O {
                let a = &mut acc[r * O + o];
                *a = _mm512_castps_si512(_mm512_fmadd_ps(wv[o], xv[r], _mm512_castsi512_ps(*a)));
            }
        }
    }
    sum_lanes16(acc)
}

/// Σ a·b with 64 independent partial sums in four vector registers, so that neither the
/// float-ordering rules (a plain iterator sum is one serial chain) nor the FMA latency (one
/// accumulator register is a chain too) hold it back.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_with(a, b, |y: f32| y)
}

/// Σ a·b with b's values widened to f32 on the fly (f32, or a bf16 cache's), summed as `dot`
/// sums.
#[inline]
pub fn dot_elems<T: Elem>(a: &[f32], b: &[T]) -> f32 {
    dot_with(a, b, T::widen)
}

/// y += alpha · x, x's values widened to f32 on the fly.
#[inline]
pub fn axpy_elems<T: Elem>(y: &mut [f32], alpha: f32, x: &[T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = alpha.mul_add(x.widen(), *y);
    }
}

/// Σ a·b with b in bf16 (the weights a bf16 decode reads): widened exactly to f32 on the fly,
/// summed as `dot` sums.
#[inline]
pub fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    dot_with(a, b, bf16_to_f32)
}

/// A bf16 value (its 16 bits) as the f32 it stands for: the upper half of the f32's bits.
#[inline(always)]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// `dot` over b's elements widened by `f`: the loop shape of the sum is the same for every
/// element type, so it lives once.
#[inline(always)]
fn dot_with<T: Copy>(a: &[f32], b: &[T], f: impl Fn(T) -> f32) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let (mut s0, mut s1, mut s2, mut s3) = ([0f32; 16], [0f32; 16], [0f32; 16], [0f32; 16]);
    let (a64, b64) = (a.chunks_exact(64), b.chunks_exact(64));
    let (ar, br) = (a64.remainder(), b64.remainder());
    for (x, y) in a64.zip(b64) {
        let (x, y): (&[f32; 64], &[T; 64]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for i in 0..16 {
            s0[i] = x[i].mul_add(f(y[i]), s0[i]);
            s1[i] = x[16 + i].mul_add(f(y[16 + i]), s1[i]);
            s2[i] = x[32 + i].mul_add(f(y[32 + i]), s2[i]);
            s3[i] = x[48 + i].mul_add(f(y[48 + i]), s3[i]);
        }
    }
    let (a16, b16) = (ar.chunks_exact(16), br.chunks_exact(16));
    let (ar, br) = (a16.remainder(), b16.remainder());
    for (x, y) in a16.zip(b16) {
        for i in 0..16 {
            s0[i] = x[i].mul_add(f(y[i]), s0[i]);
        }
    }
    let mut s = 0.0;
    for i in 0..16 {
        s += (s0[i] + s1[i]) + (s2[i] + s3[i]);
    }
    for (x, &y) in ar.iter().zip(br) {
        s += x * f(y);
    }
    s
}

/// exp(x) for x ≤ 0 (scores minus their row maximum, and the like), written so that loops over
/// it vectorise: x = n·ln2 + r with |r| ≤ ln2/2, e^r by a degree-6 polynomial (relative error
/// below 3e-7), 2^n built in the exponent bits. The rounding and the float → integer step use
/// the magic-constant trick rather than casts, which would be scalar. Inputs below −87 return
/// 0, as does −∞ (masked keys).
#[inline(always)]
pub fn exp_nonpos(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    const SHIFT: f32 = 8_388_608.0; // 2^23: an integer below it lands in the mantissa bits
    let xc = x.max(-87.0);
    let n = (xc * std::f32::consts::LOG2_E + ROUND) - ROUND;
    // Cody–Waite: ln 2 in two parts, so that r stays exact for |n| up to 126.
    let r = n.mul_add(-0.693_359_4, xc);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p: f32 = 1.0 / 720.0;
    p = p.mul_add(r, 1.0 / 120.0);
    p = p.mul_add(r, 1.0 / 24.0);
    p = p.mul_add(r, 1.0 / 6.0);
    p = p.mul_add(r, 0.5);
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    // n + 127 is an integer in [1, 127]: its bits below 2^23, moved into the exponent, are 2^n.
    let biased = (n + 127.0 + SHIFT).to_bits() & 0x7f_ffff;
    let scale = f32::from_bits(biased << 23);
    if x <= -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `exp_nonpos` on 16 lanes, step for step: the same value in every lane, bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn exp_nonpos16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let c = _mm512_set1_ps;
    let xc = _mm512_max_ps(x, c(-87.0));
    let round = c(12_582_912.0);
    let n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(xc, c(std::f32::consts::LOG2_E)), round),
        round,
    );
    let r = _mm512_fmadd_ps(n, c(-0.693_359_4), xc);
    let r = _mm512_fmadd_ps(n, c(2.121_944_4e-4), r);
    let mut p = c(1.0 / 720.0);
    for k in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, c(k));
    }
    let biased = _mm512_castps_si512(_mm512_add_ps(_mm512_add_ps(n, c(127.0)), c(8_388_608.0)));
    let two_n = _mm512_slli_epi32::<23>(_mm512_and_si512(biased, _mm512_set1_epi32(0x7f_ffff)));
    let above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, c(-87.0));
    _mm512_maskz_mul_ps(above, p, _mm512_castsi512_ps(two_n))
}

/// `exp_nonpos` on 8 lanes (AVX2 and FMA), step for step as `exp_nonpos16`: the same value in
/// every lane, bit for bit.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) fn exp_nonpos8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let c = _mm256_set1_ps;
    let xc = _mm256_max_ps(x, c(-87.0));
    let round = c(12_582_912.0);
    let n = _mm256_sub_ps(
        _mm256_add_ps(_mm256_mul_ps(xc, c(std::f32::consts::LOG2_E)), round),
        round,
    );
    let r = _mm256_fmadd_ps(n, c(-0.693_359_4), xc);
    let r = _mm256_fmadd_ps(n, c(2.121_944_4e-4), r);
    let mut p = c(1.0 / 720.0);
    for k in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, c(k));
    }
    let biased = _mm256_castps_si256(_mm256_add_ps(_mm256_add_ps(n, c(127.0)), c(8_388_608.0)));
    let two_n = _mm256_slli_epi32::<23>(_mm256_and_si256(biased, _mm256_set1_epi32(0x7f_ffff)));
    let above = _mm256_cmp_ps::<_CMP_GT_OQ>(x, c(-87.0));
    _mm256_and_ps(above, _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)))
}

/// The max of a's eight lanes as `MAX` folds them: i with i + 4, then i + 2, i + 1 (the last
/// three levels of `fold_lanes`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
#[inline]
fn max_lanes8(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    // MAX(a, b) keeps a unless b > a: `_mm_max_ps(b, a)`
    let lo = _mm256_castps256_ps128(a);
    let b = _mm_max_ps(_mm256_extractf128_ps::<1>(a), lo);
    let c = _mm_max_ps(_mm_movehl_ps(b, b), b);
    _mm_cvtss_f32(_mm_max_ss(_mm_shuffle_ps::<1>(c, c), c))
}

/// `map_lanes(row, |i, x| if i < valid { x * scale } else { −∞ }, MAX)` on AVX2, bit for bit
/// (the online softmax's first pass over a row of scores, `valid` keys seen): lanes 0..8 and
/// 8..16 of each 16 in two registers, folded as `fold_lanes` folds, a tail of fewer than 16
/// one at a time.
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scale_max8(row: &mut [f32], scale: f32, valid: usize) -> f32 {
    use std::arch::x86_64::*;
    let (sc, ninf) = (_mm256_set1_ps(scale), _mm256_set1_ps(f32::NEG_INFINITY));
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let mut acc = [ninf; 2];
    let whole = row.len() / 16 * 16;
    let (body, tail) = row.split_at_mut(whole);
    for (j, v) in body.chunks_exact_mut(8).enumerate() {
        // SAFETY: v holds eight values (chunks_exact_mut).
        let x = unsafe { _mm256_mul_ps(_mm256_loadu_ps(v.as_ptr()), sc) };
        let x = if 8 * (j + 1) <= valid {
            x
        } else {
            let idx = _mm256_add_epi32(lanes, _mm256_set1_epi32(8 * j as i32));
            let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid as i32), idx);
            _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(keep))
        };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), x) };
        acc[j % 2] = _mm256_max_ps(x, acc[j % 2]);
    }
    let mut rest = f32::NEG_INFINITY;
    for (i, x) in tail.iter_mut().enumerate() {
        *x = if whole + i < valid {
            *x * scale
        } else {
            f32::NEG_INFINITY
        };
        rest = MAX.1(rest, *x);
    }
    MAX.1(max_lanes8(_mm256_max_ps(acc[1], acc[0])), rest)
}

/// `map_lanes(row, |_, x| exp_nonpos(x − m), SUM)` on AVX2, bit for bit (the online softmax's
/// second pass: P = exp(S − m) and its row sum).
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_sum8(row: &mut [f32], m: f32) -> f32 {
    use std::arch::x86_64::*;
    let mv = _mm256_set1_ps(m);
    let mut acc = [_mm256_setzero_ps(); 2];
    let whole = row.len() / 16 * 16;
    let (body, tail) = row.split_at_mut(whole);
    for (j, v) in body.chunks_exact_mut(8).enumerate() {
        // SAFETY: v holds eight values (chunks_exact_mut).
        let e = unsafe { exp_nonpos8(_mm256_sub_ps(_mm256_loadu_ps(v.as_ptr()), mv)) };
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(v.as_mut_ptr(), e) };
        acc[j % 2] = _mm256_add_ps(acc[j % 2], e);
    }
    let mut rest = 0.0;
    for x in tail {
        *x = exp_nonpos(*x - m);
        rest += *x;
    }
    sum_lanes8(_mm256_add_ps(acc[0], acc[1])) + rest
}

/// σ(x) = 1 / (1 + e^−x) through `exp_nonpos` of −|x|, so that it vectorises too.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp_nonpos(-x.abs());
    let s = 1.0 / (1.0 + e);
    if x >= 0.0 {
        s
    } else {
        e * s
    }
}

/// Σ x with 16 partial sums (vectorises, unlike a serial float sum).
#[inline]
pub fn sum_lanes(x: &[f32]) -> f32 {
    reduce_lanes(x, |v| v, SUM)
}

/// f(x) over every element reduced by `op` (identity `id`) in 16 lanes, as `sum_lanes` sums: a
/// row's maximum or its sum of exps, where a serial fold would be one chain of dependent
/// operations.
#[inline(always)]
pub fn reduce_lanes(
    x: &[f32],
    f: impl Fn(f32) -> f32,
    (id, op): (f32, fn(f32, f32) -> f32),
) -> f32 {
    let mut acc = [id; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder().iter().fold(id, |r, &v| op(r, f(v)));
    for c in chunks {
        for i in 0..16 {
            acc[i] = op(acc[i], f(c[i]));
        }
    }
    op(fold_lanes(acc, op), rest)
}

/// Σ a·b·c in 16 lanes (RMSNorm's backward).
#[inline]
pub fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    assert!(a.len() == b.len() && b.len() == c.len());
    let mut acc = [0f32; 16];
    let n = a.len() / 16 * 16;
    let rest: f32 = (n..a.len()).map(|i| a[i] * b[i] * c[i]).sum();
    for ((x, y), z) in a[..n]
        .chunks_exact(16)
        .zip(b[..n].chunks_exact(16))
        .zip(c[..n].chunks_exact(16))
    {
        for i in 0..16 {
            acc[i] = (x[i] * y[i]).mul_add(z[i], acc[i]);
        }
    }
    fold_lanes(acc, SUM.1) + rest
}

/// The 16 lanes folded in halves (8, 4, 2, 1 apart): four vector steps, where a lane-by-lane
/// chain would be fifteen dependent ones.
#[inline(always)]
fn fold_lanes(mut acc: [f32; 16], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            acc[i] = f(acc[i], acc[i + w]);
        }
        w /= 2;
    }
    acc[0]
}

/// x[i] = f(i, x[i]) for every element, and the new values reduced by `op` (identity `id`)
/// in 16 lanes, as `sum_lanes` sums: one pass that vectorises.
#[inline(always)]
pub fn map_lanes(
    x: &mut [f32],
    f: impl Fn(usize, f32) -> f32,
    (id, op): (f32, fn(f32, f32) -> f32),
) -> f32 {
    let mut acc = [id; 16];
    let base = x.len() / 16 * 16;
    let mut chunks = x.chunks_exact_mut(16);
    for (c, xs) in (&mut chunks).enumerate() {
        for i in 0..16 {
            xs[i] = f(16 * c + i, xs[i]);
            acc[i] = op(acc[i], xs[i]);
        }
    }
    let mut rest = id;
    for (i, x) in chunks.into_remainder().iter_mut().enumerate() {
        *x = f(base + i, *x);
        rest = op(rest, *x);
    }
    op(fold_lanes(acc, op), rest)
}

/// A row of scores scaled, −∞ past its first `valid` keys, and their max: the online
/// softmax's first pass (`map_lanes` with `MAX`; on AVX2 `scale_max8`, the same bits).
#[inline]
pub fn scale_max(row: &mut [f32], scale: f32, valid: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::gemm::cpu::avx2_fma() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { scale_max8(row, scale, valid) };
    }
    if valid >= row.len() {
        // a row that sees every key skips the mask, whose index test does not vectorise
        // well (the same values either way)
        return map_lanes(row, |_, x| x * scale, MAX);
    }
    let masked = |c: usize, x: f32| {
        if c < valid {
            x * scale
        } else {
            f32::NEG_INFINITY
        }
    };
    map_lanes(row, masked, MAX)
}

/// P = exp(S − m) in place and its sum: the online softmax's second pass (`map_lanes` with
/// `SUM`; on AVX2 `exp_sum8`, the same bits).
#[inline]
pub fn exp_sum(row: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::gemm::cpu::avx2_fma() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { exp_sum8(row, m) };
    }
    map_lanes(row, |_, x| exp_nonpos(x - m), SUM)
}

/// `map_lanes`'s reductions.
pub const SUM: (f32, fn(f32, f32) -> f32) = (0.0, |a, b| a + b);
pub const MAX: (f32, fn(f32, f32) -> f32) = (f32::NEG_INFINITY, |a, b| if b > a { b } else { a });

/// v *= s, across the pool (a whole activation: one thread alone would be memory-bound).
pub fn scale(v: &mut [f32], s: f32) {
    use rayon::prelude::*;
    v.par_chunks_mut(1 << 14)
        .for_each(|c| c.iter_mut().for_each(|x| *x *= s));
}

/// y += alpha · x
#[inline]
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_elems(y, alpha, x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The passes' shares of the next block's lines follow one another from its first line to
    /// its last, and each share's steps ask for every line of it once, in order, as many each:
    /// an f32 panel of 32 outputs at depth c (2c lines, c steps a pass: one line a step at
    /// most) and int8 tiles (whole lines, a step a block).
    #[test]
    fn the_passes_share_the_next_lines_step_by_step() {
        let base = std::ptr::null::<u8>().wrapping_add(1 << 20);
        let panels = [1, 3, 37, 512, 1408].map(|c| (2 * c, c));
        let tiles = [(9, 16), (18, 16), (47, 44), (94, 44), (2, 1), (4, 1)];
        for (lines, steps) in panels.into_iter().chain(tiles) {
            for passes in 1..=8 {
                let mut at = 0;
                for pass in 0..passes {
                    let next = NextLines::share(base, lines, pass, passes);
                    // (pointer distance without offset_from: the base is no allocation)
                    let start = next.from as usize - base as usize;
                    assert_eq!(start, 64 * at, "{lines} lines, pass {pass} of {passes}");
                    let mut seen = 0;
                    for i in 0..steps {
                        let l = next.part(i, steps);
                        assert_eq!(l.start, seen.min(next.lines), "step {i}");
                        assert!(l.len() <= next.lines.div_ceil(steps));
                        seen = l.end;
                    }
                    assert_eq!(seen, next.lines, "{lines} lines, pass {pass} of {passes}");
                    at += next.lines;
                }
                assert_eq!(at, lines, "{lines} lines, {passes} passes");
                // a panel's pass of c steps, from two passes on, asks for one line a step at most
                if passes >= 2 && lines == 2 * steps {
                    let next = NextLines::share(base, lines, 0, passes);
                    assert!(next.lines <= steps, "{} lines in {steps} steps", next.lines);
                }
            }
        }
    }

    #[test]
    fn fast_exp_is_accurate_on_the_softmax_range() {
        for i in 0..=20000 {
            let x = -(i as f32) * 0.0045; // 0 down to -90
            let (a, e) = (exp_nonpos(x), x.exp());
            // below −87 the result is flushed to 0: an absolute error under e^−87 ≈ 1.7e-38
            assert!(
                (a - e).abs() <= 3e-7 * e + 1.7e-38,
                "exp({x}) = {a}, want {e}"
            );
        }
        assert_eq!(exp_nonpos(f32::NEG_INFINITY), 0.0);
    }

    /// What the vector exps are checked on, lane by lane against `exp_nonpos`: 0 down to
    /// −108 in 4,000 steps, then the edges (±0, either side of the flush to 0 at −87, −∞, a
    /// tiny negative).
    #[cfg(target_arch = "x86_64")]
    fn exp_inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..4000).map(|i| -(i as f32) * 0.0271).collect();
        xs.extend([
            0.0,
            -0.0,
            -86.99,
            -87.0,
            -87.01,
            -1e30,
            f32::NEG_INFINITY,
            -1e-30,
        ]);
        xs
    }

    #[test]
    fn exp_nonpos16_is_exp_nonpos_in_every_lane() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            use std::arch::x86_64::*;
            for chunk in exp_inputs().chunks(16) {
                let mut x = [f32::NEG_INFINITY; 16];
                x[..chunk.len()].copy_from_slice(chunk);
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F was detected; both arrays hold 16 lanes.
                unsafe {
                    let e = exp_nonpos16(_mm512_loadu_ps(x.as_ptr()));
                    _mm512_storeu_ps(got.as_mut_ptr(), e);
                }
                for (&xi, &g) in x.iter().zip(&got) {
                    assert_eq!(g.to_bits(), exp_nonpos(xi).to_bits(), "exp({xi})");
                }
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_softmax_passes_are_exp_nonpos_and_map_lanes_bit_for_bit() {
        if !crate::gemm::cpu::avx2_fma() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        use std::arch::x86_64::*;
        // exp_nonpos8, lane by lane
        for chunk in exp_inputs().chunks(8) {
            let mut x = [f32::NEG_INFINITY; 8];
            x[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0f32; 8];
            // SAFETY: AVX2 and FMA were detected; both arrays hold 8 lanes.
            unsafe { _mm256_storeu_ps(got.as_mut_ptr(), exp_nonpos8(_mm256_loadu_ps(x.as_ptr()))) };
            for (&xi, &g) in x.iter().zip(&got) {
                assert_eq!(g.to_bits(), exp_nonpos(xi).to_bits(), "exp({xi})");
            }
        }
        // the two passes over rows of 64, 32 and ragged lengths (decoding's), every causal
        // cut, against map_lanes
        for len in [32usize, 64, 0, 5, 16, 43, 517] {
            for valid in (1..=len).chain([len + 3]) {
                let row: Vec<f32> = (0..len)
                    .map(|i| ((i * 37 + valid * 11) % 53) as f32 * 0.731 - 19.0)
                    .collect();
                let scale = 0.180_421_3;
                let (mut want, mut got) = (row.clone(), row.clone());
                let mw = map_lanes(
                    &mut want,
                    |i, x| {
                        if i < valid {
                            x * scale
                        } else {
                            f32::NEG_INFINITY
                        }
                    },
                    MAX,
                );
                // SAFETY: AVX2 and FMA were detected.
                let mg = unsafe { scale_max8(&mut got, scale, valid) };
                assert_eq!(mg.to_bits(), mw.to_bits(), "max, valid {valid} of {len}");
                assert!(want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
                let m = mw;
                let sw = map_lanes(&mut want, |_, x| exp_nonpos(x - m), SUM);
                // SAFETY: as above.
                let sg = unsafe { exp_sum8(&mut got, m) };
                assert_eq!(sg.to_bits(), sw.to_bits(), "sum, valid {valid} of {len}");
                assert!(want
                    .iter()
                    .zip(&got)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn fast_sigmoid_matches_the_definition_on_both_sides() {
        for i in -4000..=4000 {
            let x = i as f32 * 0.01;
            let want = 1.0 / (1.0 + (-(x as f64)).exp());
            let got = sigmoid(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * want,
                "σ({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn lane_reductions_match_plain_ones() {
        let x: Vec<f32> = (0..37).map(|i| ((i * 17 % 11) as f32) - 5.0).collect();
        assert_eq!(sum_lanes(&x), x.iter().sum::<f32>());
        let mut y = x.clone();
        let want = (0..37).map(|i| x[i] * i as f32).fold(f32::MIN, f32::max);
        assert_eq!(map_lanes(&mut y, |i, v| v * i as f32, MAX), want);
        assert!(y.iter().enumerate().all(|(i, &v)| v == x[i] * i as f32));
        assert_eq!(map_lanes(&mut [], |_, v| v, MAX), f32::NEG_INFINITY);
        assert_eq!(map_lanes(&mut x.clone(), |_, v| v, SUM), sum_lanes(&x));
    }
}

//! What a KV cache keeps its rows in, and how attention reads them back: f32 or bf16 values,
//! which the loops read in place (`Elem`: bf16 widened as it is loaded), or `Q8Block`s
//! (`--kv-cache q8_0`): 32 int8 quants and one f32 scale, 1.125 bytes a value, rounded by
//! Q8_0's rule (`d = max|x|/127`, `q = round(x/d)`, the weights' and the inputs' rule too).
//! On x86-64 a decoding step reads a head of whole blocks as blocks, widening each 16 (AVX-512)
//! or 8 (AVX2) quants as it loads them (`Lanes16`, `Lanes8`); elsewhere it
//! widens each row into a buffer that stays in L1 and runs the f32 loops over that (on ARM64
//! with NEON, `widen_neon`; rows are stored by `store_neon` there). Memory sees only the
//! blocks either way. A prefill widens the rows it attends to once.

use super::gemm::cpu::Isa;
use super::quant::block::q8_quants;
use super::quant::BLOCK;
use super::Elem;

/// A KV cache's entry type: what `attention_cached` reads and `store` writes.
pub trait KvElem: Copy + Default + Send + Sync + 'static {
    /// What the attention loops read from a row: the value itself, or f32 widened from blocks.
    type Elem: Elem;
    /// Bytes per entry.
    const BYTES: usize;
    /// Entries a row of `width` values takes.
    fn entries(width: usize) -> usize;
    /// Room (f32 values) a reader needs to widen one row of `width` values: 0 where the loops
    /// read rows in place.
    fn room(width: usize) -> usize;
    /// The rows of `width` values in `x`, written as entries into `dst` (as many rows).
    fn store(dst: &mut [Self], x: &[f32], width: usize);
    /// The first `rows` rows of `width` values in `src`, widened to f32 into `out`.
    fn widen(isa: Option<Isa>, src: &[Self], rows: usize, width: usize, out: &mut [f32]);
    /// The entries themselves where they are f32 (read in place), else `None`.
    fn as_f32(x: &[Self]) -> Option<&[f32]>;
    /// Row `r` of `width` values as the loops read it: its values in place, its blocks where
    /// the caller reads blocks (`blocks`: AVX-512, heads of whole blocks), else its values
    /// widened into `buf` (`room(width)` values).
    fn row<'a>(
        isa: Option<Isa>,
        src: &'a [Self],
        r: usize,
        width: usize,
        blocks: bool,
        buf: &'a mut [f32],
    ) -> Row<'a, Self::Elem>;
}

/// A cached row as the decoding loops read it.
#[derive(Clone, Copy)]
pub enum Row<'a, E> {
    /// values, f32 or bf16
    Values(&'a [E]),
    /// q8_0 blocks, widened as they are loaded
    Blocks(&'a [Q8Block]),
}

/// f32 and bf16: a row is its values, read where they lie.
macro_rules! in_place {
    ($t:ty) => {
        impl KvElem for $t {
            type Elem = $t;
            const BYTES: usize = <$t as Elem>::BYTES;
            fn entries(width: usize) -> usize {
                width
            }
            fn room(_: usize) -> usize {
                0
            }
            fn store(dst: &mut [Self], x: &[f32], _: usize) {
                dst.iter_mut()
                    .zip(x)
                    .for_each(|(d, &x)| *d = <$t>::narrow(x));
            }
            fn widen(_: Option<Isa>, src: &[Self], rows: usize, width: usize, out: &mut [f32]) {
                let n = rows * width;
                out[..n]
                    .iter_mut()
                    .zip(&src[..n])
                    .for_each(|(d, x)| *d = x.widen());
            }
            fn as_f32(x: &[Self]) -> Option<&[f32]> {
                <$t as Elem>::as_f32(x)
            }
            #[inline(always)]
            fn row<'a>(
                _: Option<Isa>,
                src: &'a [Self],
                r: usize,
                w: usize,
                _: bool,
                _: &'a mut [f32],
            ) -> Row<'a, $t> {
                Row::Values(&src[r * w..(r + 1) * w])
            }
        }
    };
}
in_place!(f32);
in_place!(half::bf16);

/// 32 values of a cached row as int8 quants and their f32 scale: values `q · d`. A row of a
/// width that is not a multiple of 32 ends in a block padded with zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Q8Block {
    pub d: f32,
    pub qs: [i8; BLOCK],
}

impl Q8Block {
    /// Up to 32 values (zeros past them) as one block.
    pub fn quantize(x: &[f32]) -> Q8Block {
        let (d, qs) = q8_quants(x);
        Q8Block { d, qs }
    }
}

/// A head of whole blocks, each sixteen values loaded as `Q8Block::widen` gives them: the
/// quants sign-extended, converted, times the block's scale.
#[cfg(target_arch = "x86_64")]
impl super::simd::Lanes16 for &[Q8Block] {
    #[inline(always)]
    fn len(self) -> usize {
        BLOCK * <[Q8Block]>::len(self)
    }
    #[inline(always)]
    unsafe fn load(self, p: usize, _n: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        let (b, h) = (&self[p / BLOCK], p % BLOCK);
        // SAFETY: p is a multiple of 16 (the caller's contract), so h ≤ 16 and the 16 quants
        // from h lie inside the block's 32.
        let q = unsafe { _mm_loadu_si128(b.qs.as_ptr().add(h).cast()) };
        // SAFETY: AVX-512F, the caller's contract.
        unsafe {
            _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)),
                _mm512_set1_ps(b.d),
            )
        }
    }
    #[inline(always)]
    fn addr(self, p: usize) -> *const u8 {
        self.as_ptr().wrapping_add(p / BLOCK).cast()
    }
}

/// A head of whole blocks, each eight values loaded as `Q8Block::widen` gives them (`Lanes16`
/// on AVX2).
#[cfg(target_arch = "x86_64")]
impl super::simd::Lanes8 for &[Q8Block] {
    #[inline(always)]
    fn len(self) -> usize {
        BLOCK * <[Q8Block]>::len(self)
    }
    #[inline(always)]
    fn at(self, i: usize) -> f32 {
        let b = &self[i / BLOCK];
        b.qs[i % BLOCK] as f32 * b.d
    }
    #[inline(always)]
    unsafe fn load(self, p: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let (b, h) = (&self[p / BLOCK], p % BLOCK);
        // SAFETY: p is a multiple of 8 (the caller's contract), so h ≤ 24 and the 8 quants
        // from h lie inside the block's 32.
        let q = unsafe { _mm_loadl_epi64(b.qs.as_ptr().add(h).cast()) };
        // SAFETY: AVX2, the caller's contract.
        unsafe {
            _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                _mm256_set1_ps(b.d),
            )
        }
    }
}

impl KvElem for Q8Block {
    type Elem = f32;
    const BYTES: usize = std::mem::size_of::<Q8Block>();
    fn entries(width: usize) -> usize {
        width.div_ceil(BLOCK)
    }
    fn room(width: usize) -> usize {
        width
    }
    fn store(dst: &mut [Self], x: &[f32], width: usize) {
        #[cfg(target_arch = "x86_64")]
        if Isa::Avx512.available() {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { store_avx512(dst, x, width) };
        }
        // SAFETY: NEON, which every ARM64 CPU has.
        #[cfg(target_arch = "aarch64")]
        return unsafe { store_neon(dst, x, width) };
        #[cfg(not(target_arch = "aarch64"))]
        store_blocks(dst, x, width)
    }
    fn widen(isa: Option<Isa>, src: &[Self], rows: usize, width: usize, out: &mut [f32]) {
        let e = Self::entries(width);
        let (src, out) = (&src[..rows * e], &mut out[..rows * width]);
        match isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa` values name units the CPU has (`Isa::available`).
            Some(Isa::Avx512) => unsafe { widen_avx512(src, e, width, out) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: likewise.
            Some(Isa::Avx2) => unsafe { widen_avx2(src, e, width, out) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: likewise.
            Some(Isa::Neon) => unsafe { widen_neon(src, e, width, out) },
            _ => widen_blocks(src, e, width, out),
        }
    }
    fn as_f32(_: &[Self]) -> Option<&[f32]> {
        None
    }
    #[inline(always)]
    fn row<'a>(
        isa: Option<Isa>,
        src: &'a [Self],
        r: usize,
        width: usize,
        blocks: bool,
        buf: &'a mut [f32],
    ) -> Row<'a, f32> {
        let e = Self::entries(width);
        let row = &src[r * e..(r + 1) * e];
        if blocks {
            return Row::Blocks(row);
        }
        Self::widen(isa, row, 1, width, buf);
        Row::Values(&buf[..width])
    }
}

/// The rows of `width` values in `x` as blocks into `dst`, each row's last block padded with
/// zeros. (On ARM64 the tests' reference for `store_neon`, which stores every row there.)
#[cfg_attr(all(target_arch = "aarch64", not(test)), allow(dead_code))]
fn store_blocks(dst: &mut [Q8Block], x: &[f32], width: usize) {
    let rows = dst
        .chunks_exact_mut(Q8Block::entries(width))
        .zip(x.chunks_exact(width));
    for (blocks, x) in rows {
        let parts = blocks.iter_mut().zip(x.chunks(BLOCK));
        parts.for_each(|(b, x)| *b = Q8Block::quantize(x));
    }
}

/// `store_blocks` sixteen lanes at a time (the inputs' quantiser's arithmetic,
/// `quant::block_quants`: the same blocks).
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_avx512(dst: &mut [Q8Block], x: &[f32], width: usize) {
    use std::arch::x86_64::*;
    let rows = dst
        .chunks_exact_mut(Q8Block::entries(width))
        .zip(x.chunks_exact(width));
    for (blocks, x) in rows {
        for (b, x) in blocks.iter_mut().zip(x.chunks(BLOCK)) {
            // SAFETY: the masked loads read the x.len() ≤ 32 values of x alone (zeros past).
            let v = unsafe {
                let n = x.len();
                [
                    _mm512_maskz_loadu_ps(super::lane_mask(n), x.as_ptr()),
                    _mm512_maskz_loadu_ps(
                        super::lane_mask(n.saturating_sub(16)),
                        x.as_ptr().add(16.min(n)),
                    ),
                ]
            };
            let (d, q) = super::quant::block_quants(v);
            b.d = d;
            for (h, q) in q.into_iter().enumerate() {
                // SAFETY: 16 quants at 16h ≤ 16 of the block's 32.
                unsafe {
                    _mm_storeu_si128(
                        b.qs.as_mut_ptr().add(16 * h).cast(),
                        _mm512_cvtsepi32_epi8(q),
                    )
                };
            }
        }
    }
}

/// Each row's `e` blocks into its `width` values of `out`: written so that the compiler
/// vectorises it for the unit of the function it is inlined into (a sign extension, a
/// conversion and a multiply per 16 values on AVX-512), whole blocks in straight lines.
#[inline(always)]
fn widen_blocks(src: &[Q8Block], e: usize, width: usize, out: &mut [f32]) {
    #[inline(always)]
    fn widen<const W: usize>(b: &Q8Block, out: &mut [f32; W]) {
        out.iter_mut()
            .zip(&b.qs)
            .for_each(|(o, &q)| *o = q as f32 * b.d);
    }
    for (blocks, out) in src.chunks_exact(e).zip(out.chunks_exact_mut(width)) {
        let (whole, tail) = out.split_at_mut(width / BLOCK * BLOCK);
        let (whole, ragged) = (whole.as_chunks_mut::<BLOCK>().0, blocks.last());
        blocks.iter().zip(whole).for_each(|(b, o)| widen(b, o));
        if let (Some(b), false) = (ragged, tail.is_empty()) {
            tail.iter_mut()
                .zip(&b.qs)
                .for_each(|(o, &q)| *o = q as f32 * b.d);
        }
    }
}

/// `widen_blocks` compiled for AVX-512F.
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_avx512(src: &[Q8Block], e: usize, width: usize, out: &mut [f32]) {
    widen_blocks(src, e, width, out)
}

/// `widen_blocks` compiled for AVX2.
///
/// # Safety
/// AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_avx2(src: &[Q8Block], e: usize, width: usize, out: &mut [f32]) {
    widen_blocks(src, e, width, out)
}

/// `store_blocks` four lanes at a time on ARM64 (NEON): Q8_0's rule step for step, so the
/// same blocks: the largest magnitude by `fmaxnm` (which, like `f32::max`, passes over a NaN),
/// the scale from `q8_scale`, each value times its inverse rounded half away from zero
/// (`fcvtas`, as `f32::round`) and narrowed with saturation (`sqxtn`, as `as i8`). A ragged
/// last block is copied out and padded with zeros first, which quantise to zeros as the
/// scalar loop leaves them.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn store_neon(dst: &mut [Q8Block], x: &[f32], width: usize) {
    use std::arch::aarch64::*;
    let rows = dst
        .chunks_exact_mut(Q8Block::entries(width))
        .zip(x.chunks_exact(width));
    for (blocks, x) in rows {
        for (b, x) in blocks.iter_mut().zip(x.chunks(BLOCK)) {
            // a whole block read in place (a copy of variable length was a call per block)
            let mut padded = [0f32; BLOCK];
            let src = match <&[f32; BLOCK]>::try_from(x) {
                Ok(whole) => whole,
                Err(_) => {
                    padded[..x.len()].copy_from_slice(x);
                    &padded
                }
            };
            // SAFETY: eight loads of four inside the 32 values of `src`.
            let v: [float32x4_t; 8] =
                std::array::from_fn(|i| unsafe { vld1q_f32(src.as_ptr().add(4 * i)) });
            let amax = v
                .iter()
                .fold(vdupq_n_f32(0.0), |m, &v| vmaxnmq_f32(m, vabsq_f32(v)));
            let (d, id) = super::quant::block::q8_scale(vmaxnmvq_f32(amax));
            let q = v.map(|v| vcvtaq_s32_f32(vmulq_n_f32(v, id)));
            b.d = d;
            for (h, q) in q.chunks_exact(4).enumerate() {
                let lo = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
                let hi = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
                let q8 = vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi));
                // SAFETY: 16 quants at 16h ≤ 16 of the block's 32.
                unsafe { vst1q_s8(b.qs.as_mut_ptr().add(16 * h), q8) };
            }
        }
    }
}

/// `widen_blocks` on ARM64 (NEON), a block at a time: its 32 quants sign-extended twice
/// (`sxtl`), converted (`scvtf`, exact) and multiplied by the block's scale, one rounding as
/// in `q as f32 * d`: the same values. A ragged last block's values one at a time.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn widen_neon(src: &[Q8Block], e: usize, width: usize, out: &mut [f32]) {
    use std::arch::aarch64::*;
    for (blocks, out) in src.chunks_exact(e).zip(out.chunks_exact_mut(width)) {
        let (whole, tail) = out.split_at_mut(width / BLOCK * BLOCK);
        let whole = whole.as_chunks_mut::<BLOCK>().0;
        for (b, o) in blocks.iter().zip(whole) {
            // SAFETY: two loads of 16 inside the block's 32 quants.
            let q = unsafe { [vld1q_s8(b.qs.as_ptr()), vld1q_s8(b.qs.as_ptr().add(16))] };
            let h = [
                vmovl_s8(vget_low_s8(q[0])),
                vmovl_high_s8(q[0]),
                vmovl_s8(vget_low_s8(q[1])),
                vmovl_high_s8(q[1]),
            ];
            for (k, h) in h.into_iter().enumerate() {
                let w = [vmovl_s16(vget_low_s16(h)), vmovl_high_s16(h)];
                for (l, w) in w.into_iter().enumerate() {
                    let f = vmulq_n_f32(vcvtq_f32_s32(w), b.d);
                    // SAFETY: four values at 8k + 4l + 4 ≤ 32 of the block's.
                    unsafe { vst1q_f32(o.as_mut_ptr().add(8 * k + 4 * l), f) };
                }
            }
        }
        if let (Some(b), false) = (blocks.last(), tail.is_empty()) {
            tail.iter_mut()
                .zip(&b.qs)
                .for_each(|(o, &q)| *o = q as f32 * b.d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of ragged and whole widths quantise by Q8_0's rule (within half a step of each
    /// value, the largest magnitude exact, a zero block all zeros), to the same blocks on
    /// AVX-512 or NEON and in the scalar loop (ties, which round away from zero, included),
    /// and widen to the same f32 on every unit the CPU has and on the portable loop.
    #[test]
    fn q8_rows_round_by_q8_0s_rule_and_widen_alike_on_every_path() {
        let mut seed = 7u32;
        let mut rand = |n: usize| crate::lcg_values(n, &mut seed, 3.0);
        for width in [8, 20, 32, 40, 64, 100, 128] {
            let rows = 5;
            let mut x = rand(rows * width);
            x[width..2 * width].fill(0.0);
            // a block whose scale is 1: values halfway between quants, either sign
            x[2 * width..2 * width + 8]
                .copy_from_slice(&[127.0, 0.5, -2.5, 1.5, -0.5, 3.5, -126.5, 0.0]);
            let mut blocks = vec![Q8Block::default(); rows * Q8Block::entries(width)];
            Q8Block::store(&mut blocks, &x, width);
            // the vector quantiser (where the CPU has AVX-512) writes the scalar one's blocks
            let mut scalar = vec![Q8Block::default(); blocks.len()];
            store_blocks(&mut scalar, &x, width);
            assert_eq!(blocks, scalar, "{width}");
            let mut want = vec![0f32; rows * width];
            Q8Block::widen(None, &blocks, rows, width, &mut want);
            for (r, (x, y)) in x.chunks(width).zip(want.chunks(width)).enumerate() {
                for (xb, yb) in x.chunks(BLOCK).zip(y.chunks(BLOCK)) {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let step = amax / 127.0;
                    for (a, b) in xb.iter().zip(yb) {
                        assert!(
                            (a - b).abs() <= 0.5 * step * 1.0001,
                            "{width} {r}: {a} vs {b}"
                        );
                        if a.abs() == amax {
                            assert!(
                                (a - b).abs() <= 1e-6 * amax,
                                "{width}: the largest, {a} {b}"
                            );
                        }
                    }
                }
                if r == 1 {
                    assert!(y.iter().all(|&v| v == 0.0));
                }
            }
            for isa in Isa::available_all() {
                let mut got = vec![0f32; rows * width];
                Q8Block::widen(Some(isa), &blocks, rows, width, &mut got);
                assert_eq!(got, want, "{width} {isa:?}");
                let mut buf = vec![0f32; Q8Block::room(width)];
                match Q8Block::row(Some(isa), &blocks, 3, width, false, &mut buf) {
                    Row::Values(v) => assert_eq!(v, &want[3 * width..4 * width]),
                    Row::Blocks(_) => panic!("{width}: blocks where values were asked for"),
                }
                let e = Q8Block::entries(width);
                match Q8Block::row(Some(isa), &blocks, 3, width, true, &mut buf) {
                    Row::Blocks(b) => assert_eq!(b, &blocks[3 * e..4 * e]),
                    Row::Values(_) => panic!("{width}: values where blocks were asked for"),
                }
            }
        }
    }
}

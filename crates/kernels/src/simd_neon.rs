//! ARM64's vector helpers for the decoding attention (NEON, which every ARM64 CPU has): four
//! lanes of f32 at a time, widened from f32 or bf16 rows as they are loaded, the role
//! `load8`, `dot_tree8` and `weighted_row_avx2` play on x86-64.
//!
//! Sized from the published limits: Apple's M-series performance cores and Neoverse V1/V2 run
//! four 128-bit FMAs a cycle at a latency of 3–4 cycles (N1: two), so a dot product keeps four
//! chains of FMAs per query (sixteen values a step) and a GQA group's four queries sixteen.

use super::Elem;
use std::arch::aarch64::*;

/// Four values from `p` widened to f32: f32 as they are; bf16 shifted into the upper half of
/// each 32-bit lane (`shll`), exactly the f32 each stands for.
///
/// # Safety
/// NEON (every ARM64 CPU); `p..p + 4` is in bounds.
#[target_feature(enable = "neon")]
#[inline]
pub(crate) unsafe fn load4<T: Elem>(p: *const T) -> float32x4_t {
    // SAFETY: four values from p (the caller's contract).
    unsafe {
        if T::BF16 {
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.cast())))
        } else {
            vld1q_f32(p.cast())
        }
    }
}

/// xs[i] · w for the Q rows of xs (each w.len() long): w loaded (and widened, for bf16) once
/// for all of them; FMAs over blocks of sixteen columns into four accumulators per row, then
/// a block of four at a time into the first, their sum's lanes added (`faddp`, `faddv`), and a
/// ragged tail of fewer than four values one at a time. Panics unless xs holds Q · w.len()
/// values. The loop is kept rolled whatever N (the x86 loops' unrolled widths): unrolled
/// whole, the loop for four queries of 64 kept all of k's row in registers beside the 16 sums
/// and spilled (237 instructions a row, 36 of them to and from the stack); rolled, a step is
/// its 4 + 16 loads and 16 FMAs. (NEON: every ARM64 CPU has it, so any caller may assert it.)
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn dot_rows<const Q: usize, const N: usize, T: Elem>(xs: &[f32], w: &[T]) -> [f32; Q] {
    debug_assert!(N == 0 || w.len() == 16 * N);
    // (hidden from the optimiser, which knows it from the caller's asserts and would unroll)
    let len = std::hint::black_box(w.len());
    assert!(xs.len() >= Q * len);
    let (wp, xp) = (w.as_ptr(), xs.as_ptr());
    let mut acc = [[vdupq_n_f32(0.0); 4]; Q];
    let mut p = 0;
    // SAFETY (each load): p + 16, then p + 4, ≤ len values of w and of each row of xs
    // (asserted).
    while p + 16 <= len {
        // (four named loads, not an array: an array of them was kept on the stack)
        let (w0, w1, w2, w3) = unsafe {
            let w = wp.add(p);
            (load4(w), load4(w.add(4)), load4(w.add(8)), load4(w.add(12)))
        };
        for (i, a) in acc.iter_mut().enumerate() {
            let x = xp.wrapping_add(i * len + p);
            unsafe {
                a[0] = vfmaq_f32(a[0], w0, vld1q_f32(x));
                a[1] = vfmaq_f32(a[1], w1, vld1q_f32(x.add(4)));
                a[2] = vfmaq_f32(a[2], w2, vld1q_f32(x.add(8)));
                a[3] = vfmaq_f32(a[3], w3, vld1q_f32(x.add(12)));
            }
        }
        p += 16;
    }
    while p + 4 <= len {
        let wv = unsafe { load4(wp.add(p)) };
        for (i, a) in acc.iter_mut().enumerate() {
            a[0] = vfmaq_f32(a[0], wv, unsafe { vld1q_f32(xp.add(i * len + p)) });
        }
        p += 4;
    }
    let mut out = [0f32; Q];
    for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
        *o = vaddvq_f32(vaddq_f32(vaddq_f32(a[0], a[1]), vaddq_f32(a[2], a[3])));
        for (x, w) in xs[i * len + p..(i + 1) * len].iter().zip(&w[p..len]) {
            *o = x.mul_add(w.widen(), *o);
        }
    }
    out
}

/// heads[i·part..][..dv] += heads[i·part + at] · v for the Q partials in `heads`: four lanes
/// at a time, each block of v loaded (and widened) once for all of them, a ragged tail of
/// fewer than four one at a time. Each value is one fused multiply-add, as `axpy_elems` does
/// it: the same bits as the portable loop. Panics unless heads holds Q partials of `part`
/// values and dv ≤ at < part (dv = 16·N where N > 0, else v.len()).
#[target_feature(enable = "neon")]
#[inline]
pub(crate) fn weighted_row<const Q: usize, const N: usize, T: Elem>(
    heads: &mut [f32],
    part: usize,
    at: usize,
    v: &[T],
) {
    let dv = if N > 0 { 16 * N } else { v.len() };
    let full = dv / 4 * 4;
    assert!(heads.len() >= Q * part && dv <= at && at < part && v.len() >= dv);
    let p: [f32; Q] = std::array::from_fn(|i| heads[i * part + at]);
    for c in (0..full).step_by(4) {
        // SAFETY: c + 4 ≤ dv values of v and of each partial's first dv (asserted).
        unsafe {
            let x = load4(v.as_ptr().add(c));
            for (i, &p) in p.iter().enumerate() {
                let a = heads.as_mut_ptr().add(i * part + c);
                vst1q_f32(a, vfmaq_n_f32(vld1q_f32(a), x, p));
            }
        }
    }
    for (o, &p) in heads.chunks_exact_mut(part).zip(&p) {
        super::axpy_elems(&mut o[full..dv], p, &v[full..dv]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// Every length from 0 to 70 (blocks of sixteen, of four, a tail of one to three), f32 and
    /// bf16 rows, one to four queries: `dot_rows` within rounding of the portable `dot_elems`
    /// (a different order of sums), `weighted_row` bit for bit the portable `axpy_elems`;
    /// the unrolled lengths (N = 2, 4) as the general ones.
    #[test]
    fn dot_rows_and_weighted_rows_match_the_portable_loops() {
        fn check<const Q: usize, const N: usize, T: Elem>(len: usize, seed: &mut u32) {
            let w: Vec<T> = crate::lcg_values(len, seed, 2.0)
                .into_iter()
                .map(T::narrow)
                .collect();
            let mut xs = crate::lcg_values(Q * len, seed, 1.0);
            xs.iter_mut().step_by(5).for_each(|x| *x *= 1e3);
            // SAFETY: NEON, which every ARM64 CPU has.
            let got = unsafe { dot_rows::<Q, N, T>(&xs, &w) };
            for (i, g) in got.into_iter().enumerate() {
                let x = &xs[i * len..(i + 1) * len];
                let want = crate::dot_elems(x, &w);
                let scale: f32 = x.iter().zip(&w).map(|(a, b)| (a * b.widen()).abs()).sum();
                assert!(
                    (g - want).abs() <= 1e-6 * (1.0 + scale),
                    "{len} {i}: {g} {want}"
                );
            }
            let part = len + 3;
            let heads = crate::lcg_values(Q * part, seed, 1.0);
            let (mut a, mut b) = (heads.clone(), heads);
            // SAFETY: as above.
            unsafe { weighted_row::<Q, N, T>(&mut a, part, len + 1, &w) };
            for o in b.chunks_exact_mut(part) {
                let p = o[len + 1];
                crate::axpy_elems(&mut o[..len], p, &w);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{len}, {Q} queries");
        }
        let mut seed = 5;
        for len in 0..=70 {
            check::<1, 0, f32>(len, &mut seed);
            check::<4, 0, f32>(len, &mut seed);
            check::<2, 0, bf16>(len, &mut seed);
        }
        check::<4, 2, f32>(32, &mut seed);
        check::<1, 4, bf16>(64, &mut seed);
    }
}

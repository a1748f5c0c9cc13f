//! f32 weights packed in panels of `PANEL` outputs, k-major, for products of few input rows
//! (a server's decoding batch, batched generation). Each step of the inner loop loads
//! one k of a panel (two registers) and multiplies it by up to `PANEL_ROWS` input values
//! broadcast, an outer product: no loads of input rows as vectors, no sums reduced across lanes
//! at the end (`dot_grid`'s costs), and each output is the sum over k in order in one lane,
//! whatever the rows beside it, so a sequence's numbers do not depend on its batch. Where a
//! batch passes over a panel more than once, each pass also fetches its share of the next
//! panel (`NextLines`, a line a step of its depth at most), so that the memory streams while
//! the later passes reread this one.

use crate::NextLines;

/// Outputs a panel holds (the last panel of a matrix is padded with zeros).
pub const PANEL: usize = 32;

/// Input rows one pass over a panel multiplies at most (two accumulators each). Sixteen rows
/// over one half of a panel at a time (one accumulator each, twice the work per weight byte
/// brought in) decoded a batch of 16 at `medium` at 0.62–0.86× this.
pub const PANEL_ROWS: usize = 8;

/// Values that `w` (oc, c) takes in panels (the last one padded with zeros).
pub fn packed_len(oc: usize, c: usize) -> usize {
    oc.div_ceil(PANEL) * PANEL * c
}

/// `w` (oc, c) in panels: output o = 32·b + j at k is value b·32·c + k·32 + j.
pub fn pack(w: &[f32], oc: usize, c: usize) -> Vec<f32> {
    let mut p = vec![0f32; packed_len(oc, c)];
    pack_into(&mut p, w, oc, c);
    p
}

/// `pack` into `p` (`packed_len(oc, c)` zeros).
pub fn pack_into(p: &mut [f32], w: &[f32], oc: usize, c: usize) {
    assert!(w.len() >= oc * c, "panels::pack: weight too small");
    assert_eq!(p.len(), packed_len(oc, c));
    for (o, row) in w.chunks_exact(c).take(oc).enumerate() {
        let panel = &mut p[(o / PANEL) * PANEL * c..][..PANEL * c];
        for (k, &v) in row.iter().enumerate() {
            panel[k * PANEL + o % PANEL] = v;
        }
    }
}

/// Sums of rows r < R of `x` (rows of `c` values) with the 32 outputs of `panel`: lane j of row r
/// is Σ_k x[r·c + k] · panel[k·32 + j], one fused multiply-add after another in k order,
/// whatever R. Fetches `next`'s lines as it goes.
pub fn rows<const R: usize>(
    x: &[f32],
    c: usize,
    panel: &[f32],
    next: NextLines,
) -> [[f32; PANEL]; R] {
    assert!(R <= PANEL_ROWS && x.len() >= R * c && panel.len() >= PANEL * c);
    #[cfg(target_arch = "x86_64")]
    if super::cpu::avx512f() {
        // SAFETY: AVX-512F detected; the lengths were checked above.
        return unsafe { rows_avx512::<R>(x, c, panel, next) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::cpu::avx2_fma() {
        let mut out = [[0f32; PANEL]; R];
        // SAFETY: AVX2 and FMA detected; the lengths were checked above.
        unsafe { rows_avx2(&mut out, x, c, panel, next) };
        return out;
    }
    #[cfg(target_arch = "aarch64")]
    if super::cpu::neon() {
        let mut out = [[0f32; PANEL]; R];
        // SAFETY: NEON detected; the lengths were checked above.
        unsafe { rows_neon(&mut out, x, c, panel, next) };
        return out;
    }
    rows_portable::<R>(x, c, panel, next)
}

/// `rows` one value at a time, on any CPU.
fn rows_portable<const R: usize>(
    x: &[f32],
    c: usize,
    panel: &[f32],
    next: NextLines,
) -> [[f32; PANEL]; R] {
    let mut acc = [[0f32; PANEL]; R];
    for k in 0..c {
        next.fetch(k, c);
        let w = &panel[k * PANEL..][..PANEL];
        for (r, a) in acc.iter_mut().enumerate() {
            let b = x[r * c + k];
            for (a, &w) in a.iter_mut().zip(w) {
                *a = b.mul_add(w, *a);
            }
        }
    }
    acc
}

/// `rows` with AVX-512: the same fused multiply-adds in the same order, sixteen lanes at a time.
///
/// # Safety
/// AVX-512F; x holds R·c values and panel 32·c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512<const R: usize>(
    x: &[f32],
    c: usize,
    panel: &[f32],
    next: NextLines,
) -> [[f32; PANEL]; R] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let (xp, pp) = (x.as_ptr(), panel.as_ptr());
    for k in 0..c {
        next.fetch(k, c);
        // SAFETY: k < c, so k·32 + 32 ≤ 32·c and r·c + k < R·c (the contract).
        unsafe {
            let w0 = _mm512_loadu_ps(pp.add(k * PANEL));
            let w1 = _mm512_loadu_ps(pp.add(k * PANEL + 16));
            for (r, a) in acc.iter_mut().enumerate() {
                let b = _mm512_set1_ps(*xp.add(r * c + k));
                a[0] = _mm512_fmadd_ps(b, w0, a[0]);
                a[1] = _mm512_fmadd_ps(b, w1, a[1]);
            }
        }
    }
    let mut out = [[0f32; PANEL]; R];
    for (o, a) in out.iter_mut().zip(&acc) {
        // SAFETY: each row of `out` holds 32 values.
        unsafe {
            _mm512_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm512_storeu_ps(o.as_mut_ptr().add(16), a[1]);
        }
    }
    out
}

/// `rows` with AVX2: the same fused multiply-adds in the same order, eight lanes at a time,
/// over each half of the panel (sixteen outputs) for up to four rows at a time (`by_halves`):
/// eight accumulators, two registers of weights and a broadcast input, of AVX2's sixteen
/// registers. The whole panel against eight rows, as on AVX-512, would need 32 accumulators:
/// the portable loop, spilling, ran a decoding batch of 16 at `medium` at about 33 GFLOP/s.
/// (The whole panel against three rows at a time, the weights as the multiply-adds' memory
/// operands, ran a batch's prefill at 0.75× this.)
///
/// # Safety
/// AVX2 and FMA; x holds out.len()·c values and panel 32·c.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2(out: &mut [[f32; PANEL]], x: &[f32], c: usize, panel: &[f32], next: NextLines) {
    by_halves(out, x, c, next, |out, x, half, next| {
        // SAFETY: AVX2 and FMA (this fn's contract); `half_rows` checks the lengths.
        unsafe {
            match out.len() {
                1 => half_rows::<1>(out, x, c, panel, half, next),
                2 => half_rows::<2>(out, x, c, panel, half, next),
                3 => half_rows::<3>(out, x, c, panel, half, next),
                _ => half_rows::<4>(out, x, c, panel, half, next),
            }
        }
    })
}

/// The passes of a loop over half a panel for up to four rows at a time (AVX2's, NEON's):
/// `pass(out, x, half, next)` for each half of the panel and each group of up to four rows of
/// `out` (x from the group's first row), the first pass fetching `next`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn by_halves(
    out: &mut [[f32; PANEL]],
    x: &[f32],
    c: usize,
    next: NextLines,
    pass: impl Fn(&mut [[f32; PANEL]], &[f32], usize, NextLines),
) {
    for half in 0..2 {
        for (g, out) in out.chunks_mut(4).enumerate() {
            // (the first run over the panel fetches `next`)
            let next = if half + g == 0 { next } else { NextLines::NONE };
            pass(out, &x[4 * g * c..], half, next);
        }
    }
}

/// `rows_avx2` for G ≤ 4 rows of x against outputs 16·half.. 16·half + 16 of the panel, into
/// those outputs of each row of `out`.
///
/// # Safety
/// AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn half_rows<const G: usize>(
    out: &mut [[f32; PANEL]],
    x: &[f32],
    c: usize,
    panel: &[f32],
    half: usize,
    next: NextLines,
) {
    use std::arch::x86_64::*;
    assert!(half < 2 && out.len() >= G && x.len() >= G * c && panel.len() >= PANEL * c);
    let mut acc = [[_mm256_setzero_ps(); 2]; G];
    let (xp, pp) = (x.as_ptr(), panel.as_ptr().wrapping_add(16 * half));
    for k in 0..c {
        next.fetch(k, c);
        // SAFETY: k < c, so k·32 + 16·half + 16 ≤ 32·c and r·c + k < G·c (asserted).
        unsafe {
            let w0 = _mm256_loadu_ps(pp.add(k * PANEL));
            let w1 = _mm256_loadu_ps(pp.add(k * PANEL + 8));
            for (r, a) in acc.iter_mut().enumerate() {
                let b = _mm256_set1_ps(*xp.add(r * c + k));
                a[0] = _mm256_fmadd_ps(b, w0, a[0]);
                a[1] = _mm256_fmadd_ps(b, w1, a[1]);
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        let o = &mut o[16 * half..16 * half + 16];
        // SAFETY: sixteen f32 into sixteen.
        unsafe {
            _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
        }
    }
}

/// `rows` with NEON: the same fused multiply-adds in the same order, four lanes at a time, in
/// AVX2's passes (`by_halves`): half a panel (four registers) against up to four rows is
/// sixteen accumulators, four registers of weights and a broadcast input, of NEON's 32. (The
/// whole panel against eight rows would need 64 accumulators.)
///
/// # Safety
/// NEON; x holds out.len()·c values and panel 32·c.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn rows_neon(out: &mut [[f32; PANEL]], x: &[f32], c: usize, panel: &[f32], next: NextLines) {
    by_halves(out, x, c, next, |out, x, half, next| match out.len() {
        1 => half_rows_neon::<1>(out, x, c, panel, half, next),
        2 => half_rows_neon::<2>(out, x, c, panel, half, next),
        3 => half_rows_neon::<3>(out, x, c, panel, half, next),
        _ => half_rows_neon::<4>(out, x, c, panel, half, next),
    })
}

/// `rows_neon` for G ≤ 4 rows of x against outputs 16·half.. 16·half + 16 of the panel, into
/// those outputs of each row of `out`. (NEON: every ARM64 CPU has it, so any caller may
/// assert it.)
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
fn half_rows_neon<const G: usize>(
    out: &mut [[f32; PANEL]],
    x: &[f32],
    c: usize,
    panel: &[f32],
    half: usize,
    next: NextLines,
) {
    use std::arch::aarch64::*;
    assert!(half < 2 && out.len() >= G && x.len() >= G * c && panel.len() >= PANEL * c);
    let mut acc = [[vdupq_n_f32(0.0); 4]; G];
    let (xp, pp) = (x.as_ptr(), panel.as_ptr().wrapping_add(16 * half));
    for k in 0..c {
        next.fetch(k, c);
        // SAFETY: k < c, so k·32 + 16·half + 16 ≤ 32·c and r·c + k < G·c (asserted).
        unsafe {
            let w = pp.add(k * PANEL);
            let w = [w, w.add(4), w.add(8), w.add(12)].map(|w| vld1q_f32(w));
            for (r, a) in acc.iter_mut().enumerate() {
                let b = vdupq_n_f32(*xp.add(r * c + k));
                for (a, &w) in a.iter_mut().zip(&w) {
                    *a = vfmaq_f32(*a, b, w);
                }
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        for (q, &a) in a.iter().enumerate() {
            // SAFETY: four f32 into each quarter of the half's sixteen.
            unsafe { vst1q_f32(o[16 * half + 4 * q..][..4].as_mut_ptr(), a) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::randn;

    /// The SIMD loops this CPU has (AVX2, AVX-512; NEON on every ARM64 CPU) give the portable
    /// loop's bits, for every row count.
    #[test]
    fn each_simd_loop_gives_the_portable_bits() {
        let (oc, c) = (32, 45);
        let (w, x) = (randn(oc * c, 3, 1.0), randn(PANEL_ROWS * c, 4, 1.0));
        let p = pack(&w, oc, c);
        fn check<const R: usize>(x: &[f32], c: usize, p: &[f32]) {
            let bits = |v: [[f32; PANEL]; R]| v.map(|r| r.map(f32::to_bits));
            let want = bits(rows_portable::<R>(x, c, p, NextLines::NONE));
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let _ = want; // no SIMD loop to hold to it here
            #[cfg(target_arch = "aarch64")]
            {
                assert!(super::super::cpu::neon());
                let mut out = [[0f32; PANEL]; R];
                // SAFETY: NEON detected; x holds R·c values, p 32·c.
                unsafe { rows_neon(&mut out, x, c, p, NextLines::NONE) };
                assert_eq!(bits(out), want, "neon, {R} rows");
            }
            #[cfg(target_arch = "x86_64")]
            {
                if super::super::cpu::avx2_fma() {
                    let mut out = [[0f32; PANEL]; R];
                    // SAFETY: AVX2 and FMA detected; x holds R·c values, p 32·c.
                    unsafe { rows_avx2(&mut out, x, c, p, NextLines::NONE) };
                    assert_eq!(bits(out), want, "avx2, {R} rows");
                }
                if super::super::cpu::avx512f() {
                    // SAFETY: AVX-512F detected; as above.
                    let got = unsafe { rows_avx512::<R>(x, c, p, NextLines::NONE) };
                    assert_eq!(bits(got), want, "avx512, {R} rows");
                }
            }
        }
        check::<1>(&x, c, &p);
        check::<2>(&x, c, &p);
        check::<3>(&x, c, &p);
        check::<4>(&x, c, &p);
        check::<5>(&x, c, &p);
        check::<7>(&x, c, &p);
        check::<PANEL_ROWS>(&x, c, &p);
    }

    /// Every row count gives each row the same bits, and the sums match an f64 reference.
    #[test]
    fn panel_sums_match_f64_and_do_not_depend_on_the_rows_beside() {
        let (oc, c) = (45, 37);
        let (w, x) = (randn(oc * c, 1, 1.0), randn(PANEL_ROWS * c, 2, 1.0));
        let p = pack(&w, oc, c);
        assert_eq!(p.len(), 2 * PANEL * c);
        for b in 0..2 {
            let panel = &p[b * PANEL * c..][..PANEL * c];
            let all = rows::<PANEL_ROWS>(&x, c, panel, NextLines::NONE);
            for (r, row) in all.iter().enumerate() {
                let one = rows::<1>(&x[r * c..], c, panel, NextLines::NONE)[0];
                let s = r.min(PANEL_ROWS - 3);
                let three = rows::<3>(&x[s * c..], c, panel, NextLines::NONE)[r - s];
                assert_eq!(row.map(f32::to_bits), one.map(f32::to_bits));
                assert_eq!(row.map(f32::to_bits), three.map(f32::to_bits));
                for (j, &v) in row.iter().enumerate() {
                    let o = b * PANEL + j;
                    let want: f64 = if o < oc {
                        (0..c)
                            .map(|k| x[r * c + k] as f64 * w[o * c + k] as f64)
                            .sum()
                    } else {
                        0.0
                    };
                    assert!(
                        (v as f64 - want).abs() < 1e-4,
                        "row {r} output {o}: {v} vs {want}"
                    );
                }
            }
        }
    }
}

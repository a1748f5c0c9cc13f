//! f32 matrix multiply, BLIS style: B is packed into panels of NR columns, A into panels of
//! MR rows (both in buffers allocated once per thread and reused), and a register-blocked
//! MR×NR micro-kernel accumulates each tile of C over a KC-deep slice. Row blocks of C are
//! spread over the rayon pool; each task packs its own A block. Short, deep products (weight
//! gradients) split their depth across the pool instead.
//!
//! The micro-kernels, one per instruction set (`Kernel`): f32_avx512.rs (14 × 32 tiles in
//! AVX-512's 32 registers), f32_avx2.rs (6 × 16 in AVX2's 16) and f32_neon.rs (8 × 12 in
//! NEON's 32); everything else here serves all three. On other CPUs products run on the `gemm`
//! crate, so the driver is compiled there but not called.
#![cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]

use super::cpu::Isa;
use super::f32_kernel::{CTile, Kernel};
use super::{extent, Dims, Mat, Out};
use crate::{ensure, ensure_aligned, with_thread_buffer};
use rayon::prelude::*;
use std::cell::Cell;
use std::ops::Range;

/// f::<K>(args) for the kernel of `isa`.
macro_rules! on_isa {
    ($isa:expr, $f:ident ( $($arg:expr),* )) => {
        match $isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => $f::<super::f32_avx512::Avx512>($($arg),*),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => $f::<super::f32_avx2::Avx2>($($arg),*),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => $f::<super::f32_neon::Neon>($($arg),*),
            #[allow(unreachable_patterns)]
            _ => {
                $(let _ = &$arg;)*
                unreachable!("no f32 kernel on this CPU")
            }
        }
    };
}

/// Values from one packed B panel to the next: a cache line more than a panel holds, so that
/// the panels that packing writes row by row do not all fall in the same L1 sets.
const fn b_panel<K: Kernel>() -> usize {
    K::KC * K::NR + 16
}
/// Values from one packed A panel of depth kc to the next, padded likewise.
const fn a_panel<K: Kernel>(kc: usize) -> usize {
    depth::<K>(kc) * K::MR + 16
}
/// The depth a packed panel of depth kc holds: kc padded to K's `DEPTH_STEP`.
const fn depth<K: Kernel>(kc: usize) -> usize {
    kc.next_multiple_of(K::DEPTH_STEP)
}
/// Most column panels of packed B per pass over the row blocks (2^18 values, 1 MiB),
/// counted without their padding.
const fn max_pass_panels<K: Kernel>() -> usize {
    (1 << 18) / (K::KC * K::NR)
}

thread_local! {
    /// Packed A block of the task running on this thread.
    static PACK_A: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Packed B slice of the call made from this thread.
    static PACK_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Partial products of a depth-split call made from this thread (`sgemm_split_depth`).
    static PARTIAL: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Packs A[i0..i0+mc, p0..p0+kc] as ceil(mc/MR) panels of kc columns × MR rows, zero-padded,
/// `a_panel(kc)` values apart.
fn pack_a<K: Kernel>(ap: &mut [f32], a: &Mat, i0: usize, mc: usize, p0: usize, kc: usize) {
    K::pack_a_panels(ap, a_panel::<K>(kc), &a.transposed(), (p0, kc), (i0, mc));
}

/// Packs column panels `jp` of the parts laid side by side (each part starting a panel of its
/// own) at depth p0..p0+kc, panel jp at panels[(jp − jp.start) · B_PANEL].
fn pack_b<K: Kernel>(panels: &mut [f32], parts: &[Part], p0: usize, kc: usize, jp: Range<usize>) {
    let mut first = 0;
    for part in parts {
        let np = part.n.div_ceil(K::NR);
        let (lo, hi) = (jp.start.max(first), jp.end.min(first + np));
        if lo < hi {
            let j0 = (lo - first) * K::NR;
            let w = part.n.min((hi - first) * K::NR) - j0;
            let at = &mut panels[(lo - jp.start) * b_panel::<K>()..];
            K::pack_b_panels(at, b_panel::<K>(), &part.b, (p0, kc), (j0, w));
        }
        first += np;
    }
}

/// Sizes this thread's packing buffers for products up to `n_max` columns wide (the parts of
/// `sgemm_parts` together), for this CPU's kernel.
pub(crate) fn reserve(n_max: usize) {
    if let Some(isa) = Isa::detect() {
        on_isa!(isa, reserve_for(n_max));
    }
}

/// `reserve` for kernel K.
fn reserve_for<K: Kernel>(n_max: usize) {
    with_thread_buffer(&PACK_A, |pa| {
        ensure_aligned(pa, K::MAX_MC / K::MR * a_panel::<K>(K::KC));
    });
    // each part may start a panel of its own
    let panels = n_max.div_ceil(K::NR) + MAX_PARTS - 1;
    with_thread_buffer(&PACK_B, |pb| {
        ensure_aligned(pb, panels.max(max_pass_panels::<K>()) * b_panel::<K>());
    });
    let others = rayon::current_num_threads().saturating_sub(1);
    with_thread_buffer(&PARTIAL, |partial| {
        ensure(partial, (others * MAX_SPLIT_M * n_max).min(MAX_PARTIAL));
    });
}

#[derive(Clone, Copy)]
struct DstPtr(*mut f32);
// SAFETY: the destination of one product, which its tasks write in disjoint row blocks (or
// depth shares) only, while the call that made it borrows the buffer mutably.
unsafe impl Send for DstPtr {}
// SAFETY: as for Send.
unsafe impl Sync for DstPtr {}
impl DstPtr {
    fn at(&self, off: usize) -> *mut f32 {
        // SAFETY: callers pass offsets inside the destination slice.
        unsafe { self.0.add(off) }
    }
}

/// The most outputs one product shares its A between (`sgemm_parts`).
pub const MAX_PARTS: usize = 4;

/// One output of a product whose outputs share A (q, k, v and λ of ln1; gate and up of
/// ln2): dst (m, n) at row stride dst_rs (+)= A · b, b (k, n). Each part starts a new column
/// panel, so widths need not be multiples of NR.
#[derive(Clone, Copy)]
pub struct Part<'a> {
    n: usize,
    b: Mat<'a>,
    dst: DstPtr,
    dst_len: usize,
    dst_rs: usize,
}

impl<'a> Part<'a> {
    /// No columns: fills the unused slots of an array of parts.
    pub const NONE: Part<'static> = Part {
        n: 0,
        b: Mat {
            data: &[],
            rs: 0,
            cs: 0,
        },
        dst: DstPtr(std::ptr::null_mut()),
        dst_len: 0,
        dst_rs: 0,
    };
    /// dst (m, n) at row stride dst_rs, b (k, n), both checked by the product; `dst` stays
    /// borrowed for as long as the part lives.
    pub fn new(dst: &'a mut [f32], dst_rs: usize, n: usize, b: Mat<'a>) -> Self {
        Part {
            n,
            b,
            dst: DstPtr(dst.as_mut_ptr()),
            dst_len: dst.len(),
            dst_rs,
        }
    }
}

/// Column panel `jp` of the parts laid side by side: its part and its first column there.
fn panel_of<'p, 'a, K: Kernel>(parts: &'p [Part<'a>], mut jp: usize) -> (&'p Part<'a>, usize) {
    for p in parts {
        let np = p.n.div_ceil(K::NR);
        if jp < np {
            return (p, jp * K::NR);
        }
        jp -= np;
    }
    unreachable!("column panel past the parts")
}

/// C (+)= a (m, k) · b (k, n) on `isa`'s kernel (which the CPU must have).
pub fn gemm(isa: Isa, d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    assert!(isa.available(), "sgemm: the CPU has no {isa:?}");
    on_isa!(isa, gemm_for(d, a, b, out, threads))
}

/// C (+)= a (m, k) · b (k, n) with bf16 operands, on ARM64's BFMMLA kernel (which the CPU
/// must have: `cpu::arm_bf16`), through this driver as the f32 kernels.
#[cfg(target_arch = "aarch64")]
pub fn gemm_bf16(d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    assert!(super::cpu::arm_bf16(), "sgemm: the CPU has no bf16");
    gemm_for::<super::bf16_neon::NeonBf16>(d, a, b, out, threads)
}

/// `gemm` on kernel K.
fn gemm_for<K: Kernel>(d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    let Dims { m, n, k } = d;
    // the depth split carves dst up by raw pointers: its reach is checked here
    assert!(
        extent(m, n, out.rs, 1) <= out.dst.len(),
        "sgemm: dst too small"
    );
    let deep = k >= threads * MIN_SPLIT_SLICES * K::KC;
    if threads > 1 && deep && m <= MAX_SPLIT_M && (threads - 1) * m * n <= MAX_PARTIAL {
        return gemm_split_depth::<K>(d, a, b, out, threads);
    }
    let accumulate = out.accumulate;
    let part = Part::new(out.dst, out.rs, n, b);
    sgemm_rows::<K>(m, k, a, &[part], accumulate, threads)
}

/// Every part's dst = (or +=) a (m, k) · its b, as one product: A is packed once for all of
/// them, in one parallel region, on `isa`'s kernel (which the CPU must have). Needs k > 0.
pub fn sgemm_parts(
    isa: Isa,
    (m, k): (usize, usize),
    a: Mat,
    parts: &[Part],
    accumulate: bool,
    threads: usize,
) {
    assert!(isa.available(), "sgemm: the CPU has no {isa:?}");
    on_isa!(isa, sgemm_rows(m, k, a, parts, accumulate, threads))
}

/// Products of at most this many rows with a deep k (the weight gradients, whose depth is the
/// token count) split their depth across the threads instead of their rows...
const MAX_SPLIT_M: usize = 1024;
/// ... when every thread gets at least this many KC slices ...
const MIN_SPLIT_SLICES: usize = 2;
/// ... and the other threads' partial products fit this many values.
const MAX_PARTIAL: usize = 1 << 20;

/// `gemm` with the depth cut into one contiguous share per thread: each share runs on one
/// thread from packing to kernel with no synchronisation per KC slice (a weight gradient of
/// 256 rows split by rows had two row blocks and two parallel regions per slice), thread 0
/// into dst and the others into partial products that are added to dst in order at the end.
fn gemm_split_depth<K: Kernel>(d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    let (
        Dims { m, n, k },
        Out {
            dst,
            rs: dst_rs,
            accumulate,
        },
    ) = (d, out);
    let slices = k.div_ceil(K::KC);
    // share t covers slices [t·slices/threads, (t+1)·slices/threads)
    let depth = |t: usize| (t * slices / threads * K::KC).min(k);
    with_thread_buffer(&PARTIAL, |partial| {
        let partial = ensure(partial, (threads - 1) * m * n);
        let (dst_ptr, part_ptr) = (DstPtr(dst.as_mut_ptr()), DstPtr(partial.as_mut_ptr()));
        (0..threads).into_par_iter().for_each(|t| {
            let (p0, p1) = (depth(t), depth(t + 1));
            let a = Mat {
                data: &a.data[p0 * a.cs..],
                ..a
            };
            let b = Mat {
                data: &b.data[p0 * b.rs..],
                ..b
            };
            // SAFETY: share 0 alone writes dst (borrowed mutably by this call), share t > 0
            // alone writes its m × n part of the partial buffer.
            let (out, out_rs, acc) = unsafe {
                if t == 0 {
                    let len = (m - 1) * dst_rs + n;
                    (
                        std::slice::from_raw_parts_mut(dst_ptr.at(0), len),
                        dst_rs,
                        accumulate,
                    )
                } else {
                    let at = part_ptr.at((t - 1) * m * n);
                    (std::slice::from_raw_parts_mut(at, m * n), n, false)
                }
            };
            sgemm_rows::<K>(m, p1 - p0, a, &[Part::new(out, out_rs, n, b)], acc, 1);
        });
        for t in 1..threads {
            let part = &partial[(t - 1) * m * n..t * m * n];
            for (i, row) in part.chunks_exact(n).enumerate() {
                crate::axpy(&mut dst[i * dst_rs..i * dst_rs + n], 1.0, row);
            }
        }
    });
}

/// Thread t's rows of C out of m: a contiguous share as close to m / threads as whole MR-row
/// panels allow. (Blocks of equal panel counts handed out in turn gave one thread 1,050 rows
/// and the other 998 of a 2,048-row product.)
fn row_share<K: Kernel>(m: usize, threads: usize, t: usize) -> Range<usize> {
    let cut = |t: usize| ((m * t + threads * K::MR / 2) / (threads * K::MR) * K::MR).min(m);
    cut(t)..if t + 1 == threads { m } else { cut(t + 1) }
}

/// A share of rows as (first row, rows) blocks: the fewest of at most MAX_MC rows, of panel
/// counts that differ by at most one, so that every B panel is reused across as many A panels
/// as the share allows.
fn row_blocks<K: Kernel>(rows: Range<usize>) -> impl Iterator<Item = (usize, usize)> {
    let panels = rows.len().div_ceil(K::MR);
    let blocks = panels.div_ceil(K::MAX_MC / K::MR);
    let at = move |b: usize| (rows.start + b * panels / blocks * K::MR).min(rows.end);
    (0..blocks).map(move |b| (at(b), at(b + 1) - at(b)))
}

/// f(i, chunk i of `len` values) over buf, on the pool's threads or on this one.
fn each_chunk(buf: &mut [f32], len: usize, parallel: bool, f: impl Fn(usize, &mut [f32]) + Sync) {
    if parallel {
        buf.par_chunks_mut(len)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        buf.chunks_mut(len).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// `sgemm` (or `sgemm_parts`) with the rows of C split across the threads.
fn sgemm_rows<K: Kernel>(
    m: usize,
    k: usize,
    a: Mat,
    parts: &[Part],
    accumulate: bool,
    threads: usize,
) {
    // What the kernel's raw pointers reach, checked once per call.
    assert!(a.fits(m, k), "sgemm: lhs too small");
    for p in parts {
        assert!(p.b.fits(k, p.n), "sgemm: rhs too small");
        assert!(
            extent(m, p.n, p.dst_rs, 1) <= p.dst_len,
            "sgemm: dst too small"
        );
    }
    let n_panels: usize = parts.iter().map(|p| p.n.div_ceil(K::NR)).sum();
    let n: usize = parts.iter().map(|p| p.n).sum();
    // Consecutive KC slices of B are packed together as long as they fit MAX_PASS_PANELS: a row
    // block then runs through all of them while its rows of C stay in L2, and a pass takes two
    // parallel regions where each slice took two. Panel (slice s, column panel jp) of a pass
    // sits at (s · n_panels + jp) · B_PANEL.
    let slice_len = n_panels * b_panel::<K>();
    let per_pass = (max_pass_panels::<K>() / n_panels).max(1);
    with_thread_buffer(&PACK_B, |pb| {
        for q0 in (0..k).step_by(per_pass * K::KC) {
            let q1 = (q0 + per_pass * K::KC).min(k);
            let slices = (q1 - q0).div_ceil(K::KC);
            let bp = ensure_aligned(pb, slices * slice_len);
            // Large passes (the weight-gradient products pack the activations) are packed in
            // parallel, by slices and, where a pass has fewer slices than threads, by groups
            // of column panels.
            let parallel = threads > 1 && (q1 - q0) * n >= 1 << 15;
            let groups = if parallel {
                threads.div_ceil(slices)
            } else {
                1
            };
            let group_len = n_panels.div_ceil(groups) * b_panel::<K>();
            each_chunk(bp, slice_len, parallel, |si, slice| {
                let p0 = q0 + si * K::KC;
                let kc = K::KC.min(k - p0);
                each_chunk(slice, group_len, parallel, |g, group| {
                    let first = g * group_len / b_panel::<K>();
                    pack_b::<K>(
                        group,
                        parts,
                        p0,
                        kc,
                        first..first + group.len() / b_panel::<K>(),
                    );
                });
            });
            let bp = &*bp;
            let block = |(i0, mc): (usize, usize)| {
                with_thread_buffer(&PACK_A, |pa| {
                    // Sized for the largest block at once, so that no later step allocates.
                    ensure_aligned(pa, K::MAX_MC / K::MR * a_panel::<K>(K::KC));
                    for (si, p0) in (q0..q1).step_by(K::KC).enumerate() {
                        let kc = K::KC.min(k - p0);
                        let acc = accumulate || p0 > 0;
                        let ap = ensure_aligned(pa, mc.div_ceil(K::MR) * a_panel::<K>(kc));
                        pack_a::<K>(ap, &a, i0, mc, p0, kc);
                        for jp in 0..n_panels {
                            let (part, j0) = panel_of::<K>(parts, jp);
                            let w = K::NR.min(part.n - j0);
                            let bpanel = &bp[(si * n_panels + jp) * b_panel::<K>()..]
                                [..depth::<K>(kc) * K::NR];
                            for ip in 0..mc.div_ceil(K::MR) {
                                let r0 = i0 + ip * K::MR;
                                let h = K::MR.min(m - r0);
                                // SAFETY: the CPU has K's instructions (the callers'
                                // `Isa::available`) and rows r0..r0+h, columns
                                // j0..j0+w lie inside the part's dst (both checked above);
                                // row blocks handed to different tasks do not overlap.
                                unsafe {
                                    let c = part.dst.at(r0 * part.dst_rs + j0);
                                    let tile = CTile {
                                        c,
                                        ldc: part.dst_rs,
                                        h,
                                        w,
                                        accumulate: acc,
                                    };
                                    let apanel =
                                        &ap[ip * a_panel::<K>(kc)..][..depth::<K>(kc) * K::MR];
                                    K::kernel(kc, apanel, bpanel, tile);
                                }
                            }
                        }
                    }
                });
            };
            if threads > 1 && m > K::MR {
                (0..threads)
                    .into_par_iter()
                    .for_each(|t| row_blocks::<K>(row_share::<K>(m, threads, t)).for_each(block));
            } else {
                row_blocks::<K>(0..m).for_each(block);
            }
        }
    });
}

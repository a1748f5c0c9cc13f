//! f32 matrix multiply for AVX-512 CPUs, BLIS style: B is packed into panels of NR columns,
//! A into panels of MR rows (both in buffers allocated once per thread and reused), and a
//! register-blocked MR×NR micro-kernel accumulates each tile of C over a KC-deep slice.
//! Row blocks of C are spread over the rayon pool; each task packs its own A block. Short,
//! deep products (weight gradients) split their depth across the pool instead.

use super::small::avx512::products;
use super::{extent, Dims, Mat, Out};
use crate::kernels::{ensure, ensure_aligned, with_thread_buffer};
use rayon::prelude::*;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::ops::Range;

/// Micro-tile: 14 rows × 32 columns = 28 zmm accumulators (of 32 registers).
const MR: usize = 14;
const NR: usize = 32;
/// Depth of one packed slice: an A panel (MR×KC) and a B panel (KC×NR) sit in L1 together.
const KC: usize = 256;
/// Largest row block: a packed A block of MAX_MC × KC stays in L2.
const MAX_MC: usize = 16 * MR;
/// Values from one packed B panel to the next: a cache line more than a panel holds, so that
/// the panels that packing writes row by row do not all fall in the same L1 sets.
const B_PANEL: usize = KC * NR + 16;
/// Values from one packed A panel of depth kc to the next, padded likewise.
const fn a_panel(kc: usize) -> usize {
    kc * MR + 16
}
/// Rows ahead that packing a row-major source prefetches (`crate::kernels::prefetch`).
const PACK_AHEAD: usize = 8;
/// Most column panels of packed B per pass over the row blocks (2^18 values, 1 MiB),
/// counted without their padding.
const MAX_PASS_PANELS: usize = (1 << 18) / (KC * NR);

thread_local! {
    /// Packed A block of the task running on this thread.
    static PACK_A: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Packed B slice of the call made from this thread.
    static PACK_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// Partial products of a depth-split call made from this thread (`sgemm_split_depth`).
    static PARTIAL: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// panels[q·stride + p·R + c] = x(p0 + p, j0 + q·R + c) for p < kc and c < R, zero past w:
/// the ⌈w/R⌉ panels of R columns that cover columns j0..j0+w, B panels (R = NR) or, with
/// x = Aᵀ, A panels (R = MR).
fn pack_panels<const R: usize>(
    panels: &mut [f32],
    stride: usize,
    x: &Mat,
    p0: usize,
    kc: usize,
    j0: usize,
    w: usize,
) {
    if x.cs == 1 {
        // Row by row across all the panels, so that each source row streams once (panel by
        // panel, a row-major source was read R values at a time at its row stride).
        for p in 0..kc {
            if p + PACK_AHEAD < kc {
                crate::kernels::prefetch(x.data[(p0 + p + PACK_AHEAD) * x.rs + j0..].as_ptr(), w);
            }
            let src = &x.data[(p0 + p) * x.rs + j0..][..w];
            for (q, chunk) in src.chunks(R).enumerate() {
                let dst = &mut panels[q * stride + p * R..][..R];
                match <&[f32; R]>::try_from(chunk) {
                    // a fixed-size copy inlines (a variable one calls memmove)
                    Ok(full) => dst.copy_from_slice(full),
                    Err(_) => {
                        dst[..chunk.len()].copy_from_slice(chunk);
                        dst[chunk.len()..].fill(0.0);
                    }
                }
            }
        }
        return;
    }
    for (q, c0) in (0..w).step_by(R).enumerate() {
        let panel = &mut panels[q * stride..][..kc * R];
        let (j0, w) = (j0 + c0, R.min(w - c0));
        if w == R && x.rs == 1 {
            // xᵀ stored row-major (a weight W with B = Wᵀ, or a row-major A): the panel is R
            // of its rows transposed.
            let rows: [&[f32]; R] = std::array::from_fn(|c| &x.data[(j0 + c) * x.cs + p0..][..kc]);
            // SAFETY: AVX-512F is this module's precondition; every row holds kc values.
            unsafe { transpose_rows::<R>(panel, &rows, kc) };
        } else {
            if w < R {
                panel.fill(0.0);
            }
            for c in 0..w {
                let col = (j0 + c) * x.cs;
                for p in 0..kc {
                    panel[p * R + c] = x.data[col + (p0 + p) * x.rs];
                }
            }
        }
    }
}

/// panel[p][r] = rows[r][p] for p < kc (a panel of R ≤ 32 columns): 16 × 16 blocks
/// transposed in registers (R = 14 stores the first 14 lanes of each), the ragged depth by
/// element.
///
/// # Safety
/// Needs AVX-512F; every row must hold kc values and the panel kc · R.
#[target_feature(enable = "avx512f")]
unsafe fn transpose_rows<const R: usize>(panel: &mut [f32], rows: &[&[f32]; R], kc: usize) {
    // SAFETY: AVX-512F is the caller's contract; the assert that opens this block checks that
    // every row holds kc values and the panel kc · R, so the 16-wide loads at p + 16 ≤ kc and
    // the stores masked to the w ≤ R − c0 columns of row p + i stay in bounds.
    unsafe {
        assert!(panel.len() >= kc * R && rows.iter().all(|r| r.len() >= kc));
        let mut p = 0;
        while p + 16 <= kc {
            for c0 in (0..R).step_by(16) {
                let w = 16.min(R - c0);
                let mut r = [_mm512_setzero_si512(); 16];
                for (i, r) in r.iter_mut().enumerate().take(w) {
                    *r = _mm512_loadu_si512(rows[c0 + i].as_ptr().add(p) as *const _);
                }
                crate::kernels::transpose16(&mut r);
                let mask = crate::kernels::lane_mask(w);
                for (i, v) in r.iter().enumerate() {
                    let dst = panel.as_mut_ptr().add((p + i) * R + c0);
                    _mm512_mask_storeu_epi32(dst as *mut _, mask, *v);
                }
            }
            p += 16;
        }
        for p in p..kc {
            for (c, row) in rows.iter().enumerate() {
                panel[p * R + c] = row[p];
            }
        }
    }
}

/// Packs A[i0..i0+mc, p0..p0+kc] as ceil(mc/MR) panels of kc columns × MR rows, zero-padded,
/// `a_panel(kc)` values apart.
fn pack_a(ap: &mut [f32], a: &Mat, i0: usize, mc: usize, p0: usize, kc: usize) {
    pack_panels::<MR>(ap, a_panel(kc), &a.transposed(), p0, kc, i0, mc);
}

/// Packs column panels `jp` of the parts laid side by side (each part starting a panel of its
/// own) at depth p0..p0+kc, panel jp at panels[(jp − jp.start) · B_PANEL].
fn pack_b(panels: &mut [f32], parts: &[Part], p0: usize, kc: usize, jp: Range<usize>) {
    let mut first = 0;
    for part in parts {
        let np = part.n.div_ceil(NR);
        let (lo, hi) = (jp.start.max(first), jp.end.min(first + np));
        if lo < hi {
            let j0 = (lo - first) * NR;
            let w = part.n.min((hi - first) * NR) - j0;
            let at = &mut panels[(lo - jp.start) * B_PANEL..];
            pack_panels::<NR>(at, B_PANEL, &part.b, p0, kc, j0, w);
        }
        first += np;
    }
}

/// C[0..h, 0..w] (row stride ldc) = (or +=) Σ_p ap[p][r] · bp[p][c] over one packed A panel
/// and one packed B panel of depth kc.
///
/// # Safety
/// Needs AVX-512F; `c` must be valid for h rows of w columns at stride ldc.
#[target_feature(enable = "avx512f")]
// the micro-kernel's raw operands, unpacked once per call
#[allow(clippy::too_many_arguments)]
#[inline(never)]
unsafe fn kernel(
    kc: usize,
    ap: &[f32],
    bp: &[f32],
    c: *mut f32,
    ldc: usize,
    h: usize,
    w: usize,
    accumulate: bool,
) {
    // SAFETY: AVX-512F and c valid for h rows of w columns at ldc are this
    // fn's contract; the callers slice ap to kc · MR and bp to kc · NR values, which the panel
    // loads (kc steps of MR and NR) stay inside; the stores write rows r < h, columns masked to w.
    unsafe {
        // The register products of the rows and columns the tile has: a ragged last panel (the
        // 4 rows left of 2,048 or 256, the 11 columns left of 683) runs only the FMAs it needs.
        let mut acc = [_mm512_setzero_ps(); 2 * MR];
        macro_rules! tile {
            ($h:expr, $nv:literal) => {{
                let p = products::<$h, $nv>(kc, ap.as_ptr(), 1, MR, bp.as_ptr(), NR, [0xffff; $nv]);
                for (r, row) in p.iter().enumerate() {
                    acc[2 * r..2 * r + $nv].copy_from_slice(row);
                }
            }};
        }
        match (h, w > 16) {
            (0..=4, false) => tile!(4, 1),
            (0..=4, true) => tile!(4, 2),
            (5..=8, false) => tile!(8, 1),
            (5..=8, true) => tile!(8, 2),
            (_, false) => tile!(MR, 1),
            _ => {
                // The full tile: its own loop (products::<MR, 2> ran 1-6% slower here).
                let (mut pa, mut pb) = (ap.as_ptr(), bp.as_ptr());
                for _ in 0..kc {
                    let b0 = _mm512_loadu_ps(pb);
                    let b1 = _mm512_loadu_ps(pb.add(16));
                    for r in 0..MR {
                        let a = _mm512_set1_ps(*pa.add(r));
                        acc[2 * r] = _mm512_fmadd_ps(a, b0, acc[2 * r]);
                        acc[2 * r + 1] = _mm512_fmadd_ps(a, b1, acc[2 * r + 1]);
                    }
                    pa = pa.add(MR);
                    pb = pb.add(NR);
                }
            }
        }
        // Rows by a loop of fixed length (unrolled, so that acc stays in registers: a loop of h
        // rows kept it on the stack, zeroed by a memset at every call).
        let (m0, m1) = (
            crate::kernels::lane_mask(w),
            crate::kernels::lane_mask(w.saturating_sub(16)),
        );
        for r in 0..MR {
            if r == h {
                break;
            }
            let row = c.add(r * ldc);
            let (mut x0, mut x1) = (acc[2 * r], acc[2 * r + 1]);
            if w == NR {
                if accumulate {
                    x0 = _mm512_add_ps(x0, _mm512_loadu_ps(row));
                    x1 = _mm512_add_ps(x1, _mm512_loadu_ps(row.add(16)));
                }
                _mm512_storeu_ps(row, x0);
                _mm512_storeu_ps(row.add(16), x1);
            } else {
                // A ragged right edge: masked loads and stores of the first w columns.
                if accumulate {
                    x0 = _mm512_add_ps(x0, _mm512_maskz_loadu_ps(m0, row));
                    x1 = _mm512_add_ps(x1, _mm512_maskz_loadu_ps(m1, row.add(16)));
                }
                _mm512_mask_storeu_ps(row, m0, x0);
                _mm512_mask_storeu_ps(row.add(16), m1, x1);
            }
        }
    }
}

/// Sizes this thread's packing buffers for products up to `n_max` columns wide (the parts of
/// `sgemm_parts` together).
pub(crate) fn reserve(n_max: usize) {
    with_thread_buffer(&PACK_A, |pa| {
        ensure_aligned(pa, MAX_MC / MR * a_panel(KC));
    });
    // each part may start a panel of its own
    let panels = n_max.div_ceil(NR) + MAX_PARTS - 1;
    with_thread_buffer(&PACK_B, |pb| {
        ensure_aligned(pb, panels.max(MAX_PASS_PANELS) * B_PANEL);
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
fn panel_of<'p, 'a>(parts: &'p [Part<'a>], mut jp: usize) -> (&'p Part<'a>, usize) {
    for p in parts {
        let np = p.n.div_ceil(NR);
        if jp < np {
            return (p, jp * NR);
        }
        jp -= np;
    }
    unreachable!("column panel past the parts")
}

/// C (+)= a (m, k) · b (k, n), on a CPU with AVX-512F.
pub fn gemm(d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    let Dims { m, n, k } = d;
    // the depth split carves dst up by raw pointers: its reach is checked here
    assert!(
        extent(m, n, out.rs, 1) <= out.dst.len(),
        "sgemm: dst too small"
    );
    let deep = k >= threads * MIN_SPLIT_SLICES * KC;
    if threads > 1 && deep && m <= MAX_SPLIT_M && (threads - 1) * m * n <= MAX_PARTIAL {
        return gemm_split_depth(d, a, b, out, threads);
    }
    let accumulate = out.accumulate;
    let part = Part::new(out.dst, out.rs, n, b);
    sgemm_rows(m, k, a, &[part], accumulate, threads)
}

/// Every part's dst = (or +=) a (m, k) · its b, as one product: A is packed once for all of
/// them, in one parallel region. Needs AVX-512F and k > 0.
pub fn sgemm_parts(m: usize, k: usize, a: Mat, parts: &[Part], accumulate: bool, threads: usize) {
    sgemm_rows(m, k, a, parts, accumulate, threads)
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
fn gemm_split_depth(d: Dims, a: Mat, b: Mat, out: Out, threads: usize) {
    let (
        Dims { m, n, k },
        Out {
            dst,
            rs: dst_rs,
            accumulate,
        },
    ) = (d, out);
    let slices = k.div_ceil(KC);
    // share t covers slices [t·slices/threads, (t+1)·slices/threads)
    let depth = |t: usize| (t * slices / threads * KC).min(k);
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
            sgemm_rows(m, p1 - p0, a, &[Part::new(out, out_rs, n, b)], acc, 1);
        });
        for t in 1..threads {
            let part = &partial[(t - 1) * m * n..t * m * n];
            for (i, row) in part.chunks_exact(n).enumerate() {
                crate::kernels::axpy(&mut dst[i * dst_rs..i * dst_rs + n], 1.0, row);
            }
        }
    });
}

/// Thread t's rows of C out of m: a contiguous share as close to m / threads as whole MR-row
/// panels allow. (Blocks of equal panel counts handed out in turn gave one thread 1,050 rows
/// and the other 998 of a 2,048-row product.)
fn row_share(m: usize, threads: usize, t: usize) -> Range<usize> {
    let cut = |t: usize| ((m * t + threads * MR / 2) / (threads * MR) * MR).min(m);
    cut(t)..if t + 1 == threads { m } else { cut(t + 1) }
}

/// A share of rows as (first row, rows) blocks: the fewest of at most MAX_MC rows, of panel
/// counts that differ by at most one, so that every B panel is reused across as many A panels
/// as the share allows.
fn row_blocks(rows: Range<usize>) -> impl Iterator<Item = (usize, usize)> {
    let panels = rows.len().div_ceil(MR);
    let blocks = panels.div_ceil(MAX_MC / MR);
    let at = move |b: usize| (rows.start + b * panels / blocks * MR).min(rows.end);
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
fn sgemm_rows(m: usize, k: usize, a: Mat, parts: &[Part], accumulate: bool, threads: usize) {
    // What the kernel's raw pointers reach, checked once per call.
    assert!(super::cpu::avx512f(), "sgemm: the CPU has no AVX-512F");
    assert!(a.fits(m, k), "sgemm: lhs too small");
    for p in parts {
        assert!(p.b.fits(k, p.n), "sgemm: rhs too small");
        assert!(
            extent(m, p.n, p.dst_rs, 1) <= p.dst_len,
            "sgemm: dst too small"
        );
    }
    let n_panels: usize = parts.iter().map(|p| p.n.div_ceil(NR)).sum();
    let n: usize = parts.iter().map(|p| p.n).sum();
    // Consecutive KC slices of B are packed together as long as they fit MAX_PASS_PANELS: a row
    // block then runs through all of them while its rows of C stay in L2, and a pass takes two
    // parallel regions where each slice took two. Panel (slice s, column panel jp) of a pass
    // sits at (s · n_panels + jp) · B_PANEL.
    let slice_len = n_panels * B_PANEL;
    let per_pass = (MAX_PASS_PANELS / n_panels).max(1);
    with_thread_buffer(&PACK_B, |pb| {
        for q0 in (0..k).step_by(per_pass * KC) {
            let q1 = (q0 + per_pass * KC).min(k);
            let slices = (q1 - q0).div_ceil(KC);
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
            let group_len = n_panels.div_ceil(groups) * B_PANEL;
            each_chunk(bp, slice_len, parallel, |si, slice| {
                let p0 = q0 + si * KC;
                let kc = KC.min(k - p0);
                each_chunk(slice, group_len, parallel, |g, group| {
                    let first = g * group_len / B_PANEL;
                    pack_b(group, parts, p0, kc, first..first + group.len() / B_PANEL);
                });
            });
            let bp = &*bp;
            let block = |(i0, mc): (usize, usize)| {
                with_thread_buffer(&PACK_A, |pa| {
                    // Sized for the largest block at once, so that no later step allocates.
                    ensure_aligned(pa, MAX_MC / MR * a_panel(KC));
                    for (si, p0) in (q0..q1).step_by(KC).enumerate() {
                        let kc = KC.min(k - p0);
                        let acc = accumulate || p0 > 0;
                        let ap = ensure_aligned(pa, mc.div_ceil(MR) * a_panel(kc));
                        pack_a(ap, &a, i0, mc, p0, kc);
                        for jp in 0..n_panels {
                            let (part, j0) = panel_of(parts, jp);
                            let w = NR.min(part.n - j0);
                            let bpanel = &bp[(si * n_panels + jp) * B_PANEL..][..kc * NR];
                            for ip in 0..mc.div_ceil(MR) {
                                let r0 = i0 + ip * MR;
                                let h = MR.min(m - r0);
                                // SAFETY: AVX-512F is present and rows r0..r0+h, columns
                                // j0..j0+w lie inside the part's dst (both checked above);
                                // row blocks handed to different tasks do not overlap.
                                unsafe {
                                    let c = part.dst.at(r0 * part.dst_rs + j0);
                                    kernel(
                                        kc,
                                        &ap[ip * a_panel(kc)..][..kc * MR],
                                        bpanel,
                                        c,
                                        part.dst_rs,
                                        h,
                                        w,
                                        acc,
                                    );
                                }
                            }
                        }
                    }
                });
            };
            if threads > 1 && m > MR {
                (0..threads)
                    .into_par_iter()
                    .for_each(|t| row_blocks(row_share(m, threads, t)).for_each(block));
            } else {
                row_blocks(0..m).for_each(block);
            }
        }
    });
}

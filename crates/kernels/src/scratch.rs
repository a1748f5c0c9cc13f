//! The kernels' buffers: thread-local scratch reused across steps (`with_thread_buffer`,
//! `ensure`), sized for a workspace before its first step (`prepare_threads`), and the
//! activations' huge-page backing (`zeroed`).

use super::{attention, gemm, rmsnorm, Precision};

/// Runs `f` with the buffer kept in a thread-local `slot`, taken out for the duration: while a
/// rayon worker waits inside `f` it may run another job that wants the same slot, which then
/// starts from an empty buffer instead of finding it borrowed. The larger buffer goes back.
pub(crate) fn with_thread_buffer<T, R>(
    slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    let mut buf = slot.with(|s| s.take());
    let r = f(&mut buf);
    slot.with(|s| {
        let other = s.take();
        s.set(if other.len() > buf.len() { other } else { buf });
    });
    r
}

/// Grows `v` to at least `n` elements (only the first calls allocate) and returns its first
/// `n`: the kernels' reused thread-local buffers.
pub(crate) fn ensure<T: Copy + Default>(v: &mut Vec<T>, n: usize) -> &mut [T] {
    if v.len() < n {
        v.resize(n, T::default());
    }
    &mut v[..n]
}

/// `ensure` for packed operands: the `n` values returned start on a 64-byte boundary, so that
/// each 16-value load or store of a packed panel touches one cache line, not two.
pub(crate) fn ensure_aligned(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    let v = ensure(v, n + 15);
    let at = v.as_ptr().align_offset(64);
    &mut v[at..at + n]
}

/// Sizes every pool thread's kernel buffers (and this thread's) for products up to `n_max`
/// columns wide (`shared` for the outputs of one input together: `matmul_forward_each`) over
/// up to `rows` rows (tokens) and attention heads of widths dk, dv, so that no step allocates
/// them later, whichever thread a task lands on; the bf16 packing buffers too under
/// `Precision::Bf16`.
pub fn prepare_threads(
    n_max: usize,
    shared: usize,
    rows: usize,
    (dk, dv, group, keys): (usize, usize, usize, usize),
    precision: Precision,
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = precision; // bf16 products are x86-64's alone so far
    let prepare = || {
        gemm::f32::reserve(n_max.max(shared));
        #[cfg(target_arch = "x86_64")]
        if precision.is_bf16() {
            // an operand is at most (rows or n_max) × n_max, or n_max × rows
            gemm::bf16::reserve(rows.max(n_max), n_max);
            // the attention tasks' operands, packed once per task
            gemm::small::reserve(keys, dk, dv);
        }
        attention::reserve_scratch(dk, dv, group, keys);
        // the norms are at most `n_max` wide (subln: rows · heads rows of dv ≤ n_max)
        rmsnorm::reserve(rows, n_max);
    };
    prepare();
    rayon::broadcast(|_| prepare());
}

/// Rows per rayon task for row-wise kernels: big enough to amortise scheduling.
pub(crate) const ROW_CHUNK: usize = 32;

/// A zeroed buffer whose 2 MiB-aligned interior the kernel may back with huge pages
/// (`MADV_HUGEPAGE`, for machines whose transparent huge pages are set to `madvise`): a step
/// sweeps over hundreds of MiB of activations, and with 4 KiB pages every sweep misses the TLB.
pub fn zeroed(len: usize) -> Vec<f32> {
    let v = vec![0.0f32; len];
    advise_huge_pages(v.as_ptr() as usize, len * 4);
    v
}

/// `zeroed` for 16-bit values (bf16 weights).
pub fn zeroed_u16(len: usize) -> Vec<u16> {
    let v = vec![0u16; len];
    advise_huge_pages(v.as_ptr() as usize, len * 2);
    v
}

/// Asks for huge pages under the 2 MiB-aligned interior of `bytes` bytes from `start`, which
/// nothing has touched yet (a fresh zeroed allocation).
fn advise_huge_pages(start: usize, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let (a, b) = (start.next_multiple_of(HUGE), (start + bytes) / HUGE * HUGE);
        if b > a {
            // SAFETY: [a, b) lies inside the caller's allocation, and the advice changes no
            // contents. It is only a hint: where the kernel declines, the pages stay small.
            unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, bytes);
}

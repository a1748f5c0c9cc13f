//! What the f32 product's driver (f32.rs) asks of a register micro-kernel (`Kernel`), and the
//! packing that feeds one: below both the driver and the kernels of each instruction set
//! (f32_avx512.rs, f32_avx2.rs, f32_neon.rs), which implement it through `f32_kernel!`.

#![cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code, unused_imports, unused_macros)
)]

use super::Mat;

/// The tile of C that one micro-kernel call writes: h rows of w columns from `c`, rows `ldc`
/// apart, set to the product or, with `accumulate`, added to what they hold.
#[derive(Clone, Copy)]
pub(crate) struct CTile {
    pub c: *mut f32,
    pub ldc: usize,
    pub h: usize,
    pub w: usize,
    pub accumulate: bool,
}

/// A register micro-kernel and the packing that feeds it.
pub(crate) trait Kernel {
    /// Rows (of A) and columns (of B) of a register tile.
    const MR: usize;
    const NR: usize;
    /// Depth of one packed slice: an A panel (MR×KC) and a B panel (KC×NR) sit in L1 together.
    const KC: usize;
    /// Largest row block: a packed A block of MAX_MC × KC stays in L2.
    const MAX_MC: usize;
    /// The depth a packed panel is padded to a multiple of (its packing zero-fills the rest):
    /// 1 for the f32 kernels, 4 for the bf16 one (bf16_neon.rs), whose instruction takes four
    /// depths at once.
    const DEPTH_STEP: usize = 1;

    /// `tile` (+)= Σ_p ap[p][r] · bp[p][j] over one packed A panel (kc · MR values) and one
    /// packed B panel (kc · NR) of depth kc.
    ///
    /// # Safety
    /// The CPU has the kernel's instructions (`available`); `tile.c` is valid for tile.h ≤ MR
    /// rows of tile.w ≤ NR columns at stride tile.ldc.
    unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: CTile);

    /// panel[p·R + c] = rows[c][p] for p < kc, c < R (a panel of R columns from R rows).
    ///
    /// # Safety
    /// As for `kernel`; every row holds kc values and the panel kc · R.
    unsafe fn transpose_rows<const R: usize>(panel: &mut [f32], rows: &[&[f32]; R], kc: usize);

    /// `pack_panels::<MR>` (a const generic argument cannot be `Self::MR`).
    fn pack_a_panels(
        panels: &mut [f32],
        stride: usize,
        x: &Mat,
        depth: (usize, usize),
        cols: (usize, usize),
    );
    /// `pack_panels::<NR>`.
    fn pack_b_panels(
        panels: &mut [f32],
        stride: usize,
        x: &Mat,
        depth: (usize, usize),
        cols: (usize, usize),
    );
}

/// `Kernel` for the type `$name` of the kernel module it is called in, from that module's
/// `MR`, `NR`, `kernel` and `transpose_rows`, with depth `kc` and row block `max_mc`.
macro_rules! f32_kernel {
    ($name:ident, kc: $kc:expr, max_mc: $max_mc:expr) => {
        impl super::f32_kernel::Kernel for $name {
            const MR: usize = MR;
            const NR: usize = NR;
            const KC: usize = $kc;
            const MAX_MC: usize = $max_mc;

            unsafe fn kernel(kc: usize, ap: &[f32], bp: &[f32], tile: super::f32_kernel::CTile) {
                // SAFETY: the trait's contract is the module's `kernel`'s.
                unsafe { kernel(kc, ap, bp, tile) }
            }

            unsafe fn transpose_rows<const R: usize>(
                panel: &mut [f32],
                rows: &[&[f32]; R],
                kc: usize,
            ) {
                // SAFETY: the trait's contract is the module's `transpose_rows`'.
                unsafe { transpose_rows::<R>(panel, rows, kc) }
            }

            fn pack_a_panels(
                panels: &mut [f32],
                stride: usize,
                x: &super::Mat,
                depth: (usize, usize),
                cols: (usize, usize),
            ) {
                super::f32_kernel::pack_panels::<MR, Self>(panels, stride, x, depth, cols)
            }

            fn pack_b_panels(
                panels: &mut [f32],
                stride: usize,
                x: &super::Mat,
                depth: (usize, usize),
                cols: (usize, usize),
            ) {
                super::f32_kernel::pack_panels::<NR, Self>(panels, stride, x, depth, cols)
            }
        }
    };
}
pub(crate) use f32_kernel;

/// Rows ahead that packing a row-major source prefetches (`crate::prefetch`).
const PACK_AHEAD: usize = 8;

/// panels[q·stride + p·R + c] = x(p0 + p, j0 + q·R + c) for p < kc and c < R, zero past w
/// (`at` = (p0, kc), `j0`): the ⌈w/R⌉ panels of R columns that cover columns j0..j0+w, B
/// panels (R = NR) or, with x = Aᵀ, A panels (R = MR), for kernel K.
pub(crate) fn pack_panels<const R: usize, K: Kernel>(
    panels: &mut [f32],
    stride: usize,
    x: &Mat,
    (p0, kc): (usize, usize),
    (j0, w): (usize, usize),
) {
    if x.cs == 1 {
        // Row by row across all the panels, so that each source row streams once (panel by
        // panel, a row-major source was read R values at a time at its row stride).
        for p in 0..kc {
            if p + PACK_AHEAD < kc {
                crate::prefetch(x.data[(p0 + p + PACK_AHEAD) * x.rs + j0..].as_ptr(), w);
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
            // SAFETY: K's instructions are this module's precondition (every caller checks
            // `Isa::available`); every row holds kc values.
            unsafe { K::transpose_rows::<R>(panel, &rows, kc) };
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

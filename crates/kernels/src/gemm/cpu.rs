//! What this CPU can run, one query per feature, each detected once: every kernel asks here.

/// AVX-512F: difftx's f32 kernels (products, attention tiles, decoding's dot products).
pub fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// AVX2 with FMA: the f32 kernels' fallback where AVX-512F is missing (AMD Zen 2 and 3,
/// Intel's client cores): the packed products, attention's small products, decoding's panels.
pub fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// NEON (Advanced SIMD): every ARM64 CPU has it; the f32 products' micro-kernel there, and
/// the quantised products' engine where `dotprod` is missing (`quant::Engine::Neon`).
pub fn neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("neon");
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// SDOT/UDOT (ARMv8.2's `dotprod`): four int8 products summed into each int32 lane.
pub fn dotprod() -> bool {
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("dotprod");
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// ARM64's `bf16` extension (ARMv8.6's BFMMLA, BFDOT: Apple M2 on, Neoverse V1/N2/V2):
/// bf16 products there (bf16_neon.rs).
pub fn arm_bf16() -> bool {
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("bf16");
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// Whether this CPU runs bf16 products at all (`Precision::Bf16`): AVX512_BF16 on x86-64,
/// `bf16` on ARM64.
pub fn bf16_products() -> bool {
    avx512_bf16() || arm_bf16()
}

/// ARM64's `i8mm` (ARMv8.6's SMMLA: a 2 × 8 by 8 × 2 int8 product into int32): the Q8_0
/// products' GEMM blocks (`quant::Engine::Smmla`).
pub fn i8mm() -> bool {
    #[cfg(target_arch = "aarch64")]
    return std::arch::is_aarch64_feature_detected!("i8mm");
    #[cfg(not(target_arch = "aarch64"))]
    false
}

/// The vector unit a kernel with a loop for each runs: the f32 products' micro-kernels
/// (`f32_avx512`, `f32_avx2`, `f32_neon`; the `gemm` crate's where there is none), the
/// decoding attention's loops and the q8_0 KV rows' widening (the portable ones where there is
/// none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Neon,
}

impl Isa {
    /// The best unit this CPU has: AVX-512F, else AVX2 with FMA (x86-64); NEON (ARM64); else
    /// none.
    pub fn detect() -> Option<Isa> {
        Isa::available_all().next()
    }

    /// Every unit this CPU runs, the best first.
    pub fn available_all() -> impl Iterator<Item = Isa> {
        [Isa::Avx512, Isa::Avx2, Isa::Neon]
            .into_iter()
            .filter(|i| i.available())
    }

    /// Whether this CPU runs it (the first two on x86-64 only, the last on ARM64 only).
    pub fn available(self) -> bool {
        match self {
            Isa::Avx512 => avx512f(),
            Isa::Avx2 => avx2_fma(),
            Isa::Neon => neon(),
        }
    }
}

/// AVX512_BF16 (with AVX-512F/BW): bf16 products at all (AMD Zen 4, Intel Cooper Lake on),
/// whose dot products also pack the operands, with or without the tile unit.
pub fn avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the bf16 products run on AMX tiles (else on VDPBF16PS); the first call asks Linux
/// for the tile-data state, which each process must request before its first tile
/// instruction.
pub fn amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| avx512_bf16() && amx_in_cpuid() && request_tile_data())
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The CPU family of an AMD x86-64 processor (CPUID leaf 1's base family plus, where that
/// is 0xF, the extended family: 0x19 Zen 3 and Zen 4, 0x1A Zen 5); None on other vendors and
/// architectures. For the few loops whose better shape was measured to differ between them.
pub fn amd_family() -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    {
        static FAMILY: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
        *FAMILY.get_or_init(|| {
            use std::arch::x86_64::__cpuid;
            // Leaf 0's vendor string is EBX, EDX, ECX: "Auth" "enti" "cAMD".
            let v = __cpuid(0);
            if (v.ebx, v.edx, v.ecx) != (0x6874_7541, 0x6974_6e65, 0x444d_4163) {
                return None;
            }
            let eax = __cpuid(1).eax;
            let base = (eax >> 8) & 0xF;
            Some(match base {
                0xF => base + ((eax >> 20) & 0xFF),
                _ => base,
            })
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

#[cfg(target_arch = "x86_64")]
fn amx_in_cpuid() -> bool {
    // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    let r = std::arch::x86_64::__cpuid_count(7, 0);
    r.edx & (1 << 22) != 0 && r.edx & (1 << 24) != 0
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tile_data() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permissions.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn request_tile_data() -> bool {
    false
}

#[cfg(test)]
mod tests {
    /// `amd_family` agrees with what Linux reads from CPUID: /proc/cpuinfo's vendor and
    /// "cpu family" (decimal, the extended family already added).
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn amd_family_is_the_one_linux_reports() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let field = |name: &str| {
            info.lines()
                .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        };
        let amd = field("vendor_id").as_deref() == Some("AuthenticAMD");
        let family = field("cpu family").and_then(|f| f.parse::<u32>().ok());
        assert_eq!(super::amd_family(), family.filter(|_| amd));
    }
}

//! `difftx presets`: the presets and their parameter counts for every kind.

use difftx::{AttentionKind, ModelConfig, Preset};

pub fn run() {
    println!(
        "{:<8} {:>12} {:>12} {:>12}",
        "preset", "standard", "diff_v1", "diff_v2"
    );
    for p in Preset::ALL {
        let n = |k| ModelConfig::preset(p, k).num_params();
        println!(
            "{:<8} {:>12} {:>12} {:>12}",
            p.as_str(),
            n(AttentionKind::Standard),
            n(AttentionKind::DiffV1),
            n(AttentionKind::DiffV2)
        );
    }
}

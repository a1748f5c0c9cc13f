//! `difftx presets`: every preset's shape, and its parameter count for every kind.

use difftx::util::thousands;
use difftx::{AttentionKind, ModelConfig, Preset};

pub fn run() {
    let mut presets = Preset::ALL.to_vec();
    presets.sort_by_key(|&p| ModelConfig::preset(p, AttentionKind::Standard).num_params());
    println!(
        "{:<8} {:>5} {:>7} {:>9} {:>8} {:>7}   {:>16} {:>16} {:>16}",
        "preset", "D", "layers", "head dim", "context", "SwiGLU", "standard", "diff_v1", "diff_v2"
    );
    for p in presets {
        let c = ModelConfig::preset(p, AttentionKind::Standard);
        let kind = |k| {
            let c = ModelConfig::preset(p, k);
            let heads = format!("{}/{}", c.num_attention_heads, c.num_key_value_heads);
            format!("{:>10} {heads:>5}", thousands(c.num_params()))
        };
        println!(
            "{:<8} {:>5} {:>7} {:>9} {:>8} {:>7}   {:>16} {:>16} {:>16}",
            p.as_str(),
            c.hidden_size,
            c.num_hidden_layers,
            c.head_dim,
            c.max_position_embeddings,
            c.intermediate_size,
            kind(AttentionKind::Standard),
            kind(AttentionKind::DiffV1),
            kind(AttentionKind::DiffV2)
        );
    }
    println!(
        "\nEach kind's column: parameters, then heads as query/key-value. diff_v1's heads are\n\
         differential heads (two maps of head dim d each, one value of 2d); diff_v2 pairs its\n\
         query heads over the key-value heads. `bench` is the benchmarks' shape, smaller than\n\
         `small` (4 layers, context 256). The vocabulary is 256 (byte-level) unless a\n\
         tokenizer says otherwise."
    );
}

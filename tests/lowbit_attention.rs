//! Low-bit attention logits through the model (`Workspace::logit_bits`): the fake-quantised
//! path matches the kernel at many bits, changes the output at few, and refuses a KV cache.

use difftx::config::{AttentionKind, ModelConfig, Preset};
use difftx::model::{Model, Workspace};

#[test]
fn low_bit_attention_refuses_a_kv_cache() {
    let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0).unwrap();
    let mut ws = Workspace::new(&model, 1, 4);
    ws.logit_bits = Some(8);
    let mut caches = vec![difftx::model::KvCache::new(&model, 8)];
    let e = model
        .forward_cached(&mut ws, &mut caches, &[1, 2, 3, 4], 4, true)
        .unwrap_err()
        .to_string();
    assert!(e.contains("without a KV cache"), "{e}");
    assert_eq!(caches[0].len, 0);
}

#[test]
fn many_bits_reproduce_the_kernel_and_few_bits_change_the_logits() {
    for kind in AttentionKind::ALL {
        let mut c = ModelConfig::preset(Preset::Tiny, kind);
        c.max_position_embeddings = 40;
        let model = Model::init(c, 2).unwrap();
        let tokens: Vec<u32> = (0..80).map(|i| (i * 37 % 251) as u32).collect();
        let mut ws = Workspace::new(&model, 2, 40);
        model.forward(&mut ws, &tokens, 2, 40).unwrap();
        let (exact, exact_o) = (ws.logits.clone(), ws.layers[0].o.clone());
        let maxdiff = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        ws.logit_bits = Some(30);
        model.forward(&mut ws, &tokens, 2, 40).unwrap();
        let d = maxdiff(&exact, &ws.logits);
        assert!(d < 1e-4, "{kind}: max difference {d}");
        // 2 bits: every logit becomes −max, 0 or +max of its head
        ws.logit_bits = Some(2);
        model.forward(&mut ws, &tokens, 2, 40).unwrap();
        let d = maxdiff(&exact_o, &ws.layers[0].o);
        assert!(d > 1e-4, "{kind}: 2-bit logits changed nothing ({d})");
    }
}

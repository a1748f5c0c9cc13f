//! `difftx bench`: timed training steps on random tokens, the peak memory, and the FLOP count.

use crate::config::{AttentionKind, ModelConfig};
use crate::error::{Error, Result};
use crate::kernels::adamw::AdamWParams;
use crate::kernels::quant::Engine;
use crate::kernels::Precision;
use crate::model::{memory::Need, Model, Workspace};
use crate::train::Optimizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

#[derive(Clone, Debug, serde::Serialize)]
pub struct TrainBench {
    #[serde(rename = "impl")]
    pub impl_: &'static str,
    pub attention: String,
    pub params: usize,
    pub batch: usize,
    pub seq: usize,
    pub threads: usize,
    pub warmup: usize,
    pub steps: usize,
    /// median step time
    pub step_ms: f64,
    pub step_ms_min: f64,
    pub step_ms_max: f64,
    pub tokens_per_second: f64,
    /// model FLOPs of one step (see `train_flops`) and the rate they were done at
    pub flops_per_step: f64,
    pub gflops: f64,
    /// VmHWM of the process
    pub peak_rss_bytes: u64,
    /// parameters + gradients + two AdamW moments
    pub state_bytes: u64,
    /// the activation and gradient workspace
    pub workspace_bytes: u64,
    /// "f32", or "bf16" when `--bf16` routed the matrix products to bf16
    pub precision: &'static str,
    pub losses: Vec<f32>,
}

/// A matrix-product precision as reports name it.
pub fn precision(p: Precision) -> &'static str {
    if p.is_bf16() {
        "bf16"
    } else {
        "f32"
    }
}

/// Weights of the matrix products (every 2-D tensor but an input embedding that a separate
/// lm_head leaves to lookups).
pub fn matmul_params(c: &ModelConfig) -> usize {
    let layout = crate::config::params::ParamLayout::new(c);
    layout
        .specs
        .iter()
        .filter(|s| {
            s.shape.len() == 2
                && !(s.name == "model.embed_tokens.weight" && layout.lm_head.is_some())
        })
        .map(|s| s.numel())
        .sum()
}

/// Model FLOPs of one training step over B×T tokens: 6 per matmul weight per token (forward
/// 2, backward 4) plus the attention products, forward 2·P·(DK + DV) per query head with
/// P = T(T+1)/2 causal pairs, and twice that for the backward.
pub fn train_flops(c: &ModelConfig, b: usize, t: usize) -> f64 {
    let matmul_params = matmul_params(c);
    let n = (b * t) as f64;
    let pairs = (t * (t + 1) / 2) as f64;
    let attn_fwd = 2.0
        * pairs
        * (c.head_dim + c.value_head_dim()) as f64
        * (c.n_query_heads() * b * c.num_hidden_layers) as f64;
    6.0 * n * matmul_params as f64 + 3.0 * attn_fwd
}

/// Peak resident set size of this process (VmHWM), 0 where /proc is not available.
pub fn peak_rss_bytes() -> u64 {
    status_kib("self", "VmHWM").map_or(0, |kb| kb * 1024)
}

/// A field of /proc/`process`/status in KiB (`process`: a pid or "self"), e.g. VmHWM (peak
/// resident memory) or VmRSS (current); None where /proc or the field is not there.
pub fn status_kib(process: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Runs `warmup` untimed and `steps` timed training steps (forward, backward, AdamW) of a freshly
/// initialised model on seeded random tokens, its products in `precision`. `on_step` sees each
/// step's index and time.
pub fn bench_train(
    config: &ModelConfig,
    precision: Precision,
    batch: usize,
    warmup: usize,
    steps: usize,
    mut on_step: impl FnMut(usize, f64),
) -> Result<TrainBench> {
    let t = config.max_position_embeddings;
    Need::training(config, batch, t).check(&format!(
        "training with --batch {batch} at a context of {t}"
    ))?;
    let mut model = Model::init(config.clone(), 0)?;
    model.precision = precision;
    let mut ws = Workspace::new(&model, batch, t);
    let hp = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = Optimizer::new(&model, hp, 1.0);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let tokens: Vec<u32> = (0..batch * (t + 1))
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect();
    let (inputs, targets): (Vec<u32>, Vec<u32>) = tokens
        .chunks(t + 1)
        .flat_map(|s| s[..t].iter().copied().zip(s[1..].iter().copied()))
        .unzip();
    let mut times = Vec::with_capacity(steps);
    let mut losses = Vec::with_capacity(warmup + steps);
    for i in 0..warmup + steps {
        let t0 = Instant::now();
        let st = opt.step(&mut model, &mut ws, &inputs, &targets, batch, t, 1e-3)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        losses.push(st.loss);
        if i >= warmup {
            times.push(ms);
        }
        on_step(i, ms);
    }
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = if sorted.is_empty() {
        f64::NAN
    } else if sorted.len() % 2 == 1 {
        sorted[sorted.len() / 2]
    } else {
        0.5 * (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2])
    };
    let flops = train_flops(config, batch, t);
    Ok(TrainBench {
        impl_: "difftx",
        attention: config.attention.to_string(),
        params: model.num_params(),
        batch,
        seq: t,
        threads: rayon::current_num_threads(),
        warmup,
        steps,
        step_ms: median,
        step_ms_min: sorted.first().copied().unwrap_or(f64::NAN),
        step_ms_max: sorted.last().copied().unwrap_or(f64::NAN),
        tokens_per_second: (batch * t) as f64 / (median / 1e3),
        flops_per_step: flops,
        gflops: flops / (median / 1e3) / 1e9,
        peak_rss_bytes: peak_rss_bytes(),
        state_bytes: Need::training(config, batch, t).params as u64,
        workspace_bytes: ws.bytes() as u64,
        precision: self::precision(ws.precision),
        losses,
    })
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct MatmulBench {
    pub backend: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub threads: usize,
    /// A and C taken from main memory (`--cold`)
    pub cold: bool,
    /// median over the timed repetitions
    pub ms: f64,
    pub gflops: f64,
}

/// Times dst = a (m, k) · b (k, n), `reps` times after one warm-up, on each backend in turn
/// (alternating), and returns the median for each. `a_t` / `b_t` store that operand
/// transposed, as the model's products do: X·Wᵀ (b_t) forward, dYᵀ·X (a_t) for the weight
/// gradient. The calls run inside the thread pool, as a training step's do. `cold`: each
/// repetition takes the next of enough copies of A and C to overflow the L3, as a step's
/// activations do. With B stored transposed (a weight) and AVX512_BF16, also "difftx-bf16-packed":
/// B packed into bf16 tiles once beforehand, as inference keeps its weights, so that the time
/// is the product's alone (the product a decoding step or a prefill chunk runs); and where K
/// is a multiple of 32, "difftx-q8_0-ENGINE" and "difftx-q4_0-ENGINE" for each quantised
/// engine this CPU has (`--quant`'s products: B quantised once, A quantised in the timing, as a
/// forward does; GFLOP/s counts the same 2·M·N·K); and for up to 64 rows "difftx-f32-panels":
/// B packed in panels of 32 outputs beforehand, as a server's decoding batch reads f32 weights.
pub fn bench_matmul(
    m: usize,
    n: usize,
    k: usize,
    (a_t, b_t): (bool, bool),
    reps: usize,
    cold: bool,
) -> Vec<MatmulBench> {
    use crate::kernels::gemm::{gemm_on, Backend, Dims, Mat, Out};
    use crate::kernels::quant::{matmul_on, QuantAct, QuantKind, QuantMatrix};
    // `cold`: copies of A and C adding up to 128 MiB, four times this machine's L3, used in turn
    let sets = if cold {
        ((128usize << 20) / ((m * k + m * n) * 4)).clamp(2, 4096)
    } else {
        1
    };
    let a: Vec<Vec<f32>> = (0..sets)
        .map(|s| (0..m * k).map(|i| ((i + s) % 7) as f32 * 0.1).collect())
        .collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
    let rhs = if b_t { Mat::t(&b, k) } else { Mat::rows(&b, n) };
    let mut c: Vec<Vec<f32>> = (0..sets).map(|_| crate::kernels::zeroed(m * n)).collect();
    // touched once now, so that no timed product pays for its output's first page faults
    c.iter_mut().for_each(|c| c.fill(1.0));
    // what runs: difftx's and the gemm crate's products; with B a weight (stored transposed),
    // also as inference keeps it, packed in bf16 tiles, or quantised for every engine this CPU has
    let mut runs = vec![Run::Gemm(Backend::F32), Run::Gemm(Backend::GemmCrate)];
    let bf16 = crate::kernels::gemm::cpu::avx512_bf16();
    if bf16 {
        runs.push(Run::Gemm(Backend::Bf16));
    }
    #[cfg(target_arch = "x86_64")]
    let packed = match bf16 && b_t {
        true => crate::kernels::gemm::bf16::pack_weight(&b, n, k),
        false => Vec::new(),
    };
    if bf16 && b_t {
        runs.push(Run::Bf16Packed);
    }
    // (past GRID_ROWS rows, matmul_forward packs the f32 weights instead of reading panels)
    let panels = match b_t && m <= crate::kernels::gemm::linear::GRID_ROWS {
        true => crate::kernels::gemm::panels::pack(&b, n, k),
        false => Vec::new(),
    };
    if !panels.is_empty() {
        runs.push(Run::F32Panels);
    }
    let quant: Vec<QuantMatrix> = match b_t && k.is_multiple_of(32) {
        true => QuantKind::ALL
            .iter()
            .filter_map(|&kind| QuantMatrix::new(kind, &b, n, k))
            .collect(),
        false => Vec::new(),
    };
    for (i, _) in quant.iter().enumerate() {
        for &engine in Engine::available() {
            runs.push(Run::Quant(i, engine));
        }
    }
    let mut times = vec![Vec::new(); runs.len()];
    crate::kernels::on_pool(|| {
        #[cfg(target_arch = "x86_64")]
        let threads = rayon::current_num_threads();
        for rep in 0..=reps {
            for (bi, &run) in runs.iter().enumerate() {
                let set = (rep * runs.len() + bi) % sets;
                let a = &a[set];
                let lhs = if a_t { Mat::t(a, m) } else { Mat::rows(a, k) };
                let (d, out) = (Dims::new(m, n, k), Out::set(&mut c[set], n));
                let t0 = Instant::now();
                match run {
                    Run::Gemm(be) => gemm_on(be, d, lhs, rhs, out),
                    #[cfg(target_arch = "x86_64")]
                    Run::Bf16Packed => {
                        use crate::kernels::gemm::bf16::{gemm_packed, PackedB};
                        gemm_packed(d, lhs, &PackedB::weight(&packed, n, k), out, threads)
                    }
                    // only pushed where the CPU has AVX512_BF16
                    #[cfg(not(target_arch = "x86_64"))]
                    Run::Bf16Packed => unreachable!("bf16 tiles off x86-64"),
                    Run::F32Panels => {
                        use crate::kernels::gemm::linear::{matmul_forward, Weight};
                        let w = Weight {
                            panels: Some(&panels),
                            ..Weight::from(&b[..])
                        };
                        matmul_forward(out.dst, a, w, m, k, n, false, Precision::F32)
                    }
                    Run::Quant(i, engine) => {
                        // as a forward runs it: the input quantised, then the products
                        let x = QuantAct::new(a, m, k, quant[i].kind);
                        matmul_on(engine, &mut [(&mut *out.dst, &quant[i])], &x, false)
                    }
                }
                if rep > 0 {
                    times[bi].push(t0.elapsed().as_secs_f64());
                }
            }
        }
    });
    runs.iter()
        .zip(times)
        .map(|(run, mut t)| {
            t.sort_by(|x, y| x.total_cmp(y));
            let med = t[t.len() / 2];
            MatmulBench {
                backend: match *run {
                    Run::Gemm(Backend::F32) => "difftx".into(),
                    Run::Gemm(Backend::GemmCrate) => "gemm-crate".into(),
                    Run::Gemm(Backend::Bf16) => "difftx-bf16".into(),
                    Run::Bf16Packed => "difftx-bf16-packed".into(),
                    Run::F32Panels => "difftx-f32-panels".into(),
                    Run::Quant(i, engine) => {
                        format!("difftx-{}-{}", quant[i].kind, engine.name())
                    }
                },
                m,
                n,
                k,
                threads: rayon::current_num_threads(),
                cold,
                ms: med * 1e3,
                gflops: 2.0 * (m * n * k) as f64 / med / 1e9,
            }
        })
        .collect()
}

/// One product `bench_matmul` times.
#[derive(Clone, Copy)]
enum Run {
    Gemm(crate::kernels::gemm::Backend),
    /// bf16 with B packed beforehand
    Bf16Packed,
    /// f32 with B packed in panels beforehand
    F32Panels,
    /// B quantised (the i-th kind of `QuantKind::ALL` that fits), on an engine
    Quant(usize, Engine),
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeBench {
    #[serde(rename = "impl")]
    pub impl_: &'static str,
    pub attention: String,
    pub params: usize,
    pub threads: usize,
    pub batch: usize,
    pub prompt_len: usize,
    pub new_tokens: usize,
    pub reps: usize,
    pub prefill_s_median: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_s_median: f64,
    pub decode_tokens_per_s: f64,
    /// each timed repetition's decoding time, in order
    pub decode_s: Vec<f64>,
    /// with `probe_memory`: main memory's read rate (`memory_read_gbs`) before each timed
    /// repetition and after the last (reps + 1 readings), so that each repetition can be set
    /// against the rate of its own minutes; empty otherwise
    pub memory_gbs: Vec<f64>,
    /// the weight bytes each decoding step reads (an untied input embedding only a row a
    /// sequence, left out), in the form the products read them
    pub weight_bytes: u64,
    /// "bf16" when decoding read bf16 weights (`--bf16`), "q8_0" or "q4_0" with `--quant`
    pub precision: &'static str,
    /// the KV caches at the end of decoding (all `batch` of them), in their element type
    pub kv_cache_bytes: u64,
    /// "f32" or "bf16" (`--kv-cache`)
    pub kv_cache: &'static str,
    /// cache bytes a decoding step reads for one sequence, the mean over the steps: every
    /// cached row once
    pub kv_bytes_per_token: u64,
    /// with `phases`: the median over the repetitions of each phase's time a decoding step
    /// (`model::phases`, in the order of `Phase::ALL`); empty otherwise
    pub phases: Vec<PhaseTime>,
    /// with `phases`: the same for the prefill (every prompt's, as `prefill_s_median` counts)
    pub prefill_phases: Vec<PhaseTime>,
    /// prompt lookup's draft length (0: none); a draft model's tokens a step (0: none) and
    /// its parameters; in the last timed repetition the tokens drafted and accepted
    pub lookup: usize,
    pub draft: usize,
    pub draft_params: usize,
    pub drafted: usize,
    pub accepted: usize,
}

/// One phase's share of a decoding step or of a prefill.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PhaseTime {
    pub phase: &'static str,
    pub seconds: f64,
}

/// Greedy decoding of `batch` sequences together after seeded random prompts of `prompt_len`
/// tokens each, `reps` times after one warm-up; medians of the prefill time and of the time
/// for `new_tokens` steps. Past one sequence the products are the server's batch-invariant
/// ones (`set_batch_invariant`), so that this measures what `serve --parallel` decodes. With
/// `probe_memory`, main memory's read rate is measured between the repetitions (not during
/// them): a shared machine's rate moves from one minute to the next, and a decode bound by it
/// compares only with the rate of its own minutes. With `phases`, each repetition also times
/// the phases of its prefill and of its decoding steps (`model::phases`; the first new token,
/// drawn from the prefill's logits, divides them).
pub fn bench_decode(
    model: &Model,
    prompt_len: usize,
    new_tokens: usize,
    reps: usize,
    batch: usize,
    (probe_memory, phases): (bool, bool),
    source: DecodeSource,
) -> Result<DecodeBench> {
    use crate::infer::{generate_with_draft, DraftModel, GenerateOptions, Sampling};
    use crate::model::phases::{self as ph, Phase};
    let ctx = model.config.max_position_embeddings;
    if prompt_len == 0 || new_tokens == 0 || batch == 0 {
        return Err(Error::Invalid(
            "--prompt-len, --new-tokens and --batch must be positive".into(),
        ));
    }
    if prompt_len + new_tokens > ctx {
        return Err(Error::Invalid(format!(
            "--prompt-len {prompt_len} + --new-tokens {new_tokens} exceed the context of {ctx} tokens"
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    let prompts: Vec<Vec<u32>> = (0..batch)
        .map(|_| match &source.prompt {
            // a text's tokens, its first prompt_len (the caller checked it has them)
            Some(p) => p[..prompt_len].to_vec(),
            None => (0..prompt_len)
                .map(|_| rng.random_range(0..model.config.vocab_size as u32))
                .collect(),
        })
        .collect();
    let opts = GenerateOptions {
        max_new_tokens: new_tokens + 1, // the first new token comes from the prefill
        sampling: Sampling::greedy(),
        seed: 0,
        eos: None,
        truncate_prompt: false,
        lookup: source.lookup,
    };
    let mut draft = match source.draft {
        Some((d, n)) => Some(DraftModel::new(d, model, n)?),
        None => None,
    };
    let mut memory_gbs = Vec::new();
    let mut drafts = (0, 0);
    // each repetition's phase times: (prefill, decoding steps)
    let mut phase_s: Vec<[[f64; 6]; 2]> = Vec::new();
    let mut timed = || -> Result<(Vec<f64>, Vec<f64>)> {
        // the phases until the first new token are the prefill's, the rest the steps'
        let mut run = || -> Result<_> {
            let mut prefill = None;
            ph::reset();
            let g = generate_with_draft(model, draft.as_mut(), &prompts, &opts, |_, _| {
                if prefill.is_none() {
                    prefill = Some(ph::seconds());
                    ph::reset();
                }
            })?;
            Ok((g, [prefill.unwrap_or_default(), ph::seconds()]))
        };
        run()?;
        let (mut pre, mut dec) = (Vec::new(), Vec::new());
        for _ in 0..reps.max(1) {
            if probe_memory {
                memory_gbs.push(memory_read_gbs());
            }
            let (g, times) = run()?;
            drafts = (g.drafted, g.accepted);
            pre.push(g.prefill_seconds);
            dec.push(g.decode_seconds);
            phase_s.push(times);
        }
        if probe_memory {
            memory_gbs.push(memory_read_gbs());
        }
        Ok((pre, dec))
    };
    if batch > 1 {
        crate::kernels::gemm::linear::set_batch_invariant(batch);
    }
    ph::switch(phases);
    let result = timed();
    ph::switch(false);
    crate::kernels::gemm::linear::set_batch_invariant(0);
    let (mut pre, dec) = result?;
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (p, d) = (med(&mut pre), med(&mut dec.clone()));
    // the median of each phase over the repetitions, the steps' divided among the steps
    let phase_times = |k: usize, per: f64| -> Vec<PhaseTime> {
        match phases {
            true => (Phase::ALL.iter().enumerate())
                .map(|(i, ph)| PhaseTime {
                    phase: ph.name(),
                    seconds: med(&mut phase_s.iter().map(|s| s[k][i]).collect()) / per,
                })
                .collect(),
            false => Vec::new(),
        }
    };
    let (prefill_phases, phases) = (phase_times(0, 1.0), phase_times(1, new_tokens as f64));
    let c = &model.config;
    let kv = model.kv_cache;
    let kv_per_token = c.num_hidden_layers
        * (kv.row_bytes(c.n_key_heads() * c.head_dim)
            + kv.row_bytes(c.num_key_value_heads * c.value_head_dim()));
    // step i (from 1) of decoding attends to prompt_len + i cached rows
    let rows_read = prompt_len as f64 + (new_tokens + 1) as f64 / 2.0;
    Ok(DecodeBench {
        impl_: "difftx",
        attention: c.attention.to_string(),
        params: model.num_params(),
        threads: rayon::current_num_threads(),
        batch,
        prompt_len,
        new_tokens,
        reps: reps.max(1),
        prefill_s_median: p,
        prefill_tokens_per_s: (batch * prompt_len) as f64 / p,
        decode_s_median: d,
        decode_tokens_per_s: (batch * new_tokens) as f64 / d,
        decode_s: dec,
        memory_gbs,
        // with --bf16 the matrix products of decoding read 2 bytes a weight, with --quant
        // their blocks; an untied input embedding is read a row a token, not whole
        weight_bytes: match &model.quant {
            Some(q) => (4 * (model.num_params() - q.params()) + q.bytes()) as u64,
            None if model.precision.is_bf16() => {
                (4 * model.num_params() - 2 * matmul_params(c)) as u64
            }
            None => 4 * model.num_params() as u64,
        } - untied_embedding_bytes(c),
        precision: match &model.quant {
            Some(q) => q.kind.as_str(),
            None => precision(model.precision),
        },
        kv_cache_bytes: (batch * kv_per_token * (prompt_len + new_tokens)) as u64,
        kv_cache: model.kv_cache.as_str(),
        kv_bytes_per_token: (kv_per_token as f64 * rows_read) as u64,
        phases,
        prefill_phases,
        lookup: source.lookup,
        draft: source.draft.map_or(0, |d| d.1),
        draft_params: source.draft.map_or(0, |d| d.0.num_params()),
        drafted: drafts.0,
        accepted: drafts.1,
    })
}

/// What `bench_decode` decodes after: seeded random prompts (`prompt: None`), or a text's
/// tokens; and speculative decoding's drafts: prompt lookup's draft length (0: none), or a
/// draft model and its tokens a step.
#[derive(Clone, Default)]
pub struct DecodeSource<'d> {
    pub prompt: Option<Vec<u32>>,
    pub lookup: usize,
    pub draft: Option<(&'d Model, usize)>,
}

/// The bytes of an input embedding table that decoding reads one row of a token (none where
/// it is the LM head's too, which reads it whole): at a vocabulary of 32,000 and `large`, 98 MB
/// that a step does not read.
fn untied_embedding_bytes(c: &crate::config::ModelConfig) -> u64 {
    match c.tie_word_embeddings {
        true => 0,
        false => 4 * (c.vocab_size * c.hidden_size) as u64,
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct AttentionBench {
    pub attention: String,
    pub batch: usize,
    pub seq: usize,
    pub threads: usize,
    pub forward_ms: f64,
    pub backward_ms: f64,
    /// FLOPs the kernel executes (the backward recomputes the scores), and their rate
    pub forward_gflops: f64,
    pub backward_gflops: f64,
}

/// Times one layer's causal attention kernel (forward, then backward) on random inputs of the
/// preset's head layout, median of `reps`.
pub fn bench_attention(
    config: &ModelConfig,
    precision: Precision,
    batch: usize,
    reps: usize,
) -> AttentionBench {
    use crate::kernels::attention::{
        attention_backward, attention_delta, attention_forward, Lambda,
    };
    let s = crate::model::attention::shape(config);
    let t = config.max_position_embeddings;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() - 0.5).collect() };
    let (q, k, v) = (
        rand(batch * t * s.nq * s.dk),
        rand(batch * t * s.nk * s.dk),
        rand(batch * t * s.nv * s.dv),
    );
    // the diff kinds' backward shares each pair's value products, as in the model, and reads
    // the gradient of the pairs' combined output
    let lam = vec![0.5; batch * t * s.nq / 2];
    let pairs = match config.attention {
        AttentionKind::Standard => None,
        AttentionKind::DiffV1 => Some(Lambda::Layer(0.5)),
        AttentionKind::DiffV2 => Some(Lambda::PerToken(&lam)),
    };
    let do_heads = if pairs.is_some() { s.nq / 2 } else { s.nq };
    let dout = rand(batch * t * do_heads * s.dv);
    // attention_delta's rows sum dO ∘ O per map: a copy of dout per map stands in for it
    let dmaps: Vec<f32> = dout
        .chunks(s.dv)
        .flat_map(|r| std::iter::repeat_n(r, s.nq / do_heads).flatten().copied())
        .collect();
    let (mut o, mut lse) = (vec![0.0; dmaps.len()], vec![0.0; batch * s.nq * t]);
    let mut delta = vec![0.0; batch * t * s.nq];
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let (mut tf, mut tb) = (Vec::new(), Vec::new());
    crate::kernels::on_pool(|| {
        for rep in 0..=reps {
            let t0 = Instant::now();
            let p = precision;
            attention_forward(&mut o, &mut lse, &q, &k, &v, batch, t, t, 0, &s, p);
            let t1 = Instant::now();
            attention_delta(&mut delta, &dmaps, &o, s.nq, s.dv);
            attention_backward(
                &mut dq, &mut dk, &mut dv, &dout, &q, &k, &v, &delta, &lse, batch, t, &s, pairs, p,
            );
            if rep > 0 {
                tf.push((t1 - t0).as_secs_f64());
                tb.push(t1.elapsed().as_secs_f64());
            }
        }
    });
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (f, b) = (med(&mut tf), med(&mut tb));
    let seen = (t * (t + 1) / 2) as f64 * (batch * s.nq) as f64;
    let fwd_flops = 2.0 * seen * (s.dk + s.dv) as f64;
    // per map: S, dQ and dK; dP and dV once per map, or once per pair
    let dv_products = if pairs.is_some() { 1 } else { 2 };
    let bwd_flops = 2.0 * seen * (3 * s.dk + dv_products * s.dv) as f64;
    AttentionBench {
        attention: config.attention.to_string(),
        batch,
        seq: t,
        threads: rayon::current_num_threads(),
        forward_ms: f * 1e3,
        backward_ms: b * 1e3,
        forward_gflops: fwd_flops / f / 1e9,
        backward_gflops: bwd_flops / b / 1e9,
    }
}

/// The f32 FMA ceiling of one core: GFLOP/s of independent AVX-512 FMAs on registers (no
/// memory traffic), or `None` without AVX-512F.
pub fn fma_peak_gflops() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        if !is_x86_feature_detected!("avx512f") {
            return None;
        }
        /// # Safety
        /// AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn run(iters: usize) -> f32 {
            // (unsafe only as `register_peak`'s argument type: register arithmetic alone)
            let mut acc = [_mm512_set1_ps(0.0); 24];
            let (a, b) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(0.999_999_9));
            for _ in 0..iters {
                for x in acc.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, a, b);
                }
            }
            sum_registers(acc)
        }
        // SAFETY: AVX-512F was detected above.
        Some(unsafe { register_peak(run, 24 * 32) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// The bf16 ceiling of one core (`--bf16` without AMX): GFLOP/s of independent VDPBF16PS on
/// registers, each two multiply-adds in each of 16 f32 lanes; `None` without AVX512_BF16.
pub fn dot_bf16_peak_gflops() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        if !crate::kernels::gemm::cpu::avx512_bf16() {
            return None;
        }
        /// # Safety
        /// AVX-512F and AVX512_BF16.
        #[target_feature(enable = "avx512f,avx512bf16")]
        unsafe fn run(iters: usize) -> f32 {
            // SAFETY: AVX512_BF16 is the caller's contract (`dot_bf16_peak_gflops` checked
            // it); the body only computes on registers.
            unsafe {
                let mut acc = [_mm512_set1_ps(0.0); 24];
                // bf16 pairs (1.0, 1.0) and (2^-20, 2^-20): the sums grow slowly, stay finite
                let a: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3f80_3f80));
                let b: __m512bh = std::mem::transmute(_mm512_set1_epi32(0x3580_3580));
                for _ in 0..iters {
                    for x in acc.iter_mut() {
                        *x = _mm512_dpbf16_ps(*x, a, b);
                    }
                }
                sum_registers(acc)
            }
        }
        // SAFETY: AVX512_BF16 was detected above.
        Some(unsafe { register_peak(run, 24 * 64) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// GFLOP/s of `run(iters)`, a loop doing `flops` per iteration on registers, after a warm-up.
///
/// # Safety
/// `run` must be safe to call on this CPU.
#[cfg(target_arch = "x86_64")]
unsafe fn register_peak(run: unsafe fn(usize) -> f32, flops: usize) -> f64 {
    // SAFETY: `run` is safe to call on this CPU: this fn's contract.
    unsafe {
        let iters = 20_000_000;
        run(iters / 10);
        let t0 = Instant::now();
        std::hint::black_box(run(iters));
        (iters * flops) as f64 / t0.elapsed().as_secs_f64() / 1e9
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn sum_registers(acc: [std::arch::x86_64::__m512; 24]) -> f32 {
    use std::arch::x86_64::*;
    let mut s = _mm512_setzero_ps();
    for x in acc {
        s = _mm512_add_ps(s, x);
    }
    _mm512_reduce_add_ps(s)
}

/// Read bandwidth of main memory in GB/s: `read_gbs` over 1 GiB, much larger than any cache.
pub fn memory_read_gbs() -> f64 {
    read_gbs(1 << 30)
}

/// Read rate in GB/s over a buffer of `bytes`, every pool thread summing its share: the median
/// of 5 timed rounds (after one that faults the pages in), each reading the buffer as many
/// times as 256 MB takes. Over a decoding step's bytes (weights and KV cache) it is the rate
/// at which those bytes come back token after token, from the L3 cache where they fit.
pub fn read_gbs(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let buf = vec![1.0f32; (bytes / 4).max(1 << 16)];
    let passes = (256usize << 20).div_ceil(buf.len() * 4);
    // one contiguous share per thread, as the hardware prefetchers like best
    let share = buf.len().div_ceil(rayon::current_num_threads());
    let mut rates = Vec::new();
    // on the pool, as decoding runs: passes fork inside it instead of waking it each time
    crate::kernels::on_pool(|| {
        for _ in 0..6 {
            let t0 = Instant::now();
            for _ in 0..passes {
                let s: f32 = buf.par_chunks(share).map(sum_wide).sum();
                std::hint::black_box(s);
            }
            let secs = t0.elapsed().as_secs_f64();
            rates.push((passes * buf.len() * 4) as f64 / secs / 1e9);
        }
    });
    rates.remove(0); // the first round also faults the pages in
    rates.sort_by(|a, b| a.total_cmp(b));
    rates[rates.len() / 2]
}

/// Σ x in four AVX-512 registers: enough independent additions that the sum keeps up with
/// any cache's read rate, where one register's chain would not.
fn sum_wide(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::gemm::cpu::avx512f() {
        /// # Safety
        /// AVX-512F.
        #[target_feature(enable = "avx512f")]
        unsafe fn sum4(x: &[f32]) -> f32 {
            // SAFETY: AVX-512F is the caller's contract; each load reads 16 values at
            // 16·i < 64 from a chunk of exactly 64.
            unsafe {
                use std::arch::x86_64::*;
                let mut acc = [_mm512_setzero_ps(); 4];
                let chunks = x.chunks_exact(64);
                let rest: f32 = chunks.remainder().iter().sum();
                for c in chunks {
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_add_ps(*a, _mm512_loadu_ps(c.as_ptr().add(16 * i)));
                    }
                }
                let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
                _mm512_reduce_add_ps(s) + rest
            }
        }
        // SAFETY: AVX-512F was detected.
        return unsafe { sum4(x) };
    }
    crate::kernels::sum_lanes(x)
}

/// One run of `bench_bf16`: per-step training losses, median step time, validation loss.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PrecisionRun {
    pub precision: &'static str,
    pub losses: Vec<f32>,
    pub step_ms: f64,
    /// mean next-byte loss over the validation windows, scored with f32 products
    pub val_loss: f64,
}

/// The bf16 check of issue 6's target 6: the same short run (same seed, same windows) with f32
/// and with bf16 matrix products, and how far apart the loss curves end up.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Bf16Bench {
    pub attention: String,
    pub params: usize,
    pub steps: u64,
    pub batch: usize,
    pub seq: usize,
    pub threads: usize,
    pub f32: PrecisionRun,
    pub bf16: PrecisionRun,
    /// largest |bf16 − f32| / f32 over the means of consecutive `WINDOW`-step windows
    pub max_window_rel_diff: f64,
    /// the same for the last window
    pub final_rel_diff: f64,
    pub val_rel_diff: f64,
    /// f32 step time / bf16 step time
    pub speedup: f64,
}

/// Steps per window when loss curves are compared: single steps differ by batch noise that
/// the two runs share, windows show the drift.
pub const WINDOW: usize = 10;

/// Means of consecutive `WINDOW`-step windows of a loss curve (the last may be shorter).
pub fn window_means(losses: &[f32]) -> Vec<f64> {
    losses
        .chunks(WINDOW)
        .map(|w| w.iter().map(|&x| x as f64).sum::<f64>() / w.len() as f64)
        .collect()
}

/// Trains `config` for `run.steps` steps on seeded random windows of `text` (training part),
/// once with f32 products and once with bf16, and compares the curves (validation losses
/// from f32 products for both). `on_step(precision, step)` reports progress.
pub fn bench_bf16(
    config: &ModelConfig,
    run: &crate::train::in_memory::ShortRun,
    text: &[u8],
    mut on_step: impl FnMut(&str, u64),
) -> Result<Bf16Bench> {
    use crate::error::Error;
    use crate::experiments::corpus::{fill_windows, split, val_starts};
    use crate::experiments::lm_scaling::window_loss;
    let (train, val) = split(text);
    let (b, t) = (run.batch, run.context);
    if train.len() < t + 1 || val.len() < t + 1 {
        return Err(Error::Invalid(format!(
            "a text of {} bytes is too short for windows of {t} bytes (its last 10% is for validation)",
            text.len()
        )));
    }
    let starts = val_starts(val.len(), t, 64);
    let mut runs = Vec::new();
    let mut params = 0;
    for bf16 in [false, true] {
        let Some(p) = Precision::new(bf16) else {
            return Err(Error::Invalid(
                "bf16 needs AVX512_BF16, which this CPU lacks".into(),
            ));
        };
        let tag = precision(p);
        let mut last = Instant::now();
        let mut times = Vec::with_capacity(run.steps as usize);
        let fill = |rng: &mut ChaCha8Rng, x: &mut [u32], y: &mut [u32]| -> Result<usize> {
            fill_windows(rng, train, x, y, b, t);
            Ok(t)
        };
        let trained = crate::train::in_memory::train_short_in(
            config.clone(),
            run,
            p,
            (0, 0x6266_3136),
            fill,
            |step, _| {
                times.push(last.elapsed().as_secs_f64() * 1e3);
                last = Instant::now();
                on_step(tag, step);
            },
        );
        let mut trained = trained?;
        // both runs' validation losses come from f32 products
        trained.model.precision = Precision::F32;
        params = trained.model.num_params();
        times.sort_by(|a, b| a.total_cmp(b));
        runs.push(PrecisionRun {
            precision: tag,
            step_ms: times.get(times.len() / 2).copied().unwrap_or(f64::NAN),
            val_loss: window_loss(&trained.model, val, &starts, t, b)?,
            losses: trained.losses,
        });
    }
    let bf16 = runs.pop().expect("two runs");
    let f32 = runs.pop().expect("two runs");
    let (wf, wb) = (window_means(&f32.losses), window_means(&bf16.losses));
    let rel = |x: f64, r: f64| (x - r).abs() / r.abs();
    let diffs: Vec<f64> = wb.iter().zip(&wf).map(|(&x, &r)| rel(x, r)).collect();
    Ok(Bf16Bench {
        attention: config.attention.to_string(),
        params,
        steps: run.steps,
        batch: b,
        seq: t,
        threads: rayon::current_num_threads(),
        max_window_rel_diff: diffs.iter().copied().fold(0.0, f64::max),
        final_rel_diff: diffs.last().copied().unwrap_or(f64::NAN),
        val_rel_diff: rel(bf16.val_loss, f32.val_loss),
        speedup: f32.step_ms / bf16.step_ms,
        f32,
        bf16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Preset;

    /// Every kind's attention kernel runs at the `bench` preset's head layout (diff_v2: two
    /// pairs of query heads over each value head, with a λ per token and pair).
    #[test]
    fn attention_bench_runs_every_kind_at_the_bench_layout() {
        for kind in [
            AttentionKind::Standard,
            AttentionKind::DiffV1,
            AttentionKind::DiffV2,
        ] {
            let r = bench_attention(
                &ModelConfig::preset(Preset::Bench, kind),
                Precision::F32,
                1,
                1,
            );
            assert!(r.forward_ms > 0.0 && r.backward_ms > 0.0, "{kind}: {r:?}");
            assert!(r.backward_gflops.is_finite(), "{kind}: {r:?}");
        }
    }
}

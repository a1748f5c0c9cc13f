//! The decoder stack, top to bottom:
//!
//! ```text
//! x = embed_tokens[tokens]
//! for each block: x = block(x)
//! logits = lm_head(norm(x))        # lm_head may be tied to embed_tokens
//! ```

use super::bf16_weights::Bf16Weights;
use super::block::{
    block_backward, block_forward, linear_backward, Attend, Dims, Layer, LayerActs, Scratch,
};
use super::f32_panels::F32Panels;
use super::kv_cache::KvCache;
use super::phases::{Clock, Phase};
use super::quant_weights::QuantWeights;
use crate::config::params::LayerParams;
use crate::config::params::ParamLayout;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::cross_entropy::{
    counted, cross_entropy_backward, cross_entropy_forward, mean_loss, IGNORE,
};
use crate::kernels::embedding::{embedding_backward, embedding_forward};
use crate::kernels::gemm::matmul_forward;
use crate::kernels::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::kernels::rope::RopeTable;
use crate::kernels::{Grad, Precision};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A model: its config, the parameter table and every parameter in one flat buffer.
///
/// ```
/// use difftx::prelude::*;
///
/// let config = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV2);
/// let model = Model::init(config, 0)?;
/// let dir = tempfile::tempdir()?;
/// model.save(dir.path())?;
/// let (loaded, _tok) = open_model(dir.path())?;
/// assert_eq!(loaded.params, model.params);
/// assert_eq!(loaded.num_params(), model.num_params());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Model {
    /// The shape and kind.
    pub config: ModelConfig,
    /// Where each named tensor lies in `params`.
    pub layout: ParamLayout,
    /// Every weight, in `layout` order.
    pub params: Vec<f32>,
    pub(crate) dims: Dims,
    pub(crate) rope: RopeTable,
    /// The matrix products' operands (f32 unless the caller sets `Precision::Bf16`, which
    /// only `Precision::new` on an AVX512_BF16 CPU gives): a `Workspace` made for this model
    /// runs its forwards and backwards in it. Not part of a checkpoint.
    pub precision: Precision,
    /// The linear layers and LM head in Q8_0/Q4_0 blocks (`quantize`, inference only), which
    /// every forward pass then multiplies by. Not part of a checkpoint.
    pub quant: Option<std::sync::Arc<QuantWeights>>,
    /// The element type of the KV caches made for this model (`KvCache::new`): f32, or bf16
    /// (`--kv-cache bf16`). Not part of a checkpoint.
    pub kv_cache: super::kv_cache::KvKind,
}

/// Everything a forward and backward pass over up to B×T tokens writes, allocated once.
pub struct Workspace {
    /// Sequences B the buffers hold.
    pub batch: usize,
    /// Tokens per sequence T the buffers hold.
    pub seq: usize,
    /// Each block's saved activations.
    pub layers: Vec<LayerActs>,
    /// the residual stream; after `forward` it holds the last block's output
    pub x: Vec<f32>,
    /// each block's output (B, T, D), kept only when `keep_hidden` is set (parity tests, evals)
    pub hidden: Vec<Vec<f32>>,
    /// Whether `hidden` is filled.
    pub keep_hidden: bool,
    /// evaluation only: absmax-quantise the attention logits to this many bits
    /// (eval/lowbit.rs); no KV cache and no backward after such a forward pass
    pub logit_bits: Option<u32>,
    /// The final norm's output.
    pub lnf: Vec<f32>,
    /// The final norm's reciprocal RMS per token.
    pub rstdf: Vec<f32>,
    /// The logits (B, T, vocab) after `forward`.
    pub logits: Vec<f32>,
    /// Each position's cross-entropy after `loss`.
    pub losses: Vec<f32>,
    /// Each position's log-sum-exp of the logits.
    pub ce_lse: Vec<f32>,
    /// The input tokens of the last forward.
    pub tokens: Vec<u32>,
    /// The targets of the last loss.
    pub targets: Vec<u32>,
    /// each sequence's first position in a cached forward
    positions: Vec<usize>,
    scratch: Scratch,
    dx: Vec<f32>,
    dlnf: Vec<f32>,
    dlogits: Vec<f32>,
    /// (b, t) of the last forward
    cur: (usize, usize),
    /// bf16 copies of the model's weights that cached forwards read (`keep_bf16_weights`)
    bf16: Option<std::sync::Arc<super::bf16_weights::Bf16Weights>>,
    /// f32 weights in panels that cached forwards read (`keep_f32_panels`), shareable
    panels: Option<std::sync::Arc<super::f32_panels::F32Panels>>,
    /// the model's `precision` when this was made, which its buffers are sized for and every
    /// pass through it runs in
    pub precision: Precision,
    /// `Workspace::bytes_for` of its sizes
    buffer_bytes: usize,
}

/// Standard normal samples by Box–Muller from a seeded generator.
struct Normal {
    rng: ChaCha8Rng,
    spare: Option<f64>,
}

impl Normal {
    fn sample(&mut self) -> f64 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let u1: f64 = 1.0 - self.rng.random::<f64>(); // (0, 1]
        let u2: f64 = self.rng.random();
        let r = (-2.0 * u1.ln()).sqrt();
        let a = std::f64::consts::TAU * u2;
        self.spare = Some(r * a.sin());
        r * a.cos()
    }
}

impl Model {
    /// A model with all-zero parameters (to be filled by `init` or a checkpoint).
    pub fn zeros(config: ModelConfig) -> Result<Self> {
        config.validate().map_err(Error::Invalid)?;
        let layout = ParamLayout::new(&config);
        let dims = Dims::new(&config);
        let rope = RopeTable::new(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
        );
        Ok(Model {
            params: crate::kernels::zeroed(layout.total),
            layout,
            config,
            dims,
            rope,
            precision: Precision::F32,
            quant: None,
            kv_cache: Default::default(),
        })
    }

    /// The same weights at another context length `n`: the rotary table rebuilt for `n`
    /// positions (no weight depends on the context). Past the length a model was trained at,
    /// its positions are ones it never saw; the caller says so (`eval`, `needle`).
    pub fn set_context(&mut self, n: usize) -> Result<()> {
        let mut c = self.config.clone();
        c.max_position_embeddings = n;
        c.validate().map_err(Error::Invalid)?;
        self.rope = RopeTable::new(c.head_dim, n, c.rope_theta);
        self.config = c;
        Ok(())
    }

    /// Seeded initialisation: linears N(0, 0.02), output projections (o_proj, down_proj) scaled
    /// by 1/√(2L) as in GPT-2, λ vectors N(0, 0.1), norm weights ones.
    pub fn init(config: ModelConfig, seed: u64) -> Result<Self> {
        let mut m = Self::zeros(config)?;
        let mut normal = Normal {
            rng: ChaCha8Rng::seed_from_u64(seed),
            spare: None,
        };
        let depth_scale = 1.0 / (2.0 * m.config.num_hidden_layers as f64).sqrt();
        for spec in &m.layout.specs {
            let n = &spec.name;
            let std = if n.ends_with("norm.weight") || n.ends_with("subln.weight") {
                None
            } else if n.contains(".lambda_") && !n.ends_with("lambda_proj.weight") {
                Some(0.1)
            } else if n.ends_with("o_proj.weight") || n.ends_with("down_proj.weight") {
                Some(0.02 * depth_scale)
            } else {
                Some(0.02)
            };
            let dst = &mut m.params[spec.range()];
            match std {
                None => dst.fill(1.0),
                Some(s) => dst
                    .iter_mut()
                    .for_each(|x| *x = (normal.sample() * s) as f32),
            }
        }
        Ok(m)
    }

    /// Quantises the linear layers and the LM head to `kind` blocks for inference: every
    /// forward pass then multiplies by them (`backward` refuses). Returns the names of the
    /// matrices left f32, whose width is not a multiple of 32.
    ///
    /// ```
    /// use difftx::prelude::*;
    ///
    /// let mut model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?;
    /// let kept_f32 = model.quantize(QuantKind::Q8_0);
    /// assert!(kept_f32.is_empty());
    /// model.kv_cache = KvKind::Bf16; // half the KV cache's bytes
    /// let tokens = Tokenizer::Bytes.encode("the cat sat on the mat, the cat sat on the mat")?;
    /// let r = evaluate_loss(&model, &tokens, 1, |_, _| {})?;
    /// assert!(r.loss.is_finite());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn quantize(&mut self, kind: crate::kernels::quant::QuantKind) -> Vec<String> {
        let q = QuantWeights::new(self, kind);
        let kept = q.kept_f32.clone();
        self.quant = Some(std::sync::Arc::new(q));
        kept
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.layout.total
    }

    /// The slice of one named tensor.
    pub fn tensor(&self, name: &str) -> Option<&[f32]> {
        self.layout.find(name).map(|s| &self.params[s.range()])
    }

    /// Runs the stack over tokens (B, T) and writes the logits (B, T, V) into the workspace.
    pub fn forward(&self, ws: &mut Workspace, tokens: &[u32], b: usize, t: usize) -> Result<()> {
        self.run(ws, tokens, b, t, None, true)
    }

    /// Appends T tokens to each of B sequences, one KV cache each (tokens (B, T)), attending to
    /// what the caches hold. Writes the logits of every new position (B, T, V) with
    /// `all_logits`, else only of each sequence's last one (B, V), and advances the caches.
    pub fn forward_cached(
        &self,
        ws: &mut Workspace,
        caches: &mut [KvCache],
        tokens: &[u32],
        t: usize,
        all_logits: bool,
    ) -> Result<()> {
        let b = caches.len();
        for c in caches.iter() {
            if c.len + t > c.capacity {
                return Err(Error::Invalid(format!(
                    "{} cached + {t} new tokens exceed the cache of {} (context {})",
                    c.len, c.capacity, self.config.max_position_embeddings
                )));
            }
        }
        self.run(ws, tokens, b, t, Some(caches), all_logits)?;
        Ok(())
    }

    /// Block `index` as the forward and backward take it.
    fn layer<'a>(
        &'a self,
        index: usize,
        p: &'a LayerParams,
        (wb, wq, wp): (
            Option<&'a Bf16Weights>,
            Option<&'a QuantWeights>,
            Option<&'a F32Panels>,
        ),
        precision: Precision,
    ) -> Layer<'a> {
        Layer {
            w: &self.params,
            wb,
            wq,
            wp,
            p,
            d: &self.dims,
            index,
            rope: &self.rope,
            precision,
        }
    }

    /// A forward's one-line refusals: a sequence longer than the context, a call that does not
    /// fit the workspace, a token outside the vocabulary, low-bit attention with a cache.
    fn check_run(
        &self,
        ws: &Workspace,
        tokens: &[u32],
        b: usize,
        t: usize,
        cached: bool,
    ) -> Result<()> {
        let c = &self.config;
        if t > c.max_position_embeddings {
            return Err(Error::Invalid(format!(
                "sequence of {t} tokens is longer than the context (max_position_embeddings {})",
                c.max_position_embeddings
            )));
        }
        if b > ws.batch || t > ws.seq || tokens.len() != b * t || b * t == 0 {
            return Err(Error::Invalid(format!(
                "forward over {b}×{t} tokens ({} given) does not fit a {}×{} workspace",
                tokens.len(),
                ws.batch,
                ws.seq
            )));
        }
        if let Some(&bad) = tokens.iter().find(|&&tok| tok as usize >= c.vocab_size) {
            return Err(Error::Invalid(format!(
                "token id {bad} is outside the vocabulary ({})",
                c.vocab_size
            )));
        }
        if cached && ws.logit_bits.is_some() {
            return Err(Error::Invalid(
                "low-bit attention is evaluation-only and runs without a KV cache".into(),
            ));
        }
        Ok(())
    }

    fn run(
        &self,
        ws: &mut Workspace,
        tokens: &[u32],
        b: usize,
        t: usize,
        mut caches: Option<&mut [KvCache]>,
        all_logits: bool,
    ) -> Result<()> {
        // 1. The call fits the model and the workspace
        self.check_run(ws, tokens, b, t, caches.is_some())?;
        let c = &self.config;
        let (n, dm, v) = (b * t, c.hidden_size, c.vocab_size);
        let w = &self.params;
        // Only a cached forward (inference) reads the bf16 copies; they were taken from this model.
        let wb = ws
            .bf16
            .as_deref()
            .filter(|b| caches.is_some() && b.fits(w.len()));
        let wp = ws
            .panels
            .as_deref()
            .filter(|p| caches.is_some() && p.fits(w.len()));
        // Every forward reads the quantised weights, where the model holds them.
        let wq = self.quant.as_deref().filter(|q| q.fits(w.len()));
        let (bits, precision) = (ws.logit_bits, ws.precision);
        // 2. Embedding, at each sequence's next position (its cache's length)
        ws.cur = (b, t);
        ws.tokens[..n].copy_from_slice(tokens);
        if let Some(caches) = caches.as_deref() {
            for (p, cache) in ws.positions.iter_mut().zip(caches) {
                *p = cache.len;
            }
        }
        let x = &mut ws.x[..n * dm];
        embedding_forward(x, tokens, &w[self.layout.embed_tokens.range()], dm);
        // 3. The blocks, each attending in full, through the caches, or with low-bit logits;
        //    in a workspace for inference they take turns with one block's activations
        let shared = ws.layers.len() < self.layout.layers.len();
        for (l, p) in self.layout.layers.iter().enumerate() {
            let acts = &mut ws.layers[if shared { 0 } else { l }];
            let attend = match (caches.as_deref_mut(), bits) {
                (Some(cs), _) => Attend::Cached(cs, &ws.positions[..b]),
                (None, Some(bits)) => Attend::LowBit(bits),
                (None, None) => Attend::Full,
            };
            block_forward(
                x,
                acts,
                &self.layer(l, p, (wb, wq, wp), precision),
                b,
                t,
                attend,
            );
            if ws.keep_hidden {
                ws.hidden[l][..n * dm].copy_from_slice(x);
            }
        }
        if let Some(caches) = caches {
            caches.iter_mut().for_each(|c| c.len += t);
        }
        // 4. The final norm and lm_head, on every position or on each sequence's last one
        let (rows, xin): (usize, &[f32]) = if all_logits {
            (n, x)
        } else {
            let last = &mut ws.dx[..b * dm];
            for (bi, row) in last.chunks_mut(dm).enumerate() {
                row.copy_from_slice(&x[((bi + 1) * t - 1) * dm..(bi + 1) * t * dm]);
            }
            (b, last)
        };
        let mut clock = Clock::start();
        let lnf = &mut ws.lnf[..rows * dm];
        rmsnorm_forward(
            lnf,
            &mut ws.rstdf[..rows],
            xin,
            None,
            &w[self.layout.norm.range()],
            1.0,
            dm,
            self.dims.eps,
        );
        clock.lap(Phase::Norms);
        let head = self.layout.lm_head_span();
        matmul_forward(
            &mut ws.logits[..rows * v],
            lnf,
            F32Panels::attach(
                wp,
                QuantWeights::weight_of(wq, wb, w, head.range()),
                head.offset,
            ),
            rows,
            dm,
            v,
            false,
            precision,
        );
        clock.lap(Phase::LmHead);
        Ok(())
    }

    /// Mean cross-entropy of the last forward's logits against `targets` (B·T), over the
    /// targets that are not `IGNORE`.
    pub fn loss(&self, ws: &mut Workspace, targets: &[u32]) -> Result<f32> {
        let (b, t) = ws.cur;
        let n = b * t;
        let v = self.config.vocab_size;
        if targets.len() != n {
            return Err(Error::Invalid(format!(
                "{} targets for {n} positions",
                targets.len()
            )));
        }
        if let Some(&bad) = targets
            .iter()
            .find(|&&tok| tok != IGNORE && tok as usize >= v)
        {
            return Err(Error::Invalid(format!(
                "target id {bad} is outside the vocabulary ({v})"
            )));
        }
        ws.targets[..n].copy_from_slice(targets);
        cross_entropy_forward(
            &mut ws.losses[..n],
            &mut ws.ce_lse[..n],
            &ws.logits[..n * v],
            targets,
            v,
        );
        let kept = counted(targets);
        if kept == 0 {
            return Err(Error::Invalid(format!(
                "all {n} targets are ignored: nothing to learn from"
            )));
        }
        Ok(mean_loss(&ws.losses[..n], kept))
    }

    /// Accumulates the gradient of the mean loss of the last `forward` + `loss` into `grads`
    /// (the layout of `params`; the caller zeroes it).
    pub fn backward(&self, ws: &mut Workspace, grads: &mut [f32]) {
        assert_eq!(grads.len(), self.params.len());
        assert!(self.quant.is_none(), "backward through quantised weights");
        assert!(
            ws.logit_bits.is_none(),
            "backward after a low-bit (evaluation-only) forward pass"
        );
        assert!(
            ws.layers.len() == self.layout.layers.len(),
            "backward through a workspace for inference (Workspace::for_inference)"
        );
        let (b, t) = ws.cur;
        let (n, dm, v) = (b * t, self.config.hidden_size, self.config.vocab_size);
        let (w, precision) = (&self.params, ws.precision);
        let dlogits = &mut ws.dlogits[..n * v];
        cross_entropy_backward(
            dlogits,
            &ws.logits[..n * v],
            &ws.ce_lse[..n],
            &ws.targets[..n],
            v,
            1.0 / counted(&ws.targets[..n]) as f32,
        );
        let dlnf = &mut ws.dlnf[..n * dm];
        let lm = self.layout.lm_head_span();
        linear_backward(
            Grad::Set(dlnf),
            grads,
            w,
            lm,
            dlogits,
            &ws.lnf[..n * dm],
            n,
            dm,
            v,
            precision,
        );
        let dx = &mut ws.dx[..n * dm];
        let nr = self.layout.norm;
        rmsnorm_backward(
            Grad::Set(dx),
            &mut grads[nr.range()],
            dlnf,
            &ws.x[..n * dm],
            &w[nr.range()],
            1.0,
            &ws.rstdf[..n],
            dm,
        );
        for (l, (acts, p)) in ws.layers.iter().zip(&self.layout.layers).enumerate().rev() {
            block_backward(
                dx,
                grads,
                &mut ws.scratch,
                acts,
                &self.layer(l, p, (None, None, None), precision),
                b,
                t,
            );
        }
        embedding_backward(
            &mut grads[self.layout.embed_tokens.range()],
            dx,
            &ws.tokens[..n],
            dm,
        );
    }
}

impl Workspace {
    /// Buffers for up to `batch` sequences of up to `seq` tokens, training included: each
    /// block keeps its activations for the backward.
    pub fn new(model: &Model, batch: usize, seq: usize) -> Self {
        Self::with_blocks(model, batch, seq, model.config.num_hidden_layers)
    }

    /// Buffers for forwards alone (generation, scoring, serving): one block's activations,
    /// which each block overwrites in turn, so a prefill of 8,192 tokens does not hold (and
    /// first touch) every block's. `backward` refuses such a workspace.
    pub fn for_inference(model: &Model, batch: usize, seq: usize) -> Self {
        Self::with_blocks(model, batch, seq, 1)
    }

    /// `new` with `blocks` blocks' activations (every block's, or one that they share).
    fn with_blocks(model: &Model, batch: usize, seq: usize, blocks: usize) -> Self {
        let d = &model.dims;
        let c = &model.config;
        let widest = [
            c.vocab_size,
            c.hidden_size,
            c.intermediate_size,
            d.out,
            c.n_query_heads() * c.head_dim,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        // the forward's products that read one input: q, k, v (and λ) of ln1, gate and up of ln2
        let qkv = d.q_width() + d.k_width() + d.v_width();
        let shared = (qkv + d.h).max(2 * c.intermediate_size);
        let group = c.n_query_heads() / c.n_key_heads();
        let heads = (c.head_dim, c.value_head_dim(), group, seq);
        crate::kernels::prepare_threads(widest, shared, batch * seq, heads, model.precision);
        let n = batch * seq;
        let z = crate::kernels::zeroed;
        let [x, lnf, rstdf, logits, losses, ce_lse, dx, dlnf, dlogits] =
            Self::top_lens(c, n).map(z);
        Workspace {
            batch,
            seq,
            layers: (0..blocks)
                .map(|_| LayerActs::new(d, n, batch, seq))
                .collect(),
            x,
            hidden: Vec::new(),
            keep_hidden: false,
            logit_bits: None,
            lnf,
            rstdf,
            logits,
            losses,
            ce_lse,
            tokens: vec![0; n],
            targets: vec![0; n],
            positions: vec![0; batch],
            scratch: Scratch::new(d, n),
            dx,
            dlnf,
            dlogits,
            cur: (0, 0),
            bf16: None,
            panels: None,
            precision: model.precision,
            buffer_bytes: Self::bytes_with_blocks(c, batch, seq, blocks),
        }
    }

    /// The lengths of the f32 buffers outside the blocks, in the order x, lnf, rstdf, logits,
    /// losses, ce_lse, dx, dlnf, dlogits (saturating, as `LayerActs::lens`).
    fn top_lens(c: &ModelConfig, n: usize) -> [usize; 9] {
        let m = usize::saturating_mul;
        let (dm, v) = (m(n, c.hidden_size), m(n, c.vocab_size));
        [dm, dm, n, v, n, n, dm, dm, v]
    }

    /// Bytes of the buffers `Workspace::new(model, batch, seq)` allocates for a model of
    /// `config` (bf16 weight copies aside): the figure `difftx bench memory` reports and the
    /// memory checks refuse absurd sizes with, computable before allocating (saturating: an
    /// overflow reads as `usize::MAX`).
    pub fn bytes_for(config: &ModelConfig, batch: usize, seq: usize) -> usize {
        Self::bytes_with_blocks(config, batch, seq, config.num_hidden_layers)
    }

    /// `bytes_for` a workspace from `Workspace::for_inference`.
    pub fn bytes_for_inference(config: &ModelConfig, batch: usize, seq: usize) -> usize {
        Self::bytes_with_blocks(config, batch, seq, 1)
    }

    fn bytes_with_blocks(config: &ModelConfig, batch: usize, seq: usize, blocks: usize) -> usize {
        let sum = |l: &[usize]| l.iter().fold(0, |a: usize, &x| a.saturating_add(x));
        let d = Dims::new(config);
        let n = batch.saturating_mul(seq);
        let floats = sum(&LayerActs::lens(&d, n, batch, seq))
            .saturating_mul(blocks)
            .saturating_add(sum(&Scratch::lens(&d, n)))
            .saturating_add(sum(&Self::top_lens(config, n)));
        // f32 buffers and the two u32 token buffers
        floats.saturating_add(n.saturating_mul(2)).saturating_mul(4)
    }

    /// Keeps bf16 copies (round to nearest even) of `model`'s weights as they are now, which
    /// cached forwards (inference) then read: cached forwards of up to four tokens a sequence
    /// (decoding) read bf16 rows instead of the f32 weights, half the bytes, the bound of a
    /// batch-1 decode; longer ones (prefill) with bf16 products on (`--bf16`) multiply the
    /// weights' bf16 tiles, packed once here. Uncached forwards (training, evaluation) read the
    /// f32 weights. The copies do not follow later changes to `model.params`: take them again
    /// after training, or `drop_bf16_weights`.
    pub fn keep_bf16_weights(&mut self, model: &Model) {
        self.bf16 = Some(std::sync::Arc::new(super::bf16_weights::Bf16Weights::new(
            model,
        )));
    }

    /// Cached forwards read the f32 weights again.
    pub fn drop_bf16_weights(&mut self) {
        self.bf16 = None;
    }

    /// Keeps `model`'s f32 weights as they are now packed in panels, which cached forwards'
    /// products of two to 64 rows (and of one under `set_batch_invariant`) then read where they
    /// read f32 weights: a server's or a batch's decoding, at the cost of a second copy of the
    /// weights. Like `keep_bf16_weights`'s copies, they do not follow later changes to
    /// `model.params`.
    pub fn keep_f32_panels(&mut self, model: &Model) {
        self.panels = Some(std::sync::Arc::new(super::f32_panels::F32Panels::new(
            model,
        )));
    }

    /// Keeps the one copy of the weights that inference reads beside them: bf16 copies where
    /// `model` multiplies in bf16 (`keep_bf16_weights`), else f32 panels where `panels`
    /// (`keep_f32_panels`); the copy `Need::with_copies` counts.
    pub fn keep_weight_copies(&mut self, model: &Model, panels: bool) {
        if model.precision.is_bf16() {
            self.keep_bf16_weights(model);
        } else if panels {
            self.keep_f32_panels(model);
        }
    }

    /// Reads the copies that `other` keeps (`keep_weight_copies`), without copies of its own.
    pub fn share_weight_copies(&mut self, other: &Workspace) {
        (self.bf16, self.panels) = (other.bf16.clone(), other.panels.clone());
    }

    /// (B, T) of the last forward pass: the layout of `layers[l].q`, `k`, `v`, `lam` and `hidden`.
    pub fn last_forward(&self) -> (usize, usize) {
        self.cur
    }

    /// Keep every block's output after `forward` (in `hidden`).
    pub fn keep_hidden_states(&mut self, model: &Model) {
        let n = self.batch * self.seq * model.config.hidden_size;
        self.hidden = (0..model.config.num_hidden_layers)
            .map(|_| vec![0.0; n])
            .collect();
        self.keep_hidden = true;
    }

    /// Bytes of all buffers.
    pub fn bytes(&self) -> usize {
        self.buffer_bytes
            + self.bf16.as_ref().map_or(0, |b| b.bytes())
            + self.panels.as_ref().map_or(0, |p| p.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, Preset};

    /// A workspace for inference, whose blocks take turns with one block's activations, gives
    /// the logits of one that keeps every block's, bit for bit: a prefill, then a decoding
    /// step, through every kind of KV cache (Tiny has two blocks, so the second overwrites
    /// the first's).
    #[test]
    fn an_inference_workspace_gives_the_same_logits_as_a_full_one() {
        use crate::model::{KvCache, KvKind};
        for kind in AttentionKind::ALL {
            for kv in KvKind::ALL {
                let mut m = Model::init(ModelConfig::preset(Preset::Tiny, kind), 3).unwrap();
                m.kv_cache = kv;
                assert!(m.config.num_hidden_layers > 1);
                let prompt: Vec<u32> = (0..21).map(|i| (i * 37 % 251) as u32).collect();
                let run = |mut ws: Workspace| {
                    let mut cache = [KvCache::new(&m, 32)];
                    m.forward_cached(&mut ws, &mut cache, &prompt, prompt.len(), true)
                        .unwrap();
                    let mut out = ws.logits[..prompt.len() * m.config.vocab_size].to_vec();
                    m.forward_cached(&mut ws, &mut cache, &[7], 1, false)
                        .unwrap();
                    out.extend_from_slice(&ws.logits[..m.config.vocab_size]);
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                };
                let full = run(Workspace::new(&m, 1, prompt.len()));
                let shared = run(Workspace::for_inference(&m, 1, prompt.len()));
                assert!(full == shared, "{kind} {kv}: the logits differ");
                let (a, b) = (Workspace::new(&m, 1, 8), Workspace::for_inference(&m, 1, 8));
                assert!(
                    b.bytes() < a.bytes(),
                    "{kind}: {} vs {}",
                    b.bytes(),
                    a.bytes()
                );
            }
        }
    }

    #[test]
    fn init_sets_every_norm_weight_to_one_and_draws_the_rest() {
        for kind in AttentionKind::ALL {
            let m = Model::init(ModelConfig::preset(Preset::Tiny, kind), 1).unwrap();
            for spec in &m.layout.specs {
                let x = &m.params[spec.range()];
                let is_norm = spec.name.ends_with("layernorm.weight")
                    || spec.name == "model.norm.weight"
                    || spec.name.ends_with("subln.weight");
                if is_norm {
                    assert!(x.iter().all(|&v| v == 1.0), "{}", spec.name);
                } else {
                    let std = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
                    let want =
                        if spec.name.contains(".lambda_") && !spec.name.contains("lambda_proj") {
                            0.1
                        } else if spec.name.ends_with("o_proj.weight")
                            || spec.name.ends_with("down_proj.weight")
                        {
                            0.02 / 2.0 // 1/sqrt(2L) with L = 2
                        } else {
                            0.02
                        };
                    assert!(
                        (std / want - 1.0).abs() < 0.25,
                        "{}: std {std}, want {want}",
                        spec.name
                    );
                }
            }
        }
    }
}

//! One decoder block, forward and backward side by side:
//!
//! ```text
//! x_mid = x_in + Attn(input_layernorm(x_in))
//! x_out = x_mid + down(silu(gate ln2) · up ln2),   ln2 = post_attention_layernorm(x_mid)
//! ```

use super::attention::{self as attn, Lambda};
use super::bf16_weights::Bf16Weights;
use super::f32_panels::F32Panels;
use super::kv_cache::{KvCache, Rows, Store};
use super::phases::{Clock, Phase};
use super::quant_weights::QuantWeights;
use crate::config::params::{LayerParams, Span};
use crate::config::{lambda_init_at, AttentionKind, ModelConfig};
use crate::kernels::attention::{
    attention_backward, attention_delta, attention_forward, AttnShape,
};
use crate::kernels::attention_lowbit::quantized_attention_forward;
use crate::kernels::gemm::{matmul_backward, matmul_forward, matmul_forward_each, Weight};
use crate::kernels::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::kernels::rope::{rope_backward, rope_forward, RopeTable};
use crate::kernels::sigmoid;
use crate::kernels::swiglu::{swiglu_backward, swiglu_forward};
use crate::kernels::{attention_cached, Grad, KvElem, Precision};

/// Sizes shared by every block of one model.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub kind: AttentionKind,
    /// D
    pub c: usize,
    /// SwiGLU width F
    pub f: usize,
    /// H: heads for standard, differential heads otherwise
    pub h: usize,
    pub shape: AttnShape,
    /// width of the o_proj input
    pub out: usize,
    pub eps: f32,
    /// diff_v1: the config's constant λ_init, or `None` for the paper's schedule
    pub lambda_init: Option<f64>,
    /// diff_v1 with its per-head RMSNorm (false for the other kinds and for the ablation)
    pub subln: bool,
}

impl Dims {
    pub fn new(c: &ModelConfig) -> Self {
        Dims {
            kind: c.attention,
            c: c.hidden_size,
            f: c.intermediate_size,
            h: c.num_attention_heads,
            shape: attn::shape(c),
            out: c.attn_out_dim(),
            eps: c.rms_norm_eps as f32,
            lambda_init: c.lambda_init,
            subln: c.attention == AttentionKind::DiffV1 && c.subln,
        }
    }
    pub(super) fn q_width(&self) -> usize {
        self.shape.nq * self.shape.dk
    }
    pub(super) fn k_width(&self) -> usize {
        self.shape.nk * self.shape.dk
    }
    pub(super) fn v_width(&self) -> usize {
        self.shape.nv * self.shape.dv
    }
    fn o_width(&self) -> usize {
        self.shape.nq * self.shape.dv
    }
}

/// What one block keeps from its forward pass for the backward, sized for N = B·T tokens.
pub struct LayerActs {
    pub x_in: Vec<f32>,
    pub ln1: Vec<f32>,
    pub rstd1: Vec<f32>,
    /// after RoPE
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// the kernel's output, (N, NQ, DV): attn1 / attn2 interleaved by head for the diff kinds
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    /// diff_v2: σ(lambda_proj x), (N, H)
    pub lam: Vec<f32>,
    /// diff kinds: attn1 − λ·attn2, (N, H, DV)
    pub comb: Vec<f32>,
    /// diff_v1 with subln: (1 − λ_init) · subln(comb), and subln's rstd (N·H)
    pub y: Vec<f32>,
    pub sub_rstd: Vec<f32>,
    /// diff_v1: λ and its two exponentials, for the backward
    pub lambda_parts: (f32, f32, f32),
    pub x_mid: Vec<f32>,
    pub ln2: Vec<f32>,
    pub rstd2: Vec<f32>,
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    pub hid: Vec<f32>,
}

impl LayerActs {
    /// The lengths of its buffers in the order of its fields, for N = B·T tokens; saturating,
    /// so that absurd sizes can be counted (and refused) before anything is allocated.
    pub fn lens(d: &Dims, n: usize, b: usize, t: usize) -> [usize; 18] {
        let m = usize::saturating_mul;
        let diff = d.kind.is_diff();
        let lam = if d.kind == AttentionKind::DiffV2 {
            d.h
        } else {
            0
        };
        let (comb, y) = (
            if diff { d.out } else { 0 },
            if d.subln { d.out } else { 0 },
        );
        let sub = if d.subln { d.h } else { 0 };
        [
            m(n, d.c),
            m(n, d.c),
            n,
            m(n, d.q_width()),
            m(n, d.k_width()),
            m(n, d.v_width()),
            m(n, d.o_width()),
            m(m(b, d.shape.nq), t),
            m(n, lam),
            m(n, comb),
            m(n, y),
            m(n, sub),
            m(n, d.c),
            m(n, d.c),
            n,
            m(n, d.f),
            m(n, d.f),
            m(n, d.f),
        ]
    }

    pub fn new(d: &Dims, n: usize, b: usize, t: usize) -> Self {
        let [x_in, ln1, rstd1, q, k, v, o, lse, lam, comb, y, sub_rstd, x_mid, ln2, rstd2, gate, up, hid] =
            Self::lens(d, n, b, t).map(crate::kernels::zeroed);
        LayerActs {
            x_in,
            ln1,
            rstd1,
            q,
            k,
            v,
            o,
            lse,
            lam,
            comb,
            y,
            sub_rstd,
            lambda_parts: (0.0, 0.0, 0.0),
            x_mid,
            ln2,
            rstd2,
            gate,
            up,
            hid,
        }
    }

    /// The o_proj input for n tokens.
    fn attn_out(&self, n: usize, d: &Dims) -> &[f32] {
        let len = n * d.out;
        match d.kind {
            AttentionKind::Standard => &self.o[..len],
            AttentionKind::DiffV1 if d.subln => &self.y[..len],
            AttentionKind::DiffV1 | AttentionKind::DiffV2 => &self.comb[..len],
        }
    }
}

/// Gradient scratch shared by all blocks (the backward visits one block at a time).
pub struct Scratch {
    pub dln: Vec<f32>,
    pub dattn: Vec<f32>,
    pub dcomb: Vec<f32>,
    pub dlam: Vec<f32>,
    /// rowsum(dO ∘ O) per token and query head (`attention_delta`)
    pub delta: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub dhid: Vec<f32>,
    pub dgate: Vec<f32>,
    pub dup: Vec<f32>,
}

impl Scratch {
    /// The lengths of its buffers in the order of its fields (saturating, as `LayerActs::lens`).
    pub fn lens(d: &Dims, n: usize) -> [usize; 11] {
        let m = usize::saturating_mul;
        [
            m(n, d.c),
            m(n, d.out),
            m(n, d.out),
            m(n, d.h),
            m(n, d.shape.nq),
            m(n, d.q_width()),
            m(n, d.k_width()),
            m(n, d.v_width()),
            m(n, d.f),
            m(n, d.f),
            m(n, d.f),
        ]
    }

    pub fn new(d: &Dims, n: usize) -> Self {
        let [dln, dattn, dcomb, dlam, delta, dq, dk, dv, dhid, dgate, dup] =
            Self::lens(d, n).map(crate::kernels::zeroed);
        Scratch {
            dln,
            dattn,
            dcomb,
            dlam,
            delta,
            dq,
            dk,
            dv,
            dhid,
            dgate,
            dup,
        }
    }
}

/// One block as the stack hands it to the forward and backward: the flat parameters (with
/// their quantised blocks or bf16 copies where inference keeps them), the block's table of spans, the sizes shared
/// by every block, its index (λ_init depends on it), the RoPE table and the precision.
pub struct Layer<'a> {
    pub w: &'a [f32],
    pub wb: Option<&'a Bf16Weights>,
    /// f32 weights in panels, where inference keeps them
    pub wp: Option<&'a F32Panels>,
    /// the linear layers in Q8_0/Q4_0 blocks, where the model holds them (inference)
    pub wq: Option<&'a QuantWeights>,
    pub p: &'a LayerParams,
    pub d: &'a Dims,
    pub index: usize,
    pub rope: &'a RopeTable,
    pub precision: Precision,
}

/// How a block's attention runs.
pub enum Attend<'c> {
    /// each sequence is the whole context (training, evaluation)
    Full,
    /// one cache per sequence: the T new tokens of sequence b sit at positions `pos0[b]..` and
    /// attend to everything cached before them
    Cached(&'c mut [KvCache], &'c [usize]),
    /// evaluation only, no cache: logits absmax-quantised to this many bits (paper §3.7)
    LowBit(u32),
}

/// x: (B, T, D) in place: the block's input on entry, its output on return.
pub fn block_forward(
    x: &mut [f32],
    a: &mut LayerActs,
    l: &Layer,
    b: usize,
    t: usize,
    attend: Attend,
) {
    let (n, c, d) = (b * t, l.d.c, l.d);
    let mut clock = Clock::start();
    // 1. input_layernorm: ln1 = RMSNorm(x), the block's input kept in x_in
    let (ln1, rstd1) = (&mut a.ln1[..n * c], &mut a.rstd1[..n]);
    let x_in = Some(&mut a.x_in[..n * c]);
    rmsnorm_forward(
        ln1,
        rstd1,
        x,
        x_in,
        l.param(l.p.input_layernorm),
        1.0,
        c,
        d.eps,
    );
    clock.lap(Phase::Norms);
    // 2. q, k, v projections of ln1 (and diff_v2's λ logits): one product, one packed input
    l.qkv_forward(a, n);
    clock.lap(Phase::Qkv);
    // 3. RoPE on q and k, then causal attention
    l.attention_forward(a, b, t, attend);
    // 4. the maps combined: diff_v1 attn1 − λ·attn2 then subln; diff_v2 with λ = σ(z) per token
    l.combine_forward(a, n);
    clock.lap(Phase::Attention);
    // 5. o_proj, added to the residual stream: x_mid = x_in + o_proj(attn_out)
    let o_proj = l.weight(l.p.o_proj);
    matmul_forward(x, a.attn_out(n, d), o_proj, n, d.out, c, true, l.precision);
    clock.lap(Phase::OProj);
    // 6. post_attention_layernorm: ln2 = RMSNorm(x_mid), x_mid kept
    let (ln2, rstd2) = (&mut a.ln2[..n * c], &mut a.rstd2[..n]);
    let x_mid = Some(&mut a.x_mid[..n * c]);
    let pal = l.param(l.p.post_attention_layernorm);
    rmsnorm_forward(ln2, rstd2, x, x_mid, pal, 1.0, c, d.eps);
    clock.lap(Phase::Norms);
    // 7. MLP: x_out = x_mid + down(swiglu(gate ln2, up ln2))
    l.mlp_forward(x, a, n);
    clock.lap(Phase::Mlp);
}

/// dx: (B, T, D) in place: the gradient w.r.t. the block's output on entry, w.r.t. its input on
/// return. Parameter gradients accumulate into `g` (same layout as `w`); `l.wb` is not read.
pub fn block_backward(
    dx: &mut [f32],
    g: &mut [f32],
    sc: &mut Scratch,
    a: &LayerActs,
    l: &Layer,
    b: usize,
    t: usize,
) {
    let (n, c, d) = (b * t, l.d.c, l.d);
    // 7. MLP backward, into dln; in the forward pass this was x_out = x_mid + down(swiglu)
    l.mlp_backward(dx, g, sc, a, n);
    // 6. post_attention_layernorm backward, added to dx; this was ln2 = RMSNorm(x_mid)
    let (pal, dln) = (l.p.post_attention_layernorm, &sc.dln[..n * c]);
    let (x_mid, rstd2) = (&a.x_mid[..n * c], &a.rstd2[..n]);
    let g_pal = &mut g[pal.range()];
    rmsnorm_backward(
        Grad::Add(dx),
        g_pal,
        dln,
        x_mid,
        l.param(pal),
        1.0,
        rstd2,
        c,
    );
    // 5. o_proj backward; this was x_mid = x_in + o_proj(attn_out)
    let dattn = Grad::Set(&mut sc.dattn[..n * d.out]);
    l.linear_backward(dattn, g, l.p.o_proj, dx, a.attn_out(n, d), n, d.out, c);
    // 4. the combination's backward: the attention's dO and, for diff pairs, λ's gradient
    let combined = l.combine_backward(g, sc, a, n);
    // 3. attention backward, then RoPE's (a rotation's transpose) on dq and dk
    l.attention_backward(sc, a, b, t, combined);
    // 2. q, k, v projections backward, into dln
    l.qkv_backward(g, sc, a, n);
    // 1. input_layernorm backward, added to dx; this was ln1 = RMSNorm(x)
    let (il, dln) = (l.p.input_layernorm, &sc.dln[..n * c]);
    let (x_in, rstd1) = (&a.x_in[..n * c], &a.rstd1[..n]);
    rmsnorm_backward(
        Grad::Add(dx),
        &mut g[il.range()],
        dln,
        x_in,
        l.param(il),
        1.0,
        rstd1,
        c,
    );
}

/// Where the attention backward takes its dO from, and how a diff pair's maps were combined
/// (`Layer::combine_backward`'s answer).
struct Combined<'a> {
    /// dO is the subln backward's output (sc.dcomb), else the o_proj input's gradient
    /// (sc.dattn)
    from_dcomb: bool,
    pairs: Option<Lambda<'a>>,
}

impl Layer<'_> {
    /// The parameter at `r`.
    fn param(&self, r: Span) -> &[f32] {
        &self.w[r.range()]
    }

    /// A linear layer's weight, with its blocks or bf16 copies where inference keeps them.
    fn weight(&self, r: Span) -> Weight<'_> {
        let w = QuantWeights::weight_of(self.wq, self.wb, self.w, r.range());
        F32Panels::attach(self.wp, w, r.offset)
    }

    /// Forward phase 2: q, k, v (and diff_v2's λ logits) from ln1, in one product.
    fn qkv_forward(&self, a: &mut LayerActs, n: usize) {
        let (d, p) = (self.d, self.p);
        let lambda = p.lambda_proj.map(|r| self.weight(r));
        let mut parts = [
            (
                &mut a.q[..n * d.q_width()],
                self.weight(p.q_proj),
                d.q_width(),
            ),
            (
                &mut a.k[..n * d.k_width()],
                self.weight(p.k_proj),
                d.k_width(),
            ),
            (
                &mut a.v[..n * d.v_width()],
                self.weight(p.v_proj),
                d.v_width(),
            ),
            (&mut a.lam[..], lambda.unwrap_or((&[][..]).into()), d.h),
        ];
        let count = if lambda.is_some() { 4 } else { 3 };
        let ln1 = &a.ln1[..n * d.c];
        matmul_forward_each(&mut parts[..count], ln1, n, d.c, self.precision);
    }

    /// Forward phase 3: RoPE on q and k, then causal attention into o and lse (training, a
    /// cached decode, or low-bit evaluation).
    fn attention_forward(&self, a: &mut LayerActs, b: usize, t: usize, attend: Attend) {
        let (n, d, s) = (b * t, self.d, &self.d.shape);
        let (q, k, v) = (
            &mut a.q[..n * d.q_width()],
            &mut a.k[..n * d.k_width()],
            &a.v[..n * d.v_width()],
        );
        let (o, lse) = (&mut a.o[..n * d.o_width()], &mut a.lse[..b * s.nq * t]);
        let pos0: &[usize] = match &attend {
            Attend::Cached(_, pos0) => pos0,
            Attend::Full | Attend::LowBit(_) => &[0],
        };
        rope_forward(q, self.rope, t, s.nq, pos0);
        rope_forward(k, self.rope, t, s.nk, pos0);
        match attend {
            Attend::Full => attention_forward(o, lse, q, k, v, b, t, t, 0, s, self.precision),
            Attend::LowBit(bits) => quantized_attention_forward(o, q, k, v, b, t, s, bits),
            Attend::Cached(caches, pos0) => {
                self.cached_attention(o, lse, (q, k, v), t, caches, pos0)
            }
        }
    }

    /// Each sequence's new rows of k and v appended to its cache at pos0[b] (rounded to the
    /// cache's element type), and its queries attending to everything the cache holds.
    fn cached_attention(
        &self,
        o: &mut [f32],
        lse: &mut [f32],
        qkv: (&[f32], &[f32], &[f32]),
        t: usize,
        caches: &mut [KvCache],
        pos0: &[usize],
    ) {
        use rayon::prelude::*;
        let (d, s) = (self.d, &self.d.shape);
        let (qw, ow) = (d.q_width(), d.o_width());
        // (sequence, ((its cache, its o), its lse))
        type Seq<'a> = (usize, ((&'a mut KvCache, &'a mut [f32]), &'a mut [f32]));
        let one = |(bi, ((cache, o), lse)): Seq| {
            let q = &qkv.0[bi * t * qw..(bi + 1) * t * qw];
            match &mut cache.store {
                Store::F32(rows) => self.attend_rows(o, lse, q, qkv, rows, bi, t, pos0[bi]),
                Store::Bf16(rows) => self.attend_rows(o, lse, q, qkv, rows, bi, t, pos0[bi]),
                Store::Q8(rows) => self.attend_rows(o, lse, q, qkv, rows, bi, t, pos0[bi]),
            }
        };
        let b = caches.len();
        let (o, lse) = (&mut o[..b * t * ow], &mut lse[..b * s.nq * t]);
        // the sequences in one parallel region (a batch's decoding step: not one region per
        // sequence); a sequence's numbers do not depend on it, its chunks are its own
        caches
            .par_iter_mut()
            .zip(o.par_chunks_mut(t * ow))
            .zip(lse.par_chunks_mut(s.nq * t))
            .enumerate()
            .for_each(one);
    }

    /// `cached_attention` for sequence bi, whose cache holds `rows`: its t new keys and values
    /// written at `at`, then its queries q over rows 0..at + t.
    // one sequence's slices of o, lse, q, the new (q, k, v), its cache and where it stands
    #[allow(clippy::too_many_arguments)]
    fn attend_rows<C: KvElem>(
        &self,
        o: &mut [f32],
        lse: &mut [f32],
        q: &[f32],
        (_, k, v): (&[f32], &[f32], &[f32]),
        rows: &mut Rows<C>,
        bi: usize,
        t: usize,
        at: usize,
    ) {
        let (d, layer) = (self.d, self.index);
        let (kw, vw) = (d.k_width(), d.v_width());
        let (kc, vc) = (&mut rows.k[layer], &mut rows.v[layer]);
        // a row of w values is C::entries(w) entries of the cache
        let new = |w: usize| at * C::entries(w)..(at + t) * C::entries(w);
        C::store(&mut kc[new(kw)], &k[bi * t * kw..(bi + 1) * t * kw], kw);
        C::store(&mut vc[new(vw)], &v[bi * t * vw..(bi + 1) * t * vw], vw);
        attention_cached(o, lse, q, kc, vc, t, at, &d.shape, self.precision);
    }

    /// Forward phase 4: the diff kinds' maps combined into comb (and diff_v1's subln into y);
    /// nothing for standard attention.
    fn combine_forward(&self, a: &mut LayerActs, n: usize) {
        let (d, s) = (self.d, &self.d.shape);
        let o = &a.o[..n * d.o_width()];
        match d.kind {
            AttentionKind::Standard => {}
            AttentionKind::DiffV1 => {
                let comb = &mut a.comb[..n * d.out];
                let lambda_init = lambda_init_at(d.lambda_init, self.index);
                a.lambda_parts = attn::lambda_full(self.lambdas(), lambda_init);
                attn::diff_combine_forward(comb, o, Lambda::Layer(a.lambda_parts.0), d.h, s.dv);
                // subln: RMSNorm over each head's 2d outputs, with the fixed (1 − λ_init) scale
                // as its gain. Ablated (d.subln false), both go: the paper ties the scale to
                // the norm.
                if d.subln {
                    let (y, sub_rstd) = (&mut a.y[..n * d.out], &mut a.sub_rstd[..n * d.h]);
                    let subln = self.param(self.p.subln.expect("diff_v1 layer has subln"));
                    let gain = 1.0 - lambda_init;
                    rmsnorm_forward(y, sub_rstd, comb, None, subln, gain, s.dv, d.eps);
                }
            }
            AttentionKind::DiffV2 => {
                let lam = &mut a.lam[..n * d.h];
                lam.iter_mut().for_each(|z| *z = sigmoid(*z));
                let comb = &mut a.comb[..n * d.out];
                attn::diff_combine_forward(comb, o, Lambda::PerToken(lam), d.h, s.dv);
            }
        }
    }

    /// Forward phase 7: gate and up of ln2, SwiGLU, down added to the residual stream.
    fn mlp_forward(&self, x: &mut [f32], a: &mut LayerActs, n: usize) {
        let (d, p, f) = (self.d, self.p, self.d.f);
        let (gate, up, hid) = (
            &mut a.gate[..n * f],
            &mut a.up[..n * f],
            &mut a.hid[..n * f],
        );
        let ln2 = &a.ln2[..n * d.c];
        matmul_forward_each(
            &mut [
                (&mut *gate, self.weight(p.gate_proj), f),
                (&mut *up, self.weight(p.up_proj), f),
            ],
            ln2,
            n,
            d.c,
            self.precision,
        );
        swiglu_forward(hid, gate, up);
        let down = self.weight(p.down_proj);
        matmul_forward(x, hid, down, n, f, d.c, true, self.precision);
    }

    /// Backward phase 7, mirroring `mlp_forward`: dhid from dx through down, SwiGLU's
    /// backward, then dln from dgate and dup through gate and up.
    fn mlp_backward(&self, dx: &[f32], g: &mut [f32], sc: &mut Scratch, a: &LayerActs, n: usize) {
        let (p, c, f) = (self.p, self.d.c, self.d.f);
        let dhid = &mut sc.dhid[..n * f];
        self.linear_backward(
            Grad::Set(dhid),
            g,
            p.down_proj,
            dx,
            &a.hid[..n * f],
            n,
            f,
            c,
        );
        let (dgate, dup) = (&mut sc.dgate[..n * f], &mut sc.dup[..n * f]);
        swiglu_backward(
            dgate,
            dup,
            &sc.dhid[..n * f],
            &a.gate[..n * f],
            &a.up[..n * f],
        );
        let (dln, ln2) = (&mut sc.dln[..n * c], &a.ln2[..n * c]);
        self.linear_backward(Grad::Set(dln), g, p.gate_proj, dgate, ln2, n, c, f);
        self.linear_backward(Grad::Add(dln), g, p.up_proj, dup, ln2, n, c, f);
    }

    /// Backward phase 4, mirroring `combine_forward`: the attention's delta and, for the diff
    /// kinds, the gradient through subln, the combine and λ (diff_v2's λ projection makes the
    /// first contribution to dln).
    fn combine_backward<'a>(
        &self,
        g: &mut [f32],
        sc: &mut Scratch,
        a: &'a LayerActs,
        n: usize,
    ) -> Combined<'a> {
        let (d, s, p) = (self.d, &self.d.shape, self.p);
        let (o, dattn) = (&a.o[..n * d.o_width()], &sc.dattn[..n * d.out]);
        let delta = &mut sc.delta[..n * s.nq];
        let dlam = &mut sc.dlam[..n * d.h];
        match d.kind {
            AttentionKind::Standard => {
                attention_delta(delta, dattn, o, s.nq, s.dv);
                Combined {
                    from_dcomb: false,
                    pairs: None,
                }
            }
            AttentionKind::DiffV1 => {
                // in the forward pass this was `y = (1 − λ_init) · subln(comb)`
                if d.subln {
                    let lambda_init = lambda_init_at(d.lambda_init, self.index);
                    let sub = p.subln.expect("diff_v1 layer has subln");
                    let (dcomb, comb) = (&mut sc.dcomb[..n * d.out], &a.comb[..n * d.out]);
                    let (gain, rstd) = (1.0 - lambda_init, &a.sub_rstd[..n * d.h]);
                    let g_sub = &mut g[sub.range()];
                    rmsnorm_backward(
                        Grad::Set(dcomb),
                        g_sub,
                        dattn,
                        comb,
                        self.param(sub),
                        gain,
                        rstd,
                        s.dv,
                    );
                }
                // without subln the o_proj input was comb itself
                let dcomb = if d.subln {
                    &sc.dcomb[..n * d.out]
                } else {
                    dattn
                };
                let (lambda, e1, e2) = a.lambda_parts;
                let lambda = Lambda::Layer(lambda);
                attn::diff_combine_backward(dlam, delta, dcomb, o, lambda, d.h, s.dv);
                let dlambda = dlam.iter().map(|&v| v as f64).sum::<f64>() as f32;
                let ls = p.lambdas.as_ref().expect("diff_v1 layer has lambdas");
                let [g0, g1, g2, g3] = split4(g, ls);
                attn::lambda_full_backward([g0, g1, g2, g3], self.lambdas(), e1, e2, dlambda);
                Combined {
                    from_dcomb: d.subln,
                    pairs: Some(lambda),
                }
            }
            AttentionKind::DiffV2 => {
                let lam = &a.lam[..n * d.h];
                let lambda = Lambda::PerToken(lam);
                attn::diff_combine_backward(dlam, delta, dattn, o, lambda, d.h, s.dv);
                // in the forward pass this was `lam = σ(z)`, so dz = dlam · σ · (1 − σ)
                dlam.iter_mut()
                    .zip(lam)
                    .for_each(|(dl, &l)| *dl *= l * (1.0 - l));
                let lp = p.lambda_proj.expect("diff_v2 layer has lambda_proj");
                let (dln, ln1) = (Grad::Set(&mut sc.dln[..n * d.c]), &a.ln1[..n * d.c]);
                self.linear_backward(dln, g, lp, dlam, ln1, n, d.c, d.h);
                Combined {
                    from_dcomb: false,
                    pairs: Some(lambda),
                }
            }
        }
    }

    /// Backward phase 3, mirroring `attention_forward`: dq, dk, dv from dO, then RoPE's
    /// backward on dq and dk.
    fn attention_backward(
        &self,
        sc: &mut Scratch,
        a: &LayerActs,
        b: usize,
        t: usize,
        combined: Combined,
    ) {
        let (n, d, s) = (b * t, self.d, &self.d.shape);
        let (dq, dk, dv) = (
            &mut sc.dq[..n * d.q_width()],
            &mut sc.dk[..n * d.k_width()],
            &mut sc.dv[..n * d.v_width()],
        );
        let (q, k, v) = (
            &a.q[..n * d.q_width()],
            &a.k[..n * d.k_width()],
            &a.v[..n * d.v_width()],
        );
        let d_o = match combined.from_dcomb {
            true => &sc.dcomb[..n * d.out],
            false => &sc.dattn[..n * d.out],
        };
        let (delta, lse) = (&sc.delta[..n * s.nq], &a.lse[..b * s.nq * t]);
        let pairs = combined.pairs;
        attention_backward(
            dq,
            dk,
            dv,
            d_o,
            q,
            k,
            v,
            delta,
            lse,
            b,
            t,
            s,
            pairs,
            self.precision,
        );
        rope_backward(dq, self.rope, t, s.nq, &[0]);
        rope_backward(dk, self.rope, t, s.nk, &[0]);
    }

    /// Backward phase 2, mirroring `qkv_forward`: dln from dq, dk and dv (added to diff_v2's
    /// λ contribution), and the projections' weight gradients.
    fn qkv_backward(&self, g: &mut [f32], sc: &mut Scratch, a: &LayerActs, n: usize) {
        let (d, p, c) = (self.d, self.p, self.d.c);
        let (dln, ln1) = (&mut sc.dln[..n * c], &a.ln1[..n * c]);
        let dln_q = match d.kind {
            AttentionKind::DiffV2 => Grad::Add(&mut *dln),
            _ => Grad::Set(&mut *dln),
        };
        let dq = &sc.dq[..n * d.q_width()];
        self.linear_backward(dln_q, g, p.q_proj, dq, ln1, n, c, d.q_width());
        let dk = &sc.dk[..n * d.k_width()];
        self.linear_backward(Grad::Add(dln), g, p.k_proj, dk, ln1, n, c, d.k_width());
        let dv = &sc.dv[..n * d.v_width()];
        self.linear_backward(Grad::Add(dln), g, p.v_proj, dv, ln1, n, c, d.v_width());
    }

    /// The backward of the linear layer whose weight (oc, c) lies at `r` of w: dinp (n, c) =
    /// (or +=) dout · W, and its gradient at `r` of g accumulates doutᵀ · inp.
    // matmul_backward's llm.c signature, with the weight's span in the flat buffers
    #[allow(clippy::too_many_arguments)]
    fn linear_backward(
        &self,
        dinp: Grad,
        g: &mut [f32],
        r: Span,
        dout: &[f32],
        inp: &[f32],
        n: usize,
        c: usize,
        oc: usize,
    ) {
        linear_backward(dinp, g, self.w, r, dout, inp, n, c, oc, self.precision);
    }

    /// diff_v1's four λ vectors (λq1, λk1, λq2, λk2).
    fn lambdas(&self) -> [&[f32]; 4] {
        let ls = self.p.lambdas.as_ref().expect("diff_v1 layer has lambdas");
        [0, 1, 2, 3].map(|i| self.param(ls[i]))
    }
}

/// The backward of the linear layer whose weight (oc, c) lies at `r` of w: dinp (n, c) = (or
/// +=) dout · W, and its gradient at `r` of g accumulates doutᵀ · inp.
// matmul_backward's llm.c signature, with the weight's span in the flat buffers
#[allow(clippy::too_many_arguments)]
pub(super) fn linear_backward(
    dinp: Grad,
    g: &mut [f32],
    w: &[f32],
    r: Span,
    dout: &[f32],
    inp: &[f32],
    n: usize,
    c: usize,
    oc: usize,
    precision: Precision,
) {
    matmul_backward(
        dinp,
        &mut g[r.range()],
        dout,
        inp,
        &w[r.range()],
        n,
        c,
        oc,
        precision,
    );
}

/// Four disjoint mutable gradient slices for the four λ vectors (laid out one after another).
fn split4<'g>(g: &'g mut [f32], ls: &[Span; 4]) -> [&'g mut [f32]; 4] {
    let len = ls[0].len;
    debug_assert!((1..4).all(|i| ls[i].offset == ls[i - 1].end() && ls[i].len == len));
    let mut it = g[ls[0].offset..ls[3].end()].chunks_mut(len);
    std::array::from_fn(|_| it.next().expect("four lambda vectors"))
}

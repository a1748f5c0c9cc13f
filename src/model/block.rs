//! One decoder block, forward and backward side by side:
//!
//! ```text
//! x_mid = x_in + Attn(input_layernorm(x_in))
//! x_out = x_mid + down(silu(gate ln2) · up ln2),   ln2 = post_attention_layernorm(x_mid)
//! ```

use super::attention::{self as attn, Lambda};
use super::bf16_weights::Bf16Weights;
use super::kv_cache::KvCache;
use super::quant_weights::QuantWeights;
use crate::config::params::{LayerParams, Span};
use crate::config::{lambda_init_at, AttentionKind, ModelConfig};
use crate::kernels::attention::{
    attention_backward, attention_delta, attention_forward, AttnShape,
};
use crate::kernels::gemm::{matmul_backward, matmul_forward, matmul_forward_each};
use crate::kernels::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::kernels::rope::{rope_backward, rope_forward, RopeTable};
use crate::kernels::sigmoid;
use crate::kernels::swiglu::{swiglu_backward, swiglu_forward};
use crate::kernels::{Grad, Precision};

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
    pub fn new(d: &Dims, n: usize, b: usize, t: usize) -> Self {
        let z = crate::kernels::zeroed;
        let diff = d.kind.is_diff();
        LayerActs {
            x_in: z(n * d.c),
            ln1: z(n * d.c),
            rstd1: z(n),
            q: z(n * d.q_width()),
            k: z(n * d.k_width()),
            v: z(n * d.v_width()),
            o: z(n * d.o_width()),
            lse: z(b * d.shape.nq * t),
            lam: z(if d.kind == AttentionKind::DiffV2 {
                n * d.h
            } else {
                0
            }),
            comb: z(if diff { n * d.out } else { 0 }),
            y: z(if d.subln { n * d.out } else { 0 }),
            sub_rstd: z(if d.subln { n * d.h } else { 0 }),
            lambda_parts: (0.0, 0.0, 0.0),
            x_mid: z(n * d.c),
            ln2: z(n * d.c),
            rstd2: z(n),
            gate: z(n * d.f),
            up: z(n * d.f),
            hid: z(n * d.f),
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
    pub fn new(d: &Dims, n: usize) -> Self {
        let z = crate::kernels::zeroed;
        Scratch {
            dln: z(n * d.c),
            dattn: z(n * d.out),
            dcomb: z(n * d.out),
            dlam: z(n * d.h),
            delta: z(n * d.shape.nq),
            dq: z(n * d.q_width()),
            dk: z(n * d.k_width()),
            dv: z(n * d.v_width()),
            dhid: z(n * d.f),
            dgate: z(n * d.f),
            dup: z(n * d.f),
        }
    }
}

/// x: (B, T, D) in place: the block's input on entry, its output on return. Without a cache
/// each sequence is the whole context (training); with one cache per sequence the T new tokens
/// of sequence b sit at positions caches[b].len.. and attend to everything cached before them.
/// `logit_bits` (evaluation only, no cache) swaps the kernel for eval/lowbit.rs's attention
/// with absmax-quantised logits.
// one layer's activations, weights, position, cache and precision, as the stack hands them
#[allow(clippy::too_many_arguments)]
pub fn block_forward(
    x: &mut [f32],
    a: &mut LayerActs,
    (w, wb, wq): (&[f32], Option<&Bf16Weights>, Option<&QuantWeights>),
    p: &LayerParams,
    d: &Dims,
    layer: usize,
    rope: &RopeTable,
    b: usize,
    t: usize,
    cache: Option<(&mut [KvCache], &[usize])>,
    logit_bits: Option<u32>,
    precision: Precision,
) {
    let n = b * t;
    let c = d.c;
    let s = &d.shape;
    // A linear layer's weight, with its blocks or bf16 copies where inference keeps them.
    let weight = |r: Span| QuantWeights::weight_of(wq, wb, w, r.range());
    // 1. input_layernorm: ln1 = RMSNorm(x), the block's input kept in x_in
    rmsnorm_forward(
        &mut a.ln1[..n * c],
        &mut a.rstd1[..n],
        x,
        Some(&mut a.x_in[..n * c]),
        &w[p.input_layernorm.range()],
        1.0,
        c,
        d.eps,
    );
    let ln1 = &a.ln1[..n * c];
    // 2. q, k, v projections of ln1 (diff_v2's λ logits too): one product, one packed input
    let (q, k, v) = (
        &mut a.q[..n * d.q_width()],
        &mut a.k[..n * d.k_width()],
        &mut a.v[..n * d.v_width()],
    );
    // diff_v2's λ projection reads ln1 too: it joins the q, k and v products.
    let lambda = p.lambda_proj.map(&weight);
    let mut parts = [
        (&mut *q, weight(p.q_proj), d.q_width()),
        (&mut *k, weight(p.k_proj), d.k_width()),
        (&mut *v, weight(p.v_proj), d.v_width()),
        (&mut a.lam[..], lambda.unwrap_or((&[][..]).into()), d.h),
    ];
    let count = if lambda.is_some() { 4 } else { 3 };
    matmul_forward_each(&mut parts[..count], ln1, n, c, precision);
    // 3. RoPE on q and k, then causal attention (training; cached decoding; low-bit eval)
    let o = &mut a.o[..n * d.o_width()];
    let lse = &mut a.lse[..b * s.nq * t];
    match cache {
        None => {
            rope_forward(q, rope, t, s.nq, &[0]);
            rope_forward(k, rope, t, s.nk, &[0]);
            match logit_bits {
                None => attention_forward(o, lse, q, k, v, b, t, t, 0, s, precision),
                Some(bits) => crate::kernels::attention_lowbit::quantized_attention_forward(
                    o, q, k, v, b, t, s, bits,
                ),
            }
        }
        Some((caches, pos0)) => {
            rope_forward(q, rope, t, s.nq, pos0);
            rope_forward(k, rope, t, s.nk, pos0);
            let (kw, vw, qw, ow) = (d.k_width(), d.v_width(), d.q_width(), d.o_width());
            for (bi, cache) in caches.iter_mut().enumerate() {
                let at = pos0[bi];
                cache.k[layer][at * kw..(at + t) * kw]
                    .copy_from_slice(&k[bi * t * kw..(bi + 1) * t * kw]);
                cache.v[layer][at * vw..(at + t) * vw]
                    .copy_from_slice(&v[bi * t * vw..(bi + 1) * t * vw]);
                attention_forward(
                    &mut o[bi * t * ow..(bi + 1) * t * ow],
                    &mut lse[bi * s.nq * t..(bi + 1) * s.nq * t],
                    &q[bi * t * qw..(bi + 1) * t * qw],
                    &cache.k[layer][..(at + t) * kw],
                    &cache.v[layer][..(at + t) * vw],
                    1,
                    t,
                    at + t,
                    at,
                    s,
                    precision,
                );
            }
        }
    }
    // 4. the maps combined: diff_v1 attn1 − λ·attn2 then subln; diff_v2 with λ = σ(z) per token
    match d.kind {
        AttentionKind::Standard => {}
        AttentionKind::DiffV1 => {
            let lambda_init = lambda_init_at(d.lambda_init, layer);
            let ls = p.lambdas.as_ref().expect("diff_v1 layer has lambdas");
            let lambdas = [0, 1, 2, 3].map(|i| &w[ls[i].range()]);
            a.lambda_parts = attn::lambda_full(lambdas, lambda_init);
            let comb = &mut a.comb[..n * d.out];
            attn::diff_combine_forward(comb, o, Lambda::Layer(a.lambda_parts.0), d.h, s.dv);
            // subln: RMSNorm over each head's 2d outputs, with the fixed (1 − λ_init) scale
            // as its gain. Ablated (d.subln false), both go: the paper ties the scale to the norm.
            if d.subln {
                let y = &mut a.y[..n * d.out];
                let subln = &w[p.subln.expect("diff_v1 layer has subln").range()];
                let sub_rstd = &mut a.sub_rstd[..n * d.h];
                rmsnorm_forward(
                    y,
                    sub_rstd,
                    comb,
                    None,
                    subln,
                    1.0 - lambda_init,
                    s.dv,
                    d.eps,
                );
            }
        }
        AttentionKind::DiffV2 => {
            let lam = &mut a.lam[..n * d.h];
            lam.iter_mut().for_each(|z| *z = sigmoid(*z));
            attn::diff_combine_forward(
                &mut a.comb[..n * d.out],
                o,
                Lambda::PerToken(lam),
                d.h,
                s.dv,
            );
        }
    }
    // 5. o_proj, added to the residual stream
    matmul_forward(
        x,
        a.attn_out(n, d),
        weight(p.o_proj),
        n,
        d.out,
        c,
        true,
        precision,
    );
    // 6. post_attention_layernorm: ln2 = RMSNorm(x_mid)
    let ln2 = &mut a.ln2[..n * c];
    rmsnorm_forward(
        ln2,
        &mut a.rstd2[..n],
        x,
        Some(&mut a.x_mid[..n * c]),
        &w[p.post_attention_layernorm.range()],
        1.0,
        c,
        d.eps,
    );
    let (gate, up, hid) = (
        &mut a.gate[..n * d.f],
        &mut a.up[..n * d.f],
        &mut a.hid[..n * d.f],
    );
    // 7. MLP: gate and up of ln2, SwiGLU, down added to the residual stream
    matmul_forward_each(
        &mut [
            (&mut *gate, weight(p.gate_proj), d.f),
            (&mut *up, weight(p.up_proj), d.f),
        ],
        ln2,
        n,
        c,
        precision,
    );
    swiglu_forward(hid, gate, up);
    matmul_forward(x, hid, weight(p.down_proj), n, d.f, c, true, precision);
}

/// dx: (B, T, D) in place: the gradient w.r.t. the block's output on entry, w.r.t. its input on
/// return. Parameter gradients accumulate into `g` (same layout as `w`).
// block_forward's inputs with the gradients and scratch they are mirrored into
#[allow(clippy::too_many_arguments)]
pub fn block_backward(
    dx: &mut [f32],
    g: &mut [f32],
    sc: &mut Scratch,
    a: &LayerActs,
    w: &[f32],
    p: &LayerParams,
    d: &Dims,
    layer: usize,
    rope: &RopeTable,
    b: usize,
    t: usize,
    precision: Precision,
) {
    let n = b * t;
    let c = d.c;
    let s = &d.shape;
    let (ln1, ln2) = (&a.ln1[..n * c], &a.ln2[..n * c]);
    // 7. MLP backward; in the forward pass this was x_out = x_mid + down(swiglu(gate, up))
    let dhid = &mut sc.dhid[..n * d.f];
    linear_backward(
        Grad::Set(dhid),
        g,
        w,
        p.down_proj,
        dx,
        &a.hid[..n * d.f],
        n,
        d.f,
        c,
        precision,
    );
    let (dgate, dup) = (&mut sc.dgate[..n * d.f], &mut sc.dup[..n * d.f]);
    swiglu_backward(
        dgate,
        dup,
        &sc.dhid[..n * d.f],
        &a.gate[..n * d.f],
        &a.up[..n * d.f],
    );
    let dln = &mut sc.dln[..n * c];
    linear_backward(
        Grad::Set(dln),
        g,
        w,
        p.gate_proj,
        dgate,
        ln2,
        n,
        c,
        d.f,
        precision,
    );
    linear_backward(
        Grad::Add(dln),
        g,
        w,
        p.up_proj,
        dup,
        ln2,
        n,
        c,
        d.f,
        precision,
    );
    // 6. post_attention_layernorm backward; in the forward pass this was ln2 = RMSNorm(x_mid)
    let pal = p.post_attention_layernorm;
    rmsnorm_backward(
        Grad::Add(dx),
        &mut g[pal.range()],
        dln,
        &a.x_mid[..n * c],
        &w[pal.range()],
        1.0,
        &a.rstd2[..n],
        c,
    );
    // 5. o_proj backward; in the forward pass this was x_mid = x_in + o_proj(attn_out)
    let dattn = &mut sc.dattn[..n * d.out];
    linear_backward(
        Grad::Set(dattn),
        g,
        w,
        p.o_proj,
        dx,
        a.attn_out(n, d),
        n,
        d.out,
        c,
        precision,
    );
    let dln = &mut sc.dln[..n * c];
    let o = &a.o[..n * d.o_width()];
    // 4. the combination's backward (the attention's dO and, for diff pairs, λ's gradient)
    let delta = &mut sc.delta[..n * s.nq];
    // the attention backward's dO, and for a diff pair how its maps were combined: the maps
    // take their output gradients (dO₁, −λ·dO₁) from the combined output's
    let (d_o, pairs): (&[f32], _) = match d.kind {
        AttentionKind::Standard => {
            attention_delta(delta, dattn, o, s.nq, s.dv);
            (dattn, None)
        }
        AttentionKind::DiffV1 => {
            let dcomb: &[f32] = if d.subln {
                let lambda_init = lambda_init_at(d.lambda_init, layer);
                // in the forward pass this was `y = (1 − λ_init) · subln(comb)`
                let dcomb = &mut sc.dcomb[..n * d.out];
                let sub = p.subln.expect("diff_v1 layer has subln");
                rmsnorm_backward(
                    Grad::Set(dcomb),
                    &mut g[sub.range()],
                    dattn,
                    &a.comb[..n * d.out],
                    &w[sub.range()],
                    1.0 - lambda_init,
                    &a.sub_rstd[..n * d.h],
                    s.dv,
                );
                dcomb
            } else {
                // without subln the o_proj input was comb itself
                dattn
            };
            let (lambda, e1, e2) = a.lambda_parts;
            let dlam = &mut sc.dlam[..n * d.h];
            let lambda = Lambda::Layer(lambda);
            attn::diff_combine_backward(dlam, delta, dcomb, o, lambda, d.h, s.dv);
            let dlambda = dlam.iter().map(|&v| v as f64).sum::<f64>() as f32;
            let ls = p.lambdas.as_ref().expect("diff_v1 layer has lambdas");
            let lambdas = [0, 1, 2, 3].map(|i| &w[ls[i].range()]);
            let [g0, g1, g2, g3] = split4(g, ls);
            attn::lambda_full_backward([g0, g1, g2, g3], lambdas, e1, e2, dlambda);
            (dcomb, Some(lambda))
        }
        AttentionKind::DiffV2 => {
            let lam = &a.lam[..n * d.h];
            let dlam = &mut sc.dlam[..n * d.h];
            let lambda = Lambda::PerToken(lam);
            attn::diff_combine_backward(dlam, delta, dattn, o, lambda, d.h, s.dv);
            // in the forward pass this was `lam = σ(z)`, so dz = dlam · σ · (1 − σ)
            dlam.iter_mut()
                .zip(lam)
                .for_each(|(dl, &l)| *dl *= l * (1.0 - l));
            let lp = p.lambda_proj.expect("diff_v2 layer has lambda_proj");
            linear_backward(Grad::Set(dln), g, w, lp, dlam, ln1, n, c, d.h, precision);
            (dattn, Some(lambda))
        }
    };
    let (dq, dk, dv) = (
        &mut sc.dq[..n * d.q_width()],
        &mut sc.dk[..n * d.k_width()],
        &mut sc.dv[..n * d.v_width()],
    );
    // 3. attention backward, then RoPE's (a rotation's transpose) on dq and dk
    let (q, k, v) = (
        &a.q[..n * d.q_width()],
        &a.k[..n * d.k_width()],
        &a.v[..n * d.v_width()],
    );
    let (delta, lse) = (&sc.delta[..n * s.nq], &a.lse[..b * s.nq * t]);
    attention_backward(
        dq, dk, dv, d_o, q, k, v, delta, lse, b, t, s, pairs, precision,
    );
    rope_backward(dq, rope, t, s.nq, &[0]);
    rope_backward(dk, rope, t, s.nk, &[0]);
    // diff_v2's λ projection made the first contribution to dln
    // 2. q, k, v (and λ) projections backward, into dln
    let dln_q = if d.kind == AttentionKind::DiffV2 {
        Grad::Add(dln)
    } else {
        Grad::Set(dln)
    };
    linear_backward(dln_q, g, w, p.q_proj, dq, ln1, n, c, d.q_width(), precision);
    linear_backward(
        Grad::Add(dln),
        g,
        w,
        p.k_proj,
        dk,
        ln1,
        n,
        c,
        d.k_width(),
        precision,
    );
    linear_backward(
        Grad::Add(dln),
        g,
        w,
        p.v_proj,
        dv,
        ln1,
        n,
        c,
        d.v_width(),
        precision,
    );
    // 1. input_layernorm backward, added to dx; in the forward pass this was ln1 = RMSNorm(x)
    let il = p.input_layernorm;
    rmsnorm_backward(
        Grad::Add(dx),
        &mut g[il.range()],
        dln,
        &a.x_in[..n * c],
        &w[il.range()],
        1.0,
        &a.rstd1[..n],
        c,
    );
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

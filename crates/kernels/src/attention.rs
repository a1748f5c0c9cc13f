//! The one causal attention kernel behind every attention kind: flash-style, with an online
//! softmax over key tiles. No T×T matrix is kept; the backward recomputes each tile's scores
//! from q, k and the saved log-sum-exp.
//!
//! The kinds differ only in how query heads find their key and value heads (`AttnShape`) and
//! in how the outputs are combined afterwards (model/attention.rs); the backward is told that
//! combination (`Lambda`), so that a diff pair's two maps share their value products.

use super::attention_decode::attention_decode;
pub use super::attention_parts::AttnShape;
use super::attention_parts::{Online, PairRow, BK};
#[cfg(target_arch = "x86_64")]
use super::attention_scores::{probs_grads_row, scores_softmax};
use super::gemm::small::{small_gemm, with_packed, PackedB, MAX_PACKED};
use super::gemm::{extent, Dims, Mat, SharedOut};
use super::precision::Precision;
use super::{dot, exp_nonpos, exp_sum, scale_max, KvElem, SharedMut};
use rayon::prelude::*;
use std::ops::Range;

/// Query rows per block (and `BK` keys per tile); a tile of k and v rows stays in L1 across a
/// block.
const BQ: usize = 64;

/// Whether a call's products run in bf16 tiles: under `--bf16`, for calls of at least one
/// tile of queries (training, prefill); decoding's few queries per call stay f32, where a
/// tile would hold 15 rows of padding.
fn on_tiles(precision: Precision, queries: usize) -> bool {
    precision.is_bf16() && queries >= 16
}

/// Copies rows t0..t0+len of head `h` of x (rows of `heads`×`w`) into tile[w][BK], transposed,
/// so that the tile is the B operand of Q·Kᵀ. Columns past `len` keep whatever they held: every
/// product reads only the first `len`.
// a tile of one head of an interleaved tensor: position, head and width index it
#[allow(clippy::too_many_arguments)]
fn load_tile_t(
    tile: &mut [f32],
    x: &[f32],
    row0: usize,
    len: usize,
    heads: usize,
    h: usize,
    w: usize,
) {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut c0 = 0;
    #[cfg(target_arch = "x86_64")]
    if w.is_multiple_of(16) && super::gemm::cpu::avx512f() {
        assert!(tile.len() >= w * BK && x.len() >= ((row0 + len - 1) * heads + h + 1) * w);
        while c0 + 16 <= len {
            // SAFETY: AVX-512F is present; rows c0..c0+16 < len of x and columns < w of the
            // tile are inside the slices (asserted above).
            unsafe { transpose_rows16(tile, x, row0 + c0, c0, heads, h, w) };
            c0 += 16;
        }
    }
    for c in c0..len {
        let src = &x[((row0 + c) * heads + h) * w..][..w];
        for (d, &val) in src.iter().enumerate() {
            tile[d * BK + c] = val;
        }
    }
}

/// Sixteen rows of `load_tile_t` (x rows `row` .., tile columns `col` ..), 16 × 16 blocks at a
/// time transposed in registers instead of element by element.
///
/// # Safety
/// Needs AVX-512F; the rows and columns must lie inside x and tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_rows16(
    tile: &mut [f32],
    x: &[f32],
    row: usize,
    col: usize,
    heads: usize,
    h: usize,
    w: usize,
) {
    // SAFETY: AVX-512F and rows/columns inside x and tile are this
    // fn's contract, which bounds every masked load and store below.
    unsafe {
        use std::arch::x86_64::*;
        for d0 in (0..w).step_by(16) {
            let mut r = [_mm512_setzero_si512(); 16];
            for (i, r) in r.iter_mut().enumerate() {
                *r = _mm512_loadu_si512(
                    x.as_ptr().add(((row + i) * heads + h) * w + d0) as *const _
                );
            }
            super::transpose16(&mut r);
            for (i, v) in r.iter().enumerate() {
                _mm512_storeu_si512(tile.as_mut_ptr().add((d0 + i) * BK + col) as *mut _, *v);
            }
        }
    }
}

/// Copies rows t0..t0+len of head `h` of x (rows of `heads`×`w`) into tile[len][w]: the rows
/// of one head sit `heads`·`w` floats apart, often a multiple of 1 KiB, and a product that
/// streams them again and again keeps evicting itself from the same L1 sets.
fn load_tile(
    tile: &mut [f32],
    x: &[f32],
    row0: usize,
    len: usize,
    heads: usize,
    h: usize,
    w: usize,
) {
    for (c, dst) in tile[..len * w].chunks_exact_mut(w).enumerate() {
        dst.copy_from_slice(&x[((row0 + c) * heads + h) * w..][..w]);
    }
}

/// One thread's buffers, carved out of a thread-local allocation that is sized on first use
/// for heads up to 256 wide (wider ones, and longer key ranges, grow it once).
struct Scratch<'a> {
    /// Kᵀ and V of key tiles: (d, BK) and (BK, d) each; the forward stages every tile of its
    /// task's keys here, one after another, the backward one tile at a time (Vᵀ)
    kt: &'a mut [f32],
    vt: &'a mut [f32],
    /// scores, then probabilities, (BQ, BK) for each of two maps (the backward's pair)
    s: &'a mut [f32],
    /// dP, then dS, (BQ, BK) for each of two maps
    ds: &'a mut [f32],
    /// backward: the tile's dK (BK, DK) for each of up to MAX_K key heads, and dV (BK, DV)
    acc_k: &'a mut [f32],
    acc_v: &'a mut [f32],
    /// forward: each grouped head's output block (G, BQ, DV) and running max and sum (G, BQ),
    /// and the factor by which the current tile rescales a block's rows (BQ)
    o_acc: &'a mut [f32],
    m: &'a mut [f32],
    l: &'a mut [f32],
    corr: &'a mut [f32],
}

thread_local! {
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// a bf16 or q8_0 cache's rows widened for a prefill (`attention_cached`)
    static WIDENED: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Sizes this thread's scratch for heads of widths dk, dv over `keys` keys (see
/// `kernels::prepare_threads`).
pub(crate) fn reserve_scratch(dk: usize, dv: usize, group: usize, keys: usize) {
    // the backward stages the tiles of up to MAX_K key heads at once
    with_scratch(dk, dv, group, keys.max(MAX_K * BK), |_| ());
}

/// `group`: how many query heads share one key head (their outputs are built side by side);
/// `keys`: how many keys the tiles of `kt` and `vt` hold (rounded up to whole tiles).
fn with_scratch<R>(
    dk: usize,
    dv: usize,
    group: usize,
    keys: usize,
    f: impl FnOnce(Scratch) -> R,
) -> R {
    super::with_thread_buffer(&SCRATCH, |buf| {
        let w = dk.max(dv).max(256);
        let g = group.max(8);
        let tiles = keys.div_ceil(BK).max(1);
        let need = tiles * (dk + dv) * BK + (MAX_K + 1) * w * BK + 4 * BQ * BK + g * BQ * (w + 3);
        super::ensure(buf, need);
        let (kt, rest) = buf.split_at_mut(tiles * dk * BK);
        let (vt, rest) = rest.split_at_mut(tiles * dv * BK);
        let (s, rest) = rest.split_at_mut(2 * BQ * BK);
        let (ds, rest) = rest.split_at_mut(2 * BQ * BK);
        let (acc_k, rest) = rest.split_at_mut(MAX_K * BK.max(BQ) * dk);
        let (acc_v, rest) = rest.split_at_mut(BK.max(BQ) * dv);
        let (o_acc, rest) = rest.split_at_mut(group * BQ * dv);
        let (m, rest) = rest.split_at_mut(group * BQ);
        let (l, rest) = rest.split_at_mut(group * BQ);
        let corr = &mut rest[..BQ];
        f(Scratch {
            kt,
            vt,
            s,
            ds,
            acc_k,
            acc_v,
            o_acc,
            m,
            l,
            corr,
        })
    })
}

/// q: (B, Tq, NQ, DK), k: (B, Tkv, NK, DK), v: (B, Tkv, NV, DV) → o: (B, Tq, NQ, DV),
/// lse: (B, NQ, Tq). Query t sits at position `q_offset + t` and sees keys 0..=q_offset+t
/// (training: q_offset 0 and Tkv = Tq; decoding: the KV cache holds Tkv ≥ q_offset + Tq rows).
///
/// For each block of BQ queries, key tiles of BK go by: S = Q·Kᵀ·scale, the running row max m
/// and sum l are updated (online softmax), and O += exp(S − m)·V; O/l and m + ln l at the end.
// q, k, v and their outputs, with the call's shape and precision (the kernel's API)
#[allow(clippy::too_many_arguments)]
pub fn attention_forward(
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    b: usize,
    tq: usize,
    tkv: usize,
    q_offset: usize,
    s: &AttnShape,
    precision: Precision,
) {
    // 1. Shapes
    s.check();
    assert!(
        q_offset + tq <= tkv,
        "attention: {q_offset} + {tq} > {tkv} cached rows"
    );
    let AttnShape {
        nq, nk, nv, dk, dv, ..
    } = *s;
    assert_eq!(q.len(), b * tq * nq * dk);
    assert_eq!(o.len(), b * tq * nq * dv);
    assert_eq!(lse.len(), b * nq * tq);
    assert!(k.len() >= b * tkv * nk * dk && v.len() >= b * tkv * nv * dv);
    // 2. Decoding: one query per sequence, nothing for a tile to be reused by.
    if tq == 1 {
        let visible = q_offset + 1;
        return attention_decode(o, lse, q, k, v, b, tkv, visible, s);
    }
    // 3. One task per (sequence, key head): it runs every query head that reads that key head
    //    (a GQA group, or one diff sub-head) together, so each key tile is transposed once for
    //    all of them; those heads also share one value head. Tasks own their heads' rows of o
    //    and lse.
    let call = Forward {
        o: SharedMut::new(o),
        lse: SharedMut::new(lse),
        q,
        k,
        v,
        tq,
        tkv,
        q_offset,
        s: *s,
        scale: 1.0 / (dk as f32).sqrt(),
        bf16: on_tiles(precision, tq),
    };
    (0..b * nk)
        .into_par_iter()
        .for_each(|task| call.task(task / nk, task % nk));
}

/// Attention of the `tq` new queries of one sequence, at positions `q_offset..`, over the first
/// `q_offset + tq` rows of its KV cache (k (Tkv, NK, DK), v (Tkv, NV, DV), in f32, bf16 or
/// q8_0 blocks): an f32 cache is read in place by `attention_forward`; the others by the
/// decoding kernel when one token is decoded (widened as they are loaded), else (prefill)
/// widened first into a thread buffer for the tile kernel.
// attention_forward's operands for one sequence, its cache rows of any entry type
#[allow(clippy::too_many_arguments)]
pub fn attention_cached<C: KvElem>(
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[C],
    v: &[C],
    tq: usize,
    q_offset: usize,
    s: &AttnShape,
    precision: Precision,
) {
    let tkv = q_offset + tq;
    let (kw, vw) = (s.nk * s.dk, s.nv * s.dv);
    let (k, v) = (&k[..tkv * C::entries(kw)], &v[..tkv * C::entries(vw)]);
    let run = |o: &mut [f32], lse: &mut [f32], k: &[f32], v: &[f32]| {
        attention_forward(o, lse, q, k, v, 1, tq, tkv, q_offset, s, precision)
    };
    match (C::as_f32(k), C::as_f32(v)) {
        (Some(k), Some(v)) => run(o, lse, k, v),
        _ if tq == 1 => {
            s.check();
            attention_decode(o, lse, q, k, v, 1, tkv, tkv, s)
        }
        _ => super::with_thread_buffer(&WIDENED, |buf| {
            let (kf, vf) = super::ensure(buf, tkv * (kw + vw)).split_at_mut(tkv * kw);
            let isa = super::gemm::cpu::Isa::detect();
            C::widen(isa, k, tkv, kw, kf);
            C::widen(isa, v, tkv, vw, vf);
            run(o, lse, kf, vf)
        }),
    }
}

/// One forward call over many queries, shared by its tasks.
struct Forward<'a> {
    o: SharedMut,
    lse: SharedMut,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    tq: usize,
    tkv: usize,
    q_offset: usize,
    s: AttnShape,
    scale: f32,
    bf16: bool,
}

/// One forward task: sequence `bi`, key head `kh`, the query heads that read it and their value
/// head, and where its products take their operands.
struct ForwardTask<'h, 'p, 'a> {
    bi: usize,
    kh: usize,
    vh: usize,
    heads: &'h [usize],
    src: Src<'p, 'a>,
    /// f32 on AVX-512: the scores' softmax runs in the product's registers
    fused: bool,
    /// A call of many queries streams each V tile again and again, from a copy; a few queries
    /// (a short chunk against a cache) read each row once, in place.
    copy_v: bool,
}

/// A query block's running state in the scratch: the score tile (BQ, BK), each of the task's
/// heads' output rows (G, BQ, DV) and running max and sum (G, BQ), and the factor by which the
/// current key tile rescales a row (BQ).
struct BlockState<'s> {
    s: &'s mut [f32],
    o_acc: &'s mut [f32],
    m: &'s mut [f32],
    l: &'s mut [f32],
    corr: &'s mut [f32],
}

/// Key tile t0..t0 + len as the products read it: Kᵀ (DK, BK) and V rows (unused when the
/// operands are packed).
struct KeyTile<'t> {
    t0: usize,
    len: usize,
    kt: &'t [f32],
    vt: Mat<'t>,
}

impl<'a> Forward<'a> {
    /// Sequence `bi`, key head `kh`: every query head that reads it, over every query block.
    fn task(&self, bi: usize, kh: usize) {
        let AttnShape { nk, nv, dk, dv, .. } = self.s;
        // 1. The query heads that read key head kh; they share one value head.
        let mut heads = [0usize; 64];
        let mut ng = 0;
        for j in (0..self.s.nq).filter(|&j| self.s.k_head(j) == kh) {
            heads[ng] = j;
            ng += 1;
        }
        let heads = &heads[..ng];
        let vh = self.s.v_head(heads[0]);
        // 2. Under bf16 the task's keys (as Kᵀ) and values are packed into tiles once, for all
        //    its query blocks and heads; without them (f32, or no AVX512_BF16) the products
        //    run on f32 tiles of k and v.
        let keys = (
            head_rows(self.k, bi * self.tkv, nk, kh, dk).transposed(),
            dk,
            self.tkv,
        );
        let values = (head_rows(self.v, bi * self.tkv, nv, vh, dv), self.tkv, dv);
        with_packed(self.bf16, &[keys, values], |kv| {
            #[cfg(target_arch = "x86_64")]
            let fused = kv.is_none() && super::gemm::cpu::avx512f();
            #[cfg(not(target_arch = "x86_64"))]
            let fused = false;
            let task = ForwardTask {
                bi,
                kh,
                vh,
                heads,
                src: Src {
                    packed: kv,
                    bf16: self.bf16,
                },
                fused,
                copy_v: kv.is_none() && self.tq >= 16,
            };
            // 3. Query blocks of BQ, each over the key tiles it sees. Key rows staged so far:
            //    each key tile is copied once for all query blocks.
            with_scratch(dk, dv, ng, self.tkv, |sc| {
                let Scratch {
                    kt,
                    vt,
                    s,
                    o_acc,
                    m,
                    l,
                    corr,
                    ..
                } = sc;
                let mut blk = BlockState {
                    s,
                    o_acc,
                    m,
                    l,
                    corr,
                };
                let mut staged = 0;
                for q0 in (0..self.tq).step_by(BQ) {
                    self.query_block(&task, kt, vt, &mut blk, q0, &mut staged);
                }
            })
        });
    }

    /// Query rows q0.. of the task's heads against every key tile they see, then their o and
    /// lse rows.
    fn query_block(
        &self,
        task: &ForwardTask,
        kt: &mut [f32],
        vt: &mut [f32],
        blk: &mut BlockState,
        q0: usize,
        staged: &mut usize,
    ) {
        let (ng, dv) = (task.heads.len(), self.s.dv);
        let rows = BQ.min(self.tq - q0);
        // 1. A fresh online softmax for each head's rows
        blk.m[..ng * BQ].fill(f32::NEG_INFINITY);
        blk.l[..ng * BQ].fill(0.0);
        blk.o_acc[..ng * BQ * dv].fill(0.0);
        // 2. Key tiles up to the block's last query: each head's scores, softmax and P·V
        let kv_end = self.q_offset + q0 + rows;
        for t0 in (0..kv_end).step_by(BK) {
            let tile = self.stage_tile(task, kt, vt, t0, BK.min(kv_end - t0), staged);
            for (gi, &j) in task.heads.iter().enumerate() {
                self.head_tile(task, &tile, blk, gi, j, q0, rows);
            }
        }
        // 3. O = O/l and lse = m + ln l
        self.write_block(task, blk, q0, rows);
    }

    /// Key tile t0..t0 + len of the task: under f32, copied into the scratch (Kᵀ, and V when
    /// it pays) unless an earlier query block staged it whole; a tile staged in part (a later
    /// block sees more of it) is staged again.
    fn stage_tile<'t>(
        &self,
        task: &ForwardTask,
        kt: &'t mut [f32],
        vt: &'t mut [f32],
        t0: usize,
        len: usize,
        staged: &mut usize,
    ) -> KeyTile<'t>
    where
        'a: 't,
    {
        let AttnShape { nk, nv, dk, dv, .. } = self.s;
        let row0 = task.bi * self.tkv + t0;
        let (kt, vt) = (
            &mut kt[t0 * dk..(t0 + BK) * dk],
            &mut vt[t0 * dv..(t0 + BK) * dv],
        );
        let packed = task.src.packed.is_some();
        if !packed && t0 + len > *staged {
            load_tile_t(kt, self.k, row0, len, nk, task.kh, dk);
            if task.copy_v {
                load_tile(vt, self.v, row0, len, nv, task.vh, dv);
            }
            *staged = t0 + len;
        }
        let vt = if packed {
            Mat::rows(&[], 0)
        } else if task.copy_v {
            Mat::rows(vt, dv)
        } else {
            head_rows(self.v, row0, nv, task.vh, dv)
        };
        KeyTile { t0, len, kt, vt }
    }

    /// Query head j (the task's gi-th) over one key tile: its scores and online-softmax update,
    /// the rescale of what its rows accumulated, and O += P·V.
    // the block's place (q0, rows) and the head's (gi, j) are what the call is about
    #[allow(clippy::too_many_arguments)]
    fn head_tile(
        &self,
        task: &ForwardTask,
        tile: &KeyTile,
        blk: &mut BlockState,
        gi: usize,
        j: usize,
        q0: usize,
        rows: usize,
    ) {
        let (dv, src) = (self.s.dv, task.src);
        let KeyTile { t0, len, kt, vt } = *tile;
        let valid = |r: usize| seen(self.q_offset + q0 + r, t0, len);
        let q_blk = head_rows(self.q, task.bi * self.tq + q0, self.s.nq, j, self.s.dk);
        let st = Online {
            m: &mut blk.m[gi * BQ..(gi + 1) * BQ],
            l: &mut blk.l[gi * BQ..(gi + 1) * BQ],
            corr: &mut *blk.corr,
        };
        // 1. S = Q·Kᵀ·scale and the online softmax: P = exp(S − m), m, l and corr updated
        if task.fused {
            // SAFETY: AVX-512F is present (`fused`).
            #[cfg(target_arch = "x86_64")]
            unsafe {
                scores_softmax(rows, self.s.dk, q_blk, kt, self.scale, valid, blk.s, st)
            };
        } else {
            let c_s = (blk.s.as_mut_ptr(), BK, false);
            let (mnk, kt) = ((rows, len, self.s.dk), Mat::rows(kt, BK));
            // SAFETY: blk.s holds rows × BK.
            unsafe { src.product(0, (t0, 0), mnk, q_blk, kt, c_s) };
            softmax_rows(&mut blk.s[..rows * BK], self.scale, valid, st);
        }
        // 2. What the rows accumulated before this tile, rescaled to the new max
        let oacc = &mut blk.o_acc[gi * BQ * dv..(gi * BQ + rows) * dv];
        for (row, &c) in oacc.chunks_exact_mut(dv).zip(blk.corr.iter()) {
            if c != 1.0 {
                row.iter_mut().for_each(|x| *x *= c);
            }
        }
        // 3. O += P·V over the keys each chunk of rows sees
        for (r, keys) in causal_chunks(rows, len, valid, src) {
            let p = Mat {
                data: &blk.s[r.start * BK..],
                rs: BK,
                cs: 1,
            };
            let c_o = (oacc[r.start * dv..].as_mut_ptr(), dv, true);
            // SAFETY: oacc holds rows × dv.
            unsafe { src.product(1, (0, t0), (r.len(), dv, keys), p, vt, c_o) };
        }
    }

    /// The block's finished rows: o = O/l and lse = m + ln l, for each of the task's heads.
    fn write_block(&self, task: &ForwardTask, blk: &BlockState, q0: usize, rows: usize) {
        let (nq, dv, tq, bi) = (self.s.nq, self.s.dv, self.tq, task.bi);
        for (gi, &j) in task.heads.iter().enumerate() {
            for r in 0..rows {
                // SAFETY: rows of head j (in o and lse) belong to this task alone.
                let (orow, lse_r) = unsafe {
                    (
                        self.o.slice(((bi * tq + q0 + r) * nq + j) * dv, dv),
                        self.lse.slice((bi * nq + j) * tq + q0 + r, 1),
                    )
                };
                let (m, l) = (blk.m[gi * BQ + r], blk.l[gi * BQ + r]);
                let inv = 1.0 / l;
                let acc = &blk.o_acc[(gi * BQ + r) * dv..(gi * BQ + r + 1) * dv];
                for (o, &a) in orow.iter_mut().zip(acc) {
                    *o = a * inv;
                }
                lse_r[0] = m + l.ln();
            }
        }
    }
}

/// How many of the `len` keys from position t0 the query at position `pos` sees (causal: the
/// keys at positions up to its own).
fn seen(pos: usize, t0: usize, len: usize) -> usize {
    (pos + 1).saturating_sub(t0).min(len)
}

/// Rows of a query block against a key tile of `len` keys, as (rows, keys the last of them
/// sees): on a tile that the causal mask cuts (f32 products), chunks of CAUSAL_CHUNK rows, so
/// that products over the keys skip each chunk's masked columns, where P is zero (close to half
/// of a diagonal tile's work); otherwise all rows and keys at once. Chunks that see no key
/// are left out.
fn causal_chunks(
    rows: usize,
    len: usize,
    valid: impl Fn(usize) -> usize,
    src: Src,
) -> impl Iterator<Item = (Range<usize>, usize)> {
    chunks(rows, cut_step(rows, len, &valid, src))
        .map(move |r| (r.clone(), valid(r.end - 1)))
        .filter(|(_, keys)| *keys > 0)
}

/// The keys of a tile as (keys, first query row that sees them), chunked as `causal_chunks`
/// chunks rows: products over the queries (dV, dK) skip those that see none of a chunk.
fn key_chunks(
    rows: usize,
    len: usize,
    valid: impl Fn(usize) -> usize,
    src: Src,
) -> impl Iterator<Item = (Range<usize>, usize)> {
    chunks(len, cut_step(len, len, &valid, src))
        .map(move |c| {
            (
                c.clone(),
                (0..rows).find(|&r| valid(r) > c.start).unwrap_or(rows),
            )
        })
        .filter(move |(_, r0)| *r0 < rows)
}

/// Chunks of `step` over 0..n.
fn chunks(n: usize, step: usize) -> impl Iterator<Item = Range<usize>> {
    (0..n).step_by(step).map(move |i| i..(i + step).min(n))
}

/// CAUSAL_CHUNK where the mask cuts the tile and the products are f32, else all n at once.
fn cut_step(n: usize, len: usize, valid: impl Fn(usize) -> usize, src: Src) -> usize {
    if src.packed.is_none() && valid(0) < len {
        CAUSAL_CHUNK
    } else {
        n.max(1)
    }
}

/// Rows or keys per chunk on a diagonal tile: two of small_gemm's six-row register tiles.
const CAUSAL_CHUNK: usize = 12;

/// The online softmax's update of a block's score rows in place (rows of BK, row r seeing the
/// first `valid(r)` keys), where `scores_softmax` does not run: two passes that vectorise,
/// scale, mask and max, then exp and sum.
fn softmax_rows(s: &mut [f32], scale: f32, valid: impl Fn(usize) -> usize, mut st: Online) {
    for (r, row) in s.chunks_exact_mut(BK).enumerate() {
        // The whole BK-wide row (masked past `valid`), so that the lane-wise reductions group
        // the same keys whatever the tile's length: a query's result does not depend on which
        // block or call it came in.
        let valid = valid(r);
        if valid == 0 {
            row.fill(0.0);
            st.corr[r] = 1.0;
            continue;
        }
        let m_new = st.raise(r, scale_max(row, scale, valid));
        let sum = exp_sum(row, m_new);
        st.settle(r, m_new, sum);
    }
}

/// delta (B, T, NQ) = rowsum(dout ∘ o) per query row and head, the softmax backward's
/// correction term (`attention_backward`): a pass over whole token rows, which lie contiguous.
/// `diff_combine_backward` (model/attention.rs) writes the same values as it goes.
pub fn attention_delta(delta: &mut [f32], dout: &[f32], o: &[f32], nq: usize, dv: usize) {
    assert!(
        dout.len() == o.len() && delta.len() * dv == o.len() && o.len().is_multiple_of(nq * dv)
    );
    delta
        .par_chunks_mut(nq * 64)
        .zip(dout.par_chunks(nq * dv * 64))
        .zip(o.par_chunks(nq * dv * 64))
        .for_each(|((d, dout), o)| {
            for ((d, dy), o) in d.iter_mut().zip(dout.chunks(dv)).zip(o.chunks(dv)) {
                *d = dot(dy, o);
            }
        });
}

/// How the two maps of each diff pair combine, o = attn1 − λ·attn2: one λ for the layer
/// (diff_v1) or one per token and pair, (N, NQ / 2) (diff_v2: σ(lambda_proj x)).
#[derive(Clone, Copy)]
pub enum Lambda<'a> {
    Layer(f32),
    PerToken(&'a [f32]),
}

impl Lambda<'_> {
    /// λ of pair `pair` at row `row_pair` = row · H + pair.
    pub fn at(&self, row_pair: usize) -> f32 {
        match self {
            Lambda::Layer(l) => *l,
            Lambda::PerToken(l) => l[row_pair],
        }
    }
}

/// Most key heads one backward task reads (diff_v1: a pair's K1 and K2).
const MAX_K: usize = 2;

/// Writes dq (B, T, NQ, DK), dk (B, T, NK, DK), dv (B, T, NV, DV) from dout (B, T, NQ, DV),
/// for the training case (q_offset 0, Tkv = Tq = T). In the forward pass this was
/// `P = exp(Q·Kᵀ·scale − lse); O = P·V`, so now `dV += Pᵀ·dO`, `dP = dO·Vᵀ`,
/// `dS = P ∘ (dP − rowsum(dO ∘ O))·scale`, `dQ += dS·K`, `dK += dSᵀ·Q`; the row sums come in
/// `delta` (B, T, NQ) (`attention_delta`).
///
/// With `pairs` (diff_v1, diff_v2: query heads 2p and 2p + 1 read one value head, and the
/// model's output was attn1 − λ·attn2, so that dO₁ is that output's gradient and
/// dO₂ = −λ·dO₁) dout is the combined output's gradient, (B, T, NQ / 2, DV), and the pair
/// shares its value products: dP₁ = dO₁·Vᵀ serves both maps (dP₂ = −λ·dP₁) and
/// dV += (P₁ − λ·P₂)ᵀ·dO₁, two products where there were four.
///
/// Key tiles are the outer loop (FlashAttention-2 order): a tile's dK and dV gather over every
/// later query block in cache-resident buffers and are written back once.
// the forward's operands plus their gradients and the saved softmax statistics
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    delta: &[f32],
    lse: &[f32],
    b: usize,
    t: usize,
    s: &AttnShape,
    pairs: Option<Lambda>,
    precision: Precision,
) {
    // 1. Shapes
    s.check();
    let AttnShape {
        nq,
        nk,
        nv,
        dk: d_k,
        dv: d_v,
        ..
    } = *s;
    assert_eq!(dq.len(), b * t * nq * d_k);
    assert_eq!(dk.len(), b * t * nk * d_k);
    assert_eq!(dv.len(), b * t * nv * d_v);
    assert_eq!(lse.len(), b * nq * t);
    assert!(q.len() == dq.len() && k.len() == dk.len() && v.len() == dv.len());
    // a pair's maps read one row of dout: the combined output's
    let (do_heads, do_head) = match pairs {
        Some(_) => (nq / 2, 2),
        None => (nq, 1),
    };
    assert!(dout.len() == b * t * do_heads * d_v && delta.len() == b * t * nq);
    assert!(
        nk <= MAX_K * nv,
        "attention: {nk} key heads for {nv} value heads"
    );
    if let Some(Lambda::PerToken(l)) = pairs {
        assert_eq!(
            l.len(),
            b * t * nq / 2,
            "attention: one λ per token and pair"
        );
    }
    let group = nq / nv;
    assert!(
        group <= 64,
        "attention: {group} query heads per value head (at most 64)"
    );
    assert!(
        pairs.is_none() || group % 2 == 0,
        "attention: pairs of query heads need an even {group} per value head"
    );
    // 2. One task per (sequence, value head g): it runs every query head that reads value
    //    head g, and those are the only heads that read g's key heads, so its dk and dv rows
    //    are its own.
    let call = Backward {
        dq: SharedMut::new(dq),
        dk: SharedMut::new(dk),
        dv: SharedMut::new(dv),
        dout,
        q,
        k,
        v,
        delta,
        lse,
        t,
        s: *s,
        pairs,
        scale: 1.0 / (d_k as f32).sqrt(),
        bf16: on_tiles(precision, t),
        do_heads,
        do_head,
        group,
    };
    (0..b * nv)
        .into_par_iter()
        .for_each(|task| call.task(task / nv, task % nv));
}

/// One backward call, shared by its tasks.
struct Backward<'a> {
    dq: SharedMut,
    dk: SharedMut,
    dv: SharedMut,
    dout: &'a [f32],
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    delta: &'a [f32],
    lse: &'a [f32],
    t: usize,
    s: AttnShape,
    pairs: Option<Lambda<'a>>,
    scale: f32,
    bf16: bool,
    /// dout's heads per row, and query heads per dout head (2 for a pair)
    do_heads: usize,
    do_head: usize,
    /// query heads per value head
    group: usize,
}

/// One backward task: sequence `bi`, value head `g`, the query heads that read it (pairs side
/// by side) and the key heads they read, each with its slot of Kᵀ and dK in the scratch.
struct BackwardTask<'p, 'a> {
    bi: usize,
    g: usize,
    heads: [usize; 64],
    kheads: [usize; MAX_K],
    n_kh: usize,
    src: Src<'p, 'a>,
}

impl BackwardTask<'_, '_> {
    /// The scratch slot of the key head that query head j reads.
    fn slot_of(&self, s: &AttnShape, j: usize) -> usize {
        let slot = self.kheads[..self.n_kh]
            .iter()
            .position(|&kh| kh == s.k_head(j));
        slot.expect("the task reads this key head")
    }
}

/// Where a unit of the backward stands: key tile t0..t0 + len against query rows q0..q0 + rows.
#[derive(Clone, Copy)]
struct TileBlock {
    t0: usize,
    len: usize,
    q0: usize,
    rows: usize,
}

impl TileBlock {
    /// How many of the tile's keys query row r of the block sees.
    fn valid(&self, r: usize) -> usize {
        seen(self.q0 + r, self.t0, self.len)
    }
}

/// The heads that share their value products: a diff pair, or one head. Map mi of the unit is
/// head maps[mi], with packed operands from `op(mi)` and scores and dS at s[mi], ds[mi].
#[derive(Clone, Copy)]
struct Unit<'h> {
    maps: &'h [usize],
    /// the index of maps[0] among the task's heads
    first: usize,
}

impl Unit<'_> {
    /// The first of map mi's packed operands (Q, dO, Kᵀ, K); operand 0 is the task's Vᵀ.
    fn op(&self, mi: usize) -> usize {
        1 + 4 * (self.first + mi)
    }
}

impl Backward<'_> {
    /// Offset of row i (of sequence bi), head h, in a (B, T, heads, w) tensor.
    fn at(&self, bi: usize, i: usize, heads: usize, h: usize, w: usize) -> usize {
        ((bi * self.t + i) * heads + h) * w
    }

    /// Sequence `bi`, value head `g`: the gradients of every query head that reads it, key tile
    /// by key tile.
    fn task(&self, bi: usize, g: usize) {
        let AttnShape {
            nq,
            nk,
            nv,
            dk: d_k,
            dv: d_v,
            ..
        } = self.s;
        let (t, group) = (self.t, self.group);
        // 1. The group's query heads, and the key heads they read
        let heads: [usize; 64] = std::array::from_fn(|i| g * group + i);
        let mut kheads = [0usize; MAX_K];
        let mut n_kh = 0;
        for &j in &heads[..group] {
            if !kheads[..n_kh].contains(&self.s.k_head(j)) {
                kheads[n_kh] = self.s.k_head(j);
                n_kh += 1;
            }
        }
        // 2. Under bf16 every B operand is packed once for the task, instead of a tile of it
        //    per product: Vᵀ, then per head its Q, dO, Kᵀ and K (`Src::product`'s operand i).
        let mut ops = [(Mat::rows(&[], 0), 0, 0); MAX_PACKED];
        let n_ops = 1 + 4 * group;
        let n_ops = if n_ops <= MAX_PACKED { n_ops } else { 0 };
        if n_ops > 0 {
            ops[0] = (head_rows(self.v, bi * t, nv, g, d_v).transposed(), d_v, t);
            for (hi, &j) in heads[..group].iter().enumerate() {
                let (kh, do_h) = (self.s.k_head(j), j / self.do_head);
                ops[1 + 4 * hi] = (head_rows(self.q, bi * t, nq, j, d_k), t, d_k);
                ops[2 + 4 * hi] = (
                    head_rows(self.dout, bi * t, self.do_heads, do_h, d_v),
                    t,
                    d_v,
                );
                ops[3 + 4 * hi] = (head_rows(self.k, bi * t, nk, kh, d_k).transposed(), d_k, t);
                ops[4 + 4 * hi] = (head_rows(self.k, bi * t, nk, kh, d_k), t, d_k);
            }
        }
        // 3. Key tiles, the outer loop
        with_packed(self.bf16, &ops[..n_ops], |packed| {
            let src = Src {
                packed,
                bf16: self.bf16,
            };
            let task = BackwardTask {
                bi,
                g,
                heads,
                kheads,
                n_kh,
                src,
            };
            with_scratch(d_k, d_v, 1, MAX_K * BK, |mut sc| {
                for t0 in (0..t).step_by(BK) {
                    self.key_tile(&task, &mut sc, t0);
                }
            })
        });
    }

    /// Key tile t0.. of the task: its dK and dV gathered over every query block that sees it,
    /// then written back; dQ added to as it goes.
    fn key_tile(&self, task: &BackwardTask, sc: &mut Scratch, t0: usize) {
        let AttnShape {
            nk,
            nv,
            dk: d_k,
            dv: d_v,
            ..
        } = self.s;
        let (t, bi, n_kh) = (self.t, task.bi, task.n_kh);
        let len = BK.min(t - t0);
        // 1. Vᵀ and each key head's Kᵀ staged (f32 products)
        if task.src.packed.is_none() {
            load_tile_t(sc.vt, self.v, bi * t + t0, len, nv, task.g, d_v);
            for (si, &kh) in task.kheads[..n_kh].iter().enumerate() {
                let kt = &mut sc.kt[si * d_k * BK..(si + 1) * d_k * BK];
                load_tile_t(kt, self.k, bi * t + t0, len, nk, kh, d_k);
            }
        }
        // 2. The tile's dK and dV start at zero
        sc.acc_v[..len * d_v].fill(0.0);
        sc.acc_k[..n_kh * BK * d_k].fill(0.0);
        // 3. Only queries at or after the tile's first key see it; a pair is one unit (its
        //    value products shared), else each head is one.
        let unit = if self.pairs.is_some() { 2 } else { 1 };
        for q0 in (t0..t).step_by(BQ) {
            let at = TileBlock {
                t0,
                len,
                q0,
                rows: BQ.min(t - q0),
            };
            for (ui, maps) in task.heads[..self.group].chunks(unit).enumerate() {
                let u = Unit {
                    maps,
                    first: ui * unit,
                };
                self.unit_block(task, sc, at, u);
            }
        }
        // 4. dK and dV written back once
        for (si, &kh) in task.kheads[..n_kh].iter().enumerate() {
            let acc = &sc.acc_k[si * BK * d_k..][..len * d_k];
            for (c, row) in acc.chunks_exact(d_k).enumerate() {
                // SAFETY: key head kh belongs to this task's group.
                unsafe { self.dk.slice(self.at(bi, t0 + c, nk, kh, d_k), d_k) }
                    .copy_from_slice(row);
            }
        }
        for (c, row) in sc.acc_v[..len * d_v].chunks_exact(d_v).enumerate() {
            // SAFETY: value head g belongs to this task.
            unsafe { self.dv.slice(self.at(bi, t0 + c, nv, task.g, d_v), d_v) }
                .copy_from_slice(row);
        }
    }

    /// One unit's query block against one key tile, the forward's steps in reverse.
    fn unit_block(&self, task: &BackwardTask, sc: &mut Scratch, at: TileBlock, u: Unit) {
        // 1. In the forward pass this was S = Q·Kᵀ: S again for each map, and dP = dO·Vᵀ
        self.scores_dp(task, sc, at, u);
        // 2. ... and P = exp(S·scale − lse): P and dS = P ∘ (dP − delta)·scale
        self.probs_grads(task, sc, at, u);
        // 3. ... and O = P·V: dV += Pᵀ·dO; from S = Q·Kᵀ: dK += dSᵀ·Q
        self.dv_dk(task, sc, at, u);
        // 4. ... and dQ += dS·K
        self.dq(task, sc, at, u);
    }

    /// Each map's scores S = Q·Kᵀ, and dP = dO·Vᵀ of the unit's first map (a pair's second
    /// is −λ times it), over the keys each chunk of rows sees.
    fn scores_dp(&self, task: &BackwardTask, sc: &mut Scratch, at: TileBlock, u: Unit) {
        let (bi, t, src) = (task.bi, self.t, task.src);
        let (nq, d_k, d_v) = (self.s.nq, self.s.dk, self.s.dv);
        let do_blk = self.dout_block(task, at, u);
        for (r, keys) in causal_chunks(at.rows, at.len, |r| at.valid(r), src) {
            let (m, n) = (r.len(), keys);
            for (mi, &j) in u.maps.iter().enumerate() {
                let kt = Mat::rows(&sc.kt[task.slot_of(&self.s, j) * d_k * BK..], BK);
                let c_s = (sc.s[(mi * BQ + r.start) * BK..].as_mut_ptr(), BK, false);
                let q_r = head_rows(self.q, bi * t + at.q0, nq, j, d_k).from(r.start, 0);
                // SAFETY: C is this thread's scratch tile, rows × BK.
                unsafe { src.product(u.op(mi) + 2, (at.t0, 0), (m, n, d_k), q_r, kt, c_s) };
            }
            let c_ds = (sc.ds[r.start * BK..].as_mut_ptr(), BK, false);
            let do_r = do_blk.from(r.start, 0);
            let vt = Mat::rows(sc.vt, BK);
            // SAFETY: as above.
            unsafe { src.product(0, (at.t0, 0), (m, n, d_v), do_r, vt, c_ds) };
        }
    }

    /// P and dS of each score row in place; a pair's P leaves as P₁ − λ·P₂, its weights on V.
    fn probs_grads(&self, task: &BackwardTask, sc: &mut Scratch, at: TileBlock, u: Unit) {
        let (bi, t, nq) = (task.bi, self.t, self.s.nq);
        #[cfg(target_arch = "x86_64")]
        let avx512 = super::gemm::cpu::avx512f();
        for r in 0..at.rows {
            let i = at.q0 + r;
            let valid = at.valid(r);
            let ld = |j: usize| {
                (
                    self.lse[(bi * nq + j) * t + i],
                    self.delta[(bi * t + i) * nq + j],
                )
            };
            let (s0, s1) = sc.s.split_at_mut(BQ * BK);
            let (ds0, ds1) = sc.ds.split_at_mut(BQ * BK);
            let row = r * BK..(r + 1) * BK;
            let pair = self.pairs.map(|l| PairRow {
                p: &mut s1[row.clone()],
                ds: &mut ds1[row.clone()],
                lse_delta: ld(u.maps[1]),
                lambda: l.at((bi * t + i) * self.do_heads + u.maps[0] / self.do_head),
            });
            let (p, ds) = (&mut s0[row.clone()], &mut ds0[row]);
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                // SAFETY: AVX-512F is present.
                unsafe { probs_grads_row(p, ds, valid, ld(u.maps[0]), self.scale, pair) };
                continue;
            }
            probs_grads_values(p, ds, valid, ld(u.maps[0]), self.scale, pair);
        }
    }

    /// dV (from P, a pair's P₁ − λ·P₂) and each map's dK, each chunk of keys over the queries
    /// that see it.
    fn dv_dk(&self, task: &BackwardTask, sc: &mut Scratch, at: TileBlock, u: Unit) {
        let (bi, t, src) = (task.bi, self.t, task.src);
        let (nq, d_k, d_v) = (self.s.nq, self.s.dk, self.s.dv);
        let do_blk = self.dout_block(task, at, u);
        for (c, r0) in key_chunks(at.rows, at.len, |r| at.valid(r), src) {
            let (m, kq) = (c.len(), at.rows - r0);
            let at_q = (0, at.q0 + r0);
            let p_c = map_tile(sc.s, 0).transposed().from(c.start, r0);
            let do_r = do_blk.from(r0, 0);
            let c_dv = (sc.acc_v[c.start * d_v..].as_mut_ptr(), d_v, true);
            // SAFETY: dV and dK gather in this thread's scratch (len rows).
            unsafe { src.product(u.op(0) + 1, at_q, (m, d_v, kq), p_c, do_r, c_dv) };
            for (mi, &j) in u.maps.iter().enumerate() {
                let ds_c = map_tile(sc.ds, mi).transposed().from(c.start, r0);
                let q_r = head_rows(self.q, bi * t + at.q0, nq, j, d_k).from(r0, 0);
                let acc = &mut sc.acc_k[task.slot_of(&self.s, j) * BK * d_k..];
                let c_dk = (acc[c.start * d_k..].as_mut_ptr(), d_k, true);
                // SAFETY: as above.
                unsafe { src.product(u.op(mi), at_q, (m, d_k, kq), ds_c, q_r, c_dk) };
            }
        }
    }

    /// dQ += dS·K, each chunk of queries over the keys it sees; every query row meets the
    /// first key tile, which writes (not adds to) its dq rows.
    fn dq(&self, task: &BackwardTask, sc: &mut Scratch, at: TileBlock, u: Unit) {
        let (bi, t, src) = (task.bi, self.t, task.src);
        let (nq, nk, d_k) = (self.s.nq, self.s.nk, self.s.dk);
        for (r, keys) in causal_chunks(at.rows, at.len, |r| at.valid(r), src) {
            for (mi, &j) in u.maps.iter().enumerate() {
                let k_rows = head_rows(self.k, bi * t + at.t0, nk, self.s.k_head(j), d_k);
                let dq_at = self.at(bi, at.q0 + r.start, nq, j, d_k);
                let span = (r.len() - 1) * nq * d_k + d_k;
                let mnk = (r.len(), d_k, keys);
                let ds_r = map_tile(sc.ds, mi).from(r.start, 0);
                // SAFETY: query head j's rows of dq are written by this task only.
                unsafe {
                    let c_dq = (self.dq.ptr(dq_at, span), nq * d_k, at.t0 > 0);
                    src.product(u.op(mi) + 3, (0, at.t0), mnk, ds_r, k_rows, c_dq);
                }
            }
        }
    }

    /// The unit's rows of dout for the block: the combined output's gradient for a pair.
    fn dout_block(&self, task: &BackwardTask, at: TileBlock, u: Unit) -> Mat<'_> {
        let row0 = task.bi * self.t + at.q0;
        head_rows(
            self.dout,
            row0,
            self.do_heads,
            u.maps[0] / self.do_head,
            self.s.dv,
        )
    }
}

/// Map mi's (BQ, BK) tile of the backward's scratch scores or dS, by rows.
fn map_tile(x: &[f32], mi: usize) -> Mat<'_> {
    Mat::rows(&x[mi * BQ * BK..(mi + 1) * BQ * BK], BK)
}

/// The backward's P and dS of one score row in place, where `probs_grads_row` does not run:
/// p = exp(s·scale − lse), ds = p·(dp − delta)·scale for the first `valid` keys, 0 past them.
/// With a pair: its second map's dP is −λ·dp, and p leaves as P₁ − λ·P₂, the pair's weights
/// on V.
fn probs_grads_values(
    p: &mut [f32],
    ds: &mut [f32],
    valid: usize,
    (lse, delta): (f32, f32),
    scale: f32,
    mut pair: Option<PairRow>,
) {
    let n = p.len().min(ds.len());
    for c in 0..valid {
        let e = exp_nonpos(p[c] * scale - lse);
        let dp = ds[c];
        ds[c] = e * (dp - delta) * scale;
        p[c] = match &mut pair {
            None => e,
            Some(pr) => {
                let e2 = exp_nonpos(pr.p[c] * scale - pr.lse_delta.0);
                pr.ds[c] = e2 * (-pr.lambda * dp - pr.lse_delta.1) * scale;
                e - pr.lambda * e2
            }
        };
    }
    p[valid..n].fill(0.0);
    ds[valid..n].fill(0.0);
    if let Some(pr) = pair {
        pr.ds[valid..n].fill(0.0);
    }
}

/// Where an attention task's products take their B operands from: the task's packed operands
/// (`with_packed`, under bf16), or f32 rows.
#[derive(Clone, Copy)]
struct Src<'p, 'a> {
    packed: Option<&'p [PackedB<'a>]>,
    bf16: bool,
}

impl Src<'_, '_> {
    /// C (m × n, rows `c.1` apart; added to where `c.2`) (+)= A (m × k) · B: B at `at`
    /// (column, depth) of packed operand `i`, or else the f32 rows of `b` (k × n, contiguous
    /// columns), which are not read when the operands are packed.
    ///
    /// # Safety
    /// As for `small_gemm`'s C.
    unsafe fn product(
        self,
        i: usize,
        at: (usize, usize),
        (m, n, k): (usize, usize, usize),
        a: Mat,
        b: Mat,
        (c, c_rs, accumulate): (*mut f32, usize, bool),
    ) {
        // SAFETY: C's m rows of n columns at c_rs are the caller's alone, valid while this
        // runs (this fn's `# Safety`): exactly the values handed on.
        let dst = unsafe { SharedMut::from_raw(c, extent(m, n, c_rs, 1)) };
        let (d, out) = (
            Dims::new(m, n, k),
            SharedOut {
                dst,
                rs: c_rs,
                accumulate,
            },
        );
        match self.packed {
            // SAFETY: C is the caller's alone, as both products require (this fn's `# Safety`).
            Some(p) => unsafe { p[i].gemm(d, at, a, out) },
            None => {
                assert_eq!(b.cs, 1, "attention: B's columns must be contiguous");
                // SAFETY: as above; small_gemm bounds A and B itself.
                unsafe { small_gemm(d, a, b, out, self.bf16) }
            }
        }
    }
}

/// Head `h` of x (rows of `heads` × `w`) from row `row0` on, as a matrix of `w` columns.
fn head_rows(x: &[f32], row0: usize, heads: usize, h: usize, w: usize) -> Mat<'_> {
    Mat {
        data: &x[(row0 * heads + h) * w..],
        rs: heads * w,
        cs: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axpy;
    use crate::testutil::{check_grad, dot64, randn};

    /// Plain softmax attention with the whole score row materialised, as a reference.
    fn naive(q: &[f32], k: &[f32], v: &[f32], b: usize, t: usize, s: &AttnShape) -> Vec<f32> {
        let mut o = vec![0.0; b * t * s.nq * s.dv];
        for bi in 0..b {
            for j in 0..s.nq {
                for i in 0..t {
                    let qi = &q[((bi * t + i) * s.nq + j) * s.dk..][..s.dk];
                    let sc: Vec<f64> = (0..=i)
                        .map(|tt| {
                            let kt = &k[((bi * t + tt) * s.nk + s.k_head(j)) * s.dk..][..s.dk];
                            dot64(qi, kt) / (s.dk as f64).sqrt()
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
                    for (tt, x) in sc.iter().enumerate() {
                        let p = ((x - mx).exp() / z) as f32;
                        let vt = &v[((bi * t + tt) * s.nv + s.v_head(j)) * s.dv..][..s.dv];
                        axpy(&mut o[((bi * t + i) * s.nq + j) * s.dv..][..s.dv], p, vt);
                    }
                }
            }
        }
        o
    }

    fn shapes() -> Vec<AttnShape> {
        vec![
            // standard GQA: 4 query heads over 2 kv heads
            AttnShape {
                nq: 4,
                nk: 2,
                nv: 2,
                dk: 8,
                dv: 8,
                diff_pairs: false,
            },
            // diff_v1 with GQA: 2 diff heads (4 sub-heads) over 1 kv head of 2d
            AttnShape {
                nq: 4,
                nk: 2,
                nv: 1,
                dk: 6,
                dv: 12,
                diff_pairs: true,
            },
            // diff_v2-like pairs of query heads over one kv head, 32 wide (the `bench` heads)
            AttnShape {
                nq: 2,
                nk: 1,
                nv: 1,
                dk: 32,
                dv: 32,
                diff_pairs: false,
            },
            // diff_v2's `bench` layout: four query heads over each kv head, 32 wide
            AttnShape {
                nq: 8,
                nk: 2,
                nv: 2,
                dk: 32,
                dv: 32,
                diff_pairs: false,
            },
            // groups of three, which decoding takes head by head
            AttnShape {
                nq: 6,
                nk: 2,
                nv: 2,
                dk: 16,
                dv: 24,
                diff_pairs: false,
            },
            // wide values: a block of 64 columns and a ragged one of 36
            AttnShape {
                nq: 2,
                nk: 2,
                nv: 2,
                dk: 20,
                dv: 100,
                diff_pairs: false,
            },
        ]
    }

    /// The register epilogues (AVX-512) against the portable loops they replace, on the same
    /// tiles: a block of 22 rows across the diagonal (rows that see none, part and all of the
    /// tile), over two tiles so that the running max and sum carry over.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn register_softmax_matches_the_portable_passes() {
        use super::super::attention_scores::{probs_grads_row, scores_softmax};
        if !crate::gemm::cpu::avx512f() {
            eprintln!("skipped: no AVX-512F");
            return;
        }
        let (rows, dk, scale) = (22, 32, 0.3);
        let q = randn(rows * dk, 11, 2.0);
        let (mut m, mut l, mut c) = (
            [[f32::NEG_INFINITY; BQ]; 2],
            [[0f32; BQ]; 2],
            [[0f32; BQ]; 2],
        );
        for (tile, len) in [(0u64, BK), (1, 40)] {
            let kt = randn(dk * BK, 12 + tile, 2.0);
            let valid = |r: usize| (r * 3).saturating_sub(10).min(len);
            let mut p = [vec![0f32; rows * BK], vec![0f32; rows * BK]];
            // SAFETY: AVX-512F is present; p[0] holds rows × BK.
            unsafe {
                let st = Online {
                    m: &mut m[0],
                    l: &mut l[0],
                    corr: &mut c[0],
                };
                scores_softmax(
                    rows,
                    dk,
                    Mat::rows(&q, dk),
                    &kt,
                    scale,
                    valid,
                    &mut p[0],
                    st,
                );
                let s = SharedOut {
                    dst: SharedMut::new(&mut p[1]),
                    rs: BK,
                    accumulate: false,
                };
                let d = Dims::new(rows, BK, dk);
                small_gemm(d, Mat::rows(&q, dk), Mat::rows(&kt, BK), s, false);
            }
            let st = Online {
                m: &mut m[1],
                l: &mut l[1],
                corr: &mut c[1],
            };
            softmax_rows(&mut p[1], scale, valid, st);
            for r in 0..rows {
                let v = valid(r);
                let close = |a: f32, b: f32| a == b || (a - b).abs() <= 1e-6 * (1.0 + b.abs());
                assert!(
                    close(m[0][r], m[1][r]) && close(l[0][r], l[1][r]),
                    "row {r} m, l"
                );
                assert!(close(c[0][r], c[1][r]), "row {r} corr");
                for (x, y) in p[0][r * BK..r * BK + v].iter().zip(&p[1][r * BK..]) {
                    assert!(close(*x, *y), "row {r}: p {x} vs {y}");
                }
                assert!(p[0][r * BK + v..(r + 1) * BK].iter().all(|&x| x == 0.0));
            }
        }
        // the backward's P and dS, against its scalar loop
        let (s, dp) = (randn(BK, 13, 3.0), randn(BK, 14, 1.0));
        for valid in [0, 1, 17, 40, BK] {
            let (mut p, mut ds) = (s.clone(), dp.clone());
            // SAFETY: AVX-512F is present.
            unsafe { probs_grads_row(&mut p, &mut ds, valid, (0.7, -0.2), scale, None) };
            for c in 0..BK {
                let want_p = if c < valid {
                    exp_nonpos(s[c] * scale - 0.7)
                } else {
                    0.0
                };
                let want_ds = want_p * (dp[c] + 0.2) * scale;
                assert_eq!((p[c], ds[c]), (want_p, want_ds), "valid {valid} column {c}");
            }
            // a pair: the second map's dS from −λ·dP, and P₁ − λ·P₂ left in p
            let s2 = randn(BK, 15, 3.0);
            let mut got = [s.clone(), dp.clone(), s2.clone(), vec![9.0; BK]];
            let mut want = got.clone();
            fn pair<'a>(p: &'a mut [f32], ds: &'a mut [f32]) -> PairRow<'a> {
                PairRow {
                    p,
                    ds,
                    lse_delta: (0.4, 0.3),
                    lambda: 0.6,
                }
            }
            let [p, ds, p2, ds2] = &mut got;
            // SAFETY: AVX-512F is present.
            unsafe { probs_grads_row(p, ds, valid, (0.7, -0.2), scale, Some(pair(p2, ds2))) };
            let [p, ds, p2, ds2] = &mut want;
            let pair = Some(pair(p2, ds2));
            probs_grads_values(p, ds, valid, (0.7, -0.2), scale, pair);
            for i in [0, 1, 3] {
                for (x, y) in got[i].iter().zip(&want[i]) {
                    assert!(
                        (x - y).abs() <= 1e-6 * (1.0 + y.abs()),
                        "valid {valid}: {x} vs {y}"
                    );
                }
            }
            assert!(want[1][..valid].iter().all(|&x| x != 0.0));
        }
    }

    #[test]
    fn forward_matches_naive_softmax_across_tile_boundaries() {
        for s in shapes() {
            let (b, t) = (2, 150); // crosses BQ and BK boundaries
            let q = randn(b * t * s.nq * s.dk, 1, 1.0);
            let k = randn(b * t * s.nk * s.dk, 2, 1.0);
            let v = randn(b * t * s.nv * s.dv, 3, 1.0);
            let (mut o, mut lse) = (vec![0.0; b * t * s.nq * s.dv], vec![0.0; b * s.nq * t]);
            attention_forward(&mut o, &mut lse, &q, &k, &v, b, t, t, 0, &s, Precision::F32);
            let r = naive(&q, &k, &v, b, t, &s);
            let err = o
                .iter()
                .zip(&r)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-5, "{s:?}: max error {err}");
        }
    }

    #[test]
    fn offset_queries_match_the_tail_of_a_full_pass() {
        let s = shapes()[1];
        // queries 55..100: the first rows see none of the key tile starting at 64
        let (t, tail) = (100, 45);
        let q = randn(t * s.nq * s.dk, 1, 1.0);
        let k = randn(t * s.nk * s.dk, 2, 1.0);
        let v = randn(t * s.nv * s.dv, 3, 1.0);
        let (mut o, mut lse) = (vec![0.0; t * s.nq * s.dv], vec![0.0; s.nq * t]);
        attention_forward(&mut o, &mut lse, &q, &k, &v, 1, t, t, 0, &s, Precision::F32);
        let (mut ot, mut lt) = (vec![0.0; tail * s.nq * s.dv], vec![0.0; s.nq * tail]);
        let qt = &q[(t - tail) * s.nq * s.dk..];
        attention_forward(
            &mut ot,
            &mut lt,
            qt,
            &k,
            &v,
            1,
            tail,
            t,
            t - tail,
            &s,
            Precision::F32,
        );
        assert_eq!(&o[(t - tail) * s.nq * s.dv..], &ot[..]);
    }

    /// One query per sequence (decoding: `attention_decode`) against the naive softmax's row
    /// for that position: caches of one, a chunk, a chunk and one, and several chunks; a query
    /// that sees only a prefix of its cache; the log-sum-exp against the tile kernel's.
    #[test]
    fn one_query_matches_the_naive_softmax_and_the_tile_kernel() {
        for s in shapes() {
            for t in [1usize, 31, 32, 33, 70] {
                for visible in [t, t.div_ceil(2)] {
                    let b = 2;
                    let q = randn(b * t * s.nq * s.dk, 8, 1.0);
                    let k = randn(b * t * s.nk * s.dk, 9, 1.0);
                    let v = randn(b * t * s.nv * s.dv, 10, 1.0);
                    // each sequence's query at position visible − 1
                    let (qw, ow) = (s.nq * s.dk, s.nq * s.dv);
                    let q1: Vec<f32> = (0..b)
                        .flat_map(|bi| q[(bi * t + visible - 1) * qw..][..qw].to_vec())
                        .collect();
                    let (mut o, mut lse) = (vec![0.0; b * ow], vec![0.0; b * s.nq]);
                    attention_forward(
                        &mut o,
                        &mut lse,
                        &q1,
                        &k,
                        &v,
                        b,
                        1,
                        t,
                        visible - 1,
                        &s,
                        Precision::F32,
                    );
                    let want = naive(&q, &k, &v, b, t, &s);
                    let (mut o_t, mut lse_t) = (vec![0.0; b * t * ow], vec![0.0; b * s.nq * t]);
                    attention_forward(
                        &mut o_t,
                        &mut lse_t,
                        &q,
                        &k,
                        &v,
                        b,
                        t,
                        t,
                        0,
                        &s,
                        Precision::F32,
                    );
                    for bi in 0..b {
                        let row = &want[(bi * t + visible - 1) * ow..][..ow];
                        for (x, y) in o[bi * ow..(bi + 1) * ow].iter().zip(row) {
                            assert!(
                                (x - y).abs() < 1e-5,
                                "{s:?} t {t} visible {visible}: {x} vs {y}"
                            );
                        }
                        for j in 0..s.nq {
                            let (x, y) =
                                (lse[bi * s.nq + j], lse_t[(bi * s.nq + j) * t + visible - 1]);
                            assert!((x - y).abs() < 1e-5, "{s:?} t {t} lse: {x} vs {y}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences() {
        for s in shapes() {
            let (b, t) = (1, 70); // crosses a key tile (BK = 64)
            let q = randn(b * t * s.nq * s.dk, 4, 1.0);
            let k = randn(b * t * s.nk * s.dk, 5, 1.0);
            let v = randn(b * t * s.nv * s.dv, 6, 1.0);
            let r = randn(b * t * s.nq * s.dv, 7, 1.0);
            let fwd = |q: &[f32], k: &[f32], v: &[f32]| {
                let (mut o, mut lse) = (vec![0.0; b * t * s.nq * s.dv], vec![0.0; b * s.nq * t]);
                attention_forward(&mut o, &mut lse, q, k, v, b, t, t, 0, &s, Precision::F32);
                (o, lse)
            };
            let (o, lse) = fwd(&q, &k, &v);
            // stale values in the buffers must be overwritten, not added to
            let (mut dq, mut dk, mut dv) =
                (vec![5.0; q.len()], vec![-2.0; k.len()], vec![3.0; v.len()]);
            let mut delta = vec![0.0; b * t * s.nq];
            attention_delta(&mut delta, &r, &o, s.nq, s.dv);
            attention_backward(
                &mut dq,
                &mut dk,
                &mut dv,
                &r,
                &q,
                &k,
                &v,
                &delta,
                &lse,
                b,
                t,
                &s,
                None,
                Precision::F32,
            );
            check_grad("attention dq", &q, &dq, |q| dot64(&fwd(q, &k, &v).0, &r));
            check_grad("attention dk", &k, &dk, |k| dot64(&fwd(&q, k, &v).0, &r));
            check_grad("attention dv", &v, &dv, |v| dot64(&fwd(&q, &k, v).0, &r));
        }
    }

    /// With pairs (query heads 2g, 2g + 1 over value head g), the loss reads attn1 − λ·attn2:
    /// the shared value products give the gradients of that, with one λ for all rows
    /// (diff_v1's layout: each map its own key head) and one per token (diff_v2's: one key
    /// head for both), across a key tile.
    #[test]
    fn paired_backward_matches_finite_differences() {
        let v1 = AttnShape {
            nq: 4,
            nk: 4,
            nv: 2,
            dk: 6,
            dv: 12,
            diff_pairs: true,
        };
        // diff_v2's layout is standard GQA's: both maps of a pair read one key head
        let v2 = shapes()[0];
        // diff_v1 with GQA: two pairs over each value head
        let v1_gqa = AttnShape { nq: 8, ..v1 };
        let (b, t) = (2, 70);
        let per_token: Vec<f32> = randn(b * t * 2, 9, 1.0)
            .iter()
            .map(|x| 0.5 + 0.3 * x.tanh())
            .collect();
        let cases = [
            (v1, Lambda::Layer(0.7)),
            (v1_gqa, Lambda::Layer(0.4)),
            (v2, Lambda::PerToken(&per_token)),
        ];
        for (s, lambda) in cases {
            let q = randn(b * t * s.nq * s.dk, 4, 1.0);
            let k = randn(b * t * s.nk * s.dk, 5, 1.0);
            let v = randn(b * t * s.nv * s.dv, 6, 1.0);
            let r = randn(b * t * s.nq / 2 * s.dv, 7, 1.0);
            let fwd = |q: &[f32], k: &[f32], v: &[f32]| {
                let (mut o, mut lse) = (vec![0.0; b * t * s.nq * s.dv], vec![0.0; b * s.nq * t]);
                attention_forward(&mut o, &mut lse, q, k, v, b, t, t, 0, &s, Precision::F32);
                (o, lse)
            };
            // L = Σ r · (attn1 − λ·attn2), so dO of pair g is (r, −λ·r): the backward reads r
            let mut dout = vec![0.0; b * t * s.nq * s.dv];
            for (n, row) in dout.chunks_mut(2 * s.dv).enumerate() {
                let lam = lambda.at(n);
                let rg = &r[n * s.dv..(n + 1) * s.dv];
                row[..s.dv].copy_from_slice(rg);
                row[s.dv..]
                    .iter_mut()
                    .zip(rg)
                    .for_each(|(d, &x)| *d = -lam * x);
            }
            let loss = |o: &[f32]| dot64(o, &dout);
            let (o, lse) = fwd(&q, &k, &v);
            let (mut dq, mut dk, mut dv) =
                (vec![5.0; q.len()], vec![-2.0; k.len()], vec![3.0; v.len()]);
            let mut delta = vec![0.0; b * t * s.nq];
            attention_delta(&mut delta, &dout, &o, s.nq, s.dv);
            attention_backward(
                &mut dq,
                &mut dk,
                &mut dv,
                &r,
                &q,
                &k,
                &v,
                &delta,
                &lse,
                b,
                t,
                &s,
                Some(lambda),
                Precision::F32,
            );
            check_grad("paired dq", &q, &dq, |q| loss(&fwd(q, &k, &v).0));
            check_grad("paired dk", &k, &dk, |k| loss(&fwd(&q, k, &v).0));
            check_grad("paired dv", &v, &dv, |v| loss(&fwd(&q, &k, v).0));
        }
    }
}

//! Attention for one new query per sequence: a decoding step over the KV cache.
//!
//! The tile kernel (attention.rs) parallelises over key heads and streams each head's cached
//! rows as a strided column, transposed into a tile first. With one query there is nothing to
//! reuse a tile for, so here the cached positions are cut into chunks instead
//! (flash-decoding): a task reads its chunk's key and value rows for every head, in memory
//! order (on AMD Zen 5 four rows at a time), keeps a partial softmax (max, sum,
//! weighted values) per head, and the partials are merged at the end. The chunks do not
//! depend on the thread count, so neither do the results.
//!
//! The cache holds f32 or bf16 keys and values (`Elem`, `--kv-cache bf16`): bf16 rows are
//! widened to f32 as they are loaded (a zero-extension and a shift, `load16` on AVX-512,
//! `load8` on AVX2, `load4` on NEON), and everything after the load runs in f32 either way. A
//! q8_0 cache's blocks (`KvElem`, `--kv-cache q8_0`) are widened likewise on x86-64 where each
//! head is whole blocks (a sign extension, a conversion and the block's scale: `Lanes16` and
//! `Lanes8` for `&[Q8Block]`, which `dot_tree`, `dot_tree8` and the weighted rows read like
//! values); elsewhere each row is widened first into a row of f32 at the end of the task's
//! partials, which stays in L1, and read from there.

use super::attention_parts::AttnShape;
use super::gemm::cpu::Isa;
#[cfg(target_arch = "x86_64")]
use super::Lanes16;
#[cfg(target_arch = "x86_64")]
use super::Lanes8;
use super::{axpy, exp_nonpos, exp_sum, scale_max, KvElem, Row, SharedMut};
use rayon::prelude::*;

/// Cached positions per task for a sequence that sees `visible` of them: about a sixteenth,
/// in multiples of 32 from 128 to 256 — long runs for the hardware prefetchers (a task reads
/// its rows in memory order), enough tasks for the threads. It depends on the sequence alone,
/// so a sequence's results do not depend on the thread count or on the others in a batch.
/// (From 32: a batch of 16 at depths of 100–200, as a server decodes, read its cache at
/// 34–36 GB/s in four to six tasks a sequence, against 40–44 in one or two; a lone short
/// sequence, one task now, decodes as fast.)
fn chunk_rows(visible: usize) -> usize {
    (visible / 16).next_multiple_of(32).clamp(128, 256)
}

thread_local! {
    static PARTIALS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// each run of query heads' key and value offsets (`Heads`)
    static OFFSETS: std::cell::Cell<Vec<usize>> = const { std::cell::Cell::new(Vec::new()) };
}

/// o (B, NQ, DV) and lse (B, NQ) for one query per sequence, q (B, NQ, DK), that sees the
/// first `visible` of the sequence's `tkv` cached rows in k (B, Tkv, NK, DK) and
/// v (B, Tkv, NV, DV); `attention_forward`, its caller, checked these lengths. Same results as
/// the tile kernel, up to rounding. The loops of the best vector unit the CPU has (AVX-512F,
/// else AVX2 with FMA; NEON on ARM64: simd_neon.rs), else the portable ones.
// attention_forward's decoding branch: the same operands, passed on as they came
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_decode<C: KvElem>(
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[C],
    v: &[C],
    b: usize,
    tkv: usize,
    visible: usize,
    s: &AttnShape,
) {
    attention_decode_on(Isa::detect(), o, lse, q, k, v, b, tkv, visible, s)
}

/// `attention_decode` on the loops of `isa` (which the CPU must have) or, with `None`, the
/// portable ones: tests compare them.
// attention_decode's operands and the path
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_decode_on<C: KvElem>(
    isa: Option<Isa>,
    o: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[C],
    v: &[C],
    b: usize,
    tkv: usize,
    visible: usize,
    s: &AttnShape,
) {
    assert!(isa.is_none_or(Isa::available));
    let AttnShape { nq, dk, dv, .. } = *s;
    assert!(visible >= 1 && visible <= tkv);
    let chunk = chunk_rows(visible);
    let chunks = visible.div_ceil(chunk);
    // Per (sequence, chunk, head): the values weighted by exp(score − max), the chunk's max
    // score and its sum of exp(score − max), then room for the chunk's scores; per task,
    // after its heads' partials, room to widen one cached row (none for f32 and bf16).
    let part = dv + 2 + chunk;
    let room = C::room(s.nk * dk).max(C::room(s.nv * dv));
    let stride = nq * part + room;
    with_heads(s, |heads| {
        super::with_thread_buffer(&PARTIALS, |buf| {
            let partials = SharedMut::new(super::ensure(buf, b * chunks * stride));
            let run = |task: usize| {
                let (bi, ci) = (task / chunks, task % chunks);
                let t0 = ci * chunk;
                let len = chunk.min(visible - t0);
                // SAFETY: task (bi, ci) alone writes its partials and its row's room.
                let out = unsafe { partials.slice(task * stride, stride) };
                let (q, row0) = (&q[bi * nq * dk..], bi * tkv + t0);
                let rows = Rows {
                    k,
                    v,
                    row0,
                    len,
                    part,
                };
                chunk_partials(isa, out, q, &rows, s, heads);
            };
            if chunks * b > 1 {
                (0..b * chunks).into_par_iter().for_each(run);
            } else {
                run(0);
            }
            for bi in 0..b {
                for j in 0..nq {
                    let at = |ci: usize| (bi * chunks + ci) * stride + j * part;
                    let m = (0..chunks).fold(f32::NEG_INFINITY, |m, ci| m.max(buf[at(ci) + dv]));
                    // Each chunk rescaled from its own max to m, then everything divided by the sum.
                    let oj = &mut o[(bi * nq + j) * dv..][..dv];
                    oj.fill(0.0);
                    let mut l = 0.0;
                    for ci in 0..chunks {
                        let e = exp_nonpos(buf[at(ci) + dv] - m);
                        l += buf[at(ci) + dv + 1] * e;
                        axpy(oj, e, &buf[at(ci)..at(ci) + dv]);
                    }
                    oj.iter_mut().for_each(|x| *x /= l);
                    lse[bi * nq + j] = m + l.ln();
                }
            }
        })
    });
}

/// The largest of 4, 2 and 1 such that each aligned run of that many query heads reads one
/// key head and one value head (diff_v2 at `bench`: 4; standard GQA: its group size).
fn query_group(s: &AttnShape) -> usize {
    let shares = |g: usize| {
        s.nq.is_multiple_of(g)
            && (0..s.nq).all(|j| {
                let j0 = j - j % g;
                s.k_head(j) == s.k_head(j0) && s.v_head(j) == s.v_head(j0)
            })
    };
    [4, 2].into_iter().find(|&g| shares(g)).unwrap_or(1)
}

/// Where each run of `group` query heads finds its key and its value head in a cached row,
/// worked out once per call (`AttnShape::k_head` divides, and the loops ask per row).
struct Heads<'a> {
    group: usize,
    /// per run of query heads, the offset of its key head's dk values in a key row
    k_at: &'a [usize],
    /// and of its value head's dv values in a value row
    v_at: &'a [usize],
}

/// f(the `Heads` of shape s), their offsets in a reused thread buffer (a decoding step
/// allocates nothing).
fn with_heads<R>(s: &AttnShape, f: impl FnOnce(&Heads) -> R) -> R {
    let group = query_group(s);
    let runs = s.nq / group;
    super::with_thread_buffer(&OFFSETS, |buf| {
        let (k_at, v_at) = super::ensure(buf, 2 * runs).split_at_mut(runs);
        for (g, (k, v)) in k_at.iter_mut().zip(v_at.iter_mut()).enumerate() {
            (*k, *v) = (s.k_head(g * group) * s.dk, s.v_head(g * group) * s.dv);
        }
        f(&Heads { group, k_at, v_at })
    })
}

/// A task's chunk of the cache: `len` rows from `row0` of k and v, and the width of each
/// head's partial (dv + 2 + the chunk length).
struct Rows<'a, C> {
    k: &'a [C],
    v: &'a [C],
    row0: usize,
    len: usize,
    part: usize,
}

/// `$f::<Q, N, _>` for a run of Q = `$group` query heads (4, 2 or 1) over heads `$width`
/// wide, N = `$width` / 16 where that is 2, 4 or 8 (the loops over a head unroll, every lane
/// on), else 0 (any width, masked).
macro_rules! shaped {
    ($f:ident, $group:expr, $width:expr) => {
        match ($group, $width) {
            (4, 32) => $f::<4, 2, _>,
            (4, 64) => $f::<4, 4, _>,
            (4, 128) => $f::<4, 8, _>,
            (4, _) => $f::<4, 0, _>,
            (2, 32) => $f::<2, 2, _>,
            (2, 64) => $f::<2, 4, _>,
            (2, 128) => $f::<2, 8, _>,
            (2, _) => $f::<2, 0, _>,
            (_, 32) => $f::<1, 2, _>,
            (_, 64) => $f::<1, 4, _>,
            (_, 128) => $f::<1, 8, _>,
            _ => $f::<1, 0, _>,
        }
    };
}

/// A task's partials, out (NQ, r.part) and then room to widen a row, each phase walking the
/// chunk's cached rows in memory order. On AVX-512 where it pays (`four_rows_pay`: AMD Zen 5)
/// it takes them four at a time, every head over the four before the next four (`Fours`):
/// sixteen chains of FMAs in flight and the four rows' scores reduced together, each head's
/// partial loaded and stored once for the four rows. A block read head by head is no longer one
/// stream for the hardware prefetchers (alone, it decoded 1.3× slower from memory, though 1.1×
/// faster from L2), so the task asks for the next rows itself (`ROWS_AHEAD`). Elsewhere, one
/// row at a time, every head over one row before the next, the rows' order left to the hardware
/// prefetchers. A GQA group's query heads (diff_v2's) go together (`Heads`), each cached row
/// loaded once for them.
fn chunk_partials<C: KvElem>(
    isa: Option<Isa>,
    out: &mut [f32],
    q: &[f32],
    r: &Rows<C>,
    s: &AttnShape,
    heads: &Heads,
) {
    let AttnShape { dk, dv, .. } = *s;
    let part = r.part;
    let scale = 1.0 / (dk as f32).sqrt();
    let (out, room) = out.split_at_mut(s.nq * part);
    // 1. every head's scores, into out[j][dv + 2..]
    shaped!(scores_rows, heads.group, dk)(isa, out, room, q, r, s, heads);
    // 2. each head's max m and Σ exp(score − m), the scores turned into those exps
    for o in out.chunks_exact_mut(part) {
        let (stats, sc) = o[dv..].split_at_mut(2);
        let sc = &mut sc[..r.len];
        let m = scale_max(sc, scale, sc.len());
        stats[0] = m;
        stats[1] = exp_sum(sc, m);
    }
    // 3. every head's values weighted by its exps, into out[j][..dv]
    out.chunks_exact_mut(part).for_each(|o| o[..dv].fill(0.0));
    shaped!(values_rows, heads.group, dv)(isa, out, room, r, s, heads);
}

/// How many rows past the block of four it reads a task asks for again with each block
/// (into L1, PREFETCHT0): read a head at a time across four rows, a block of rows is no longer
/// one stream in memory order for the hardware prefetchers to follow. Asked for again with each
/// block, a row is requested four times before it is read; once, at the farthest distance,
/// decoded more slowly.
#[cfg(target_arch = "x86_64")]
const ROWS_AHEAD: usize = 16;

/// Whether the AVX-512 walk takes its rows four at a time on this CPU: on AMD Zen 5 (family
/// 0x1A) and later, where it was measured faster (a batch of 16 at depths of 100–200: the
/// attention up to 1.4× the one-row walk's speed over f32 and q8_0 caches, level over bf16);
/// not on Zen 4 (0x19), where its attention ran 1.5–2.2× slower at depth 8,192 and its batch of
/// 16 decoded 1.1–1.2× slower, with or without the rows asked for ahead (benchmarks-log.md);
/// other AVX-512 CPUs are unmeasured and take the one-row walk. Both walks give the same bits
/// (`four_rows_at_a_time_give_one_row_at_a_time_bits`).
#[cfg(target_arch = "x86_64")]
fn four_rows_pay() -> bool {
    #[cfg(test)]
    match tests::WALK.load(std::sync::atomic::Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ => {}
    }
    super::gemm::cpu::amd_family().is_some_and(|f| f >= 0x1A)
}

/// A task's walk over its chunk's rows of k or v four at a time: on AVX-512 where it pays
/// (`four_rows_pay`), for heads of 16·N values read where they lie (f32 and bf16 values, q8_0
/// blocks), asking for the rows ahead as it goes (`ROWS_AHEAD`); elsewhere, and where a q8_0
/// row is widened into the task's room first, one row at a time (`four` says None). (On AVX2
/// four rows at a time, head by head, decoded a bf16 cache 1.4× slower than one row at a time,
/// with or without the requests ahead: benchmarks-log.md.)
#[cfg(target_arch = "x86_64")]
struct Fours<'a, C> {
    src: &'a [C],
    isa: Option<Isa>,
    /// values a row, and whether its heads are read as blocks (`whole_blocks`)
    width: usize,
    blocks: bool,
    /// the chunk's first row, and its length (0 when the walk is off)
    row0: usize,
    len: usize,
}

#[cfg(target_arch = "x86_64")]
impl<'a, C: KvElem> Fours<'a, C> {
    fn new<const N: usize>(
        isa: Option<Isa>,
        src: &'a [C],
        r: &Rows<C>,
        (width, blocks): (usize, bool),
    ) -> Self {
        let on =
            isa == Some(Isa::Avx512) && four_rows_pay() && N > 0 && (blocks || C::room(width) == 0);
        let f = Fours {
            src,
            isa,
            width,
            blocks,
            row0: r.row0,
            len: if on { r.len } else { 0 },
        };
        f.ask(0..ROWS_AHEAD);
        f
    }

    /// Rows t..t + 4, after asking for the `ROWS_AHEAD` past them; None where the walk is off
    /// or fewer than four rows are left.
    #[inline(always)]
    fn four(&self, t: usize) -> Option<[Row<'a, C::Elem>; 4]> {
        if t + 4 > self.len {
            return None;
        }
        self.ask(t + 4..t + 4 + ROWS_AHEAD);
        // (slicing checks that the rows are in the cache)
        let at = |i| {
            C::row(
                self.isa,
                self.src,
                self.row0 + t + i,
                self.width,
                self.blocks,
                &mut [],
            )
        };
        Some(std::array::from_fn(at))
    }

    /// Every line of rows `rows` inside the chunk (a hint: it reads nothing).
    fn ask(&self, rows: std::ops::Range<usize>) {
        let row_bytes = C::entries(self.width) * std::mem::size_of::<C>();
        let first = self
            .src
            .as_ptr()
            .cast::<u8>()
            .wrapping_add(self.row0 * row_bytes);
        let (from, to) = (rows.start.min(self.len), rows.end.min(self.len));
        for b in (from * row_bytes..to * row_bytes).step_by(64) {
            super::prefetch(first.wrapping_add(b).cast(), 1);
        }
    }
}

/// `$f` of the head at `$at` (`$w` values) of each of the rows `$rows` (an array: four rows
/// or one), as values or as blocks: `$f([&[E]; R])` or `$f([&[Q8Block]; R])`, the rows all of
/// one kind.
#[cfg(target_arch = "x86_64")]
macro_rules! shared {
    ($rows:expr, $at:expr, $w:expr, |$h:ident| $f:expr) => {
        match $rows[0] {
            Row::Values(_) => {
                let $h = $rows.map(|row| match row {
                    Row::Values(v) => &v[$at..$at + $w],
                    Row::Blocks(_) => unreachable!("a cache's rows are all of one kind"),
                });
                $f
            }
            Row::Blocks(_) => {
                let $h = $rows.map(|row| match row {
                    Row::Blocks(b) => &b[$at / 32..($at + $w) / 32],
                    Row::Values(_) => unreachable!("a cache's rows are all of one kind"),
                });
                $f
            }
        }
    };
}

/// Phase 1: out[j][dv + 2 + t] = q_j · k_t over the chunk's rows t, for the query heads in
/// runs of Q that read one key head. Out of line, each (Q, N) compiled on its own (inlined
/// together into their caller, the block kernels before these shared one register
/// allocation, and standard's single heads decoded 4–5% slower).
#[inline(never)]
fn scores_rows<const Q: usize, const N: usize, C: KvElem>(
    isa: Option<Isa>,
    out: &mut [f32],
    room: &mut [f32],
    q: &[f32],
    r: &Rows<C>,
    s: &AttnShape,
    heads: &Heads,
) {
    let (dk, kw, part) = (s.dk, s.nk * s.dk, r.part);
    assert!(N == 0 || dk == 16 * N);
    assert!(out.len() >= s.nq * part && q.len() >= s.nq * dk);
    assert!(heads.k_at.iter().all(|&a| a + dk <= kw));
    let blocks = whole_blocks(isa, dk);
    #[cfg(target_arch = "x86_64")]
    let fours = Fours::new::<N>(isa, r.k, r, (kw, blocks));
    let mut t = 0;
    while t < r.len {
        #[cfg(target_arch = "x86_64")]
        if let Some(rows) = fours.four(t) {
            for (g, &at) in heads.k_at.iter().enumerate() {
                let qs = &q[g * Q * dk..(g + 1) * Q * dk];
                // SAFETY: AVX-512F (`Fours`); each row's head holds dk = 16·N values (asserted),
                // whole blocks where they are blocks, qs the Q queries' dk each.
                let dots = unsafe {
                    shared!(rows, at, dk, |ks| super::dot_tree::<4, Q, N, _>(
                        qs, ks, false
                    ))
                };
                for (i, d) in dots.into_iter().enumerate() {
                    store_scores(out, d, g * Q, part, s.dv + 2 + t + i);
                }
            }
            t += 4;
            continue;
        }
        // (slicing checks that the rows are in the cache)
        let row = C::row(isa, r.k, r.row0 + t, kw, blocks, room);
        for (g, &at) in heads.k_at.iter().enumerate() {
            let j0 = g * Q;
            let qs = &q[j0 * dk..(j0 + Q) * dk];
            // a head holds dk values (whole blocks, where the row is blocks: AVX-512 alone) and
            // qs the Q queries' dk each; where N > 0, dk = 16·N (asserted)
            let dots = match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX-512F (`attention_decode_on` checked); lengths above,
                // blocks whole heads (`whole_blocks`).
                Some(Isa::Avx512) => unsafe {
                    shared!([row], at, dk, |k| super::dot_tree::<1, Q, N, _>(
                        qs, k, false
                    ))[0]
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX2 and FMA (checked likewise); lengths above, blocks
                // whole heads.
                Some(Isa::Avx2) => unsafe {
                    shared!([row], at, dk, |k| super::dot_tree8::<Q, N, _>(qs, k[0]))
                },
                #[cfg(target_arch = "aarch64")]
                // SAFETY: NEON, which every ARM64 CPU has; lengths asserted inside.
                Some(Isa::Neon) => unsafe {
                    super::simd_neon::dot_rows::<Q, N, C::Elem>(qs, values(row, at, dk))
                },
                _ => {
                    let k = values(row, at, dk);
                    std::array::from_fn::<f32, Q, _>(|i| {
                        super::dot_elems(&qs[i * dk..(i + 1) * dk], k)
                    })
                }
            };
            store_scores(out, dots, j0, part, s.dv + 2 + t);
        }
        t += 1;
    }
}

/// Query head j0 + i's score into its partial's column `at`, for each of the Q dots.
#[inline(always)]
fn store_scores<const Q: usize>(
    out: &mut [f32],
    dots: [f32; Q],
    j0: usize,
    part: usize,
    at: usize,
) {
    for (i, x) in dots.into_iter().enumerate() {
        out[(j0 + i) * part + at] = x;
    }
}

/// The head at `at` (`w` values) of a row read as values: every row on NEON and the portable
/// loops (blocks are handed out on x86-64 alone, `whole_blocks`).
fn values<E>(row: Row<'_, E>, at: usize, w: usize) -> &'_ [E] {
    match row {
        Row::Values(row) => &row[at..at + w],
        Row::Blocks(_) => unreachable!("blocks are read on x86-64 alone"),
    }
}

/// Whether q8_0 rows are read as blocks, widened as they are loaded: on AVX-512 and AVX2,
/// where each head of `width` values is whole blocks (else, and on NEON and the portable
/// loops, a row is widened into the task's room first).
fn whole_blocks(isa: Option<Isa>, width: usize) -> bool {
    matches!(isa, Some(Isa::Avx512 | Isa::Avx2)) && width.is_multiple_of(32)
}

/// Phase 3: out[j][..dv] += Σ_t p_j[t] · v_t over the chunk's rows t (p_j: the exps in
/// out[j][dv + 2..]), for the query heads in runs of Q that read one value head. The sums stay
/// in `out` (a few KiB, in L1) between rows.
#[inline(never)]
fn values_rows<const Q: usize, const N: usize, C: KvElem>(
    isa: Option<Isa>,
    out: &mut [f32],
    room: &mut [f32],
    r: &Rows<C>,
    s: &AttnShape,
    heads: &Heads,
) {
    let (dv, vw, part) = (s.dv, s.nv * s.dv, r.part);
    assert!(N == 0 || dv == 16 * N);
    assert!(out.len() >= s.nq * part);
    assert!(heads.v_at.iter().all(|&a| a + dv <= vw));
    let blocks = whole_blocks(isa, dv);
    #[cfg(target_arch = "x86_64")]
    let fours = Fours::new::<N>(isa, r.v, r, (vw, blocks));
    let mut t = 0;
    while t < r.len {
        #[cfg(target_arch = "x86_64")]
        if let Some(rows) = fours.four(t) {
            for (g, &at) in heads.v_at.iter().enumerate() {
                let heads = &mut out[g * Q * part..(g + 1) * Q * part];
                // SAFETY: AVX-512F (`Fours`); heads holds Q partials of part ≥ dv values,
                // dv + 2 + t + 3 < part; each row's head holds dv = 16·N values (asserted),
                // whole blocks where they are blocks.
                unsafe {
                    shared!(rows, at, dv, |vs| weighted_row_avx512::<4, Q, N, _>(
                        heads,
                        part,
                        dv + 2 + t,
                        vs
                    ))
                };
            }
            t += 4;
            continue;
        }
        let row = C::row(isa, r.v, r.row0 + t, vw, blocks, room);
        for (g, &at) in heads.v_at.iter().enumerate() {
            let j0 = g * Q;
            let heads = &mut out[j0 * part..(j0 + Q) * part];
            // heads holds Q partials of dv + 2 + the chunk's length, t < that length, and a
            // head dv values (whole blocks, where the row is blocks: AVX-512 alone); where
            // N > 0, dv = 16·N (asserted)
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX-512F (`attention_decode_on` checked); lengths above,
                // blocks whole heads (`whole_blocks`).
                Some(Isa::Avx512) => unsafe {
                    shared!([row], at, dv, |v| weighted_row_avx512::<1, Q, N, _>(
                        heads,
                        part,
                        dv + 2 + t,
                        v
                    ))
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX2 and FMA (checked likewise); lengths above, blocks
                // whole heads.
                Some(Isa::Avx2) => unsafe {
                    shared!([row], at, dv, |v| weighted_row_avx2::<Q, N, _>(
                        heads,
                        part,
                        dv + 2 + t,
                        v[0]
                    ))
                },
                #[cfg(target_arch = "aarch64")]
                // SAFETY: as above.
                Some(Isa::Neon) => unsafe {
                    super::simd_neon::weighted_row::<Q, N, C::Elem>(
                        heads,
                        part,
                        dv + 2 + t,
                        values(row, at, dv),
                    )
                },
                _ => {
                    let v = values(row, at, dv);
                    for o in heads.chunks_exact_mut(part) {
                        let p = o[dv + 2 + t];
                        super::axpy_elems(&mut o[..dv], p, v);
                    }
                }
            }
        }
        t += 1;
    }
}

/// heads[i·part..][..dv] += Σ_r heads[i·part + at + r] · v_r for the Q partials in `heads` and
/// the R rows `vs` (dv values each: in place, or q8_0 blocks widened as they are loaded,
/// `Lanes16`), rows in order: each block of a row loaded once for all the partials, each
/// partial's block loaded and stored once for all the rows (the same FMAs, in the same order,
/// as R rows one at a time).
///
/// # Safety
/// AVX-512F; heads holds Q partials of `part` ≥ dv values, at + R ≤ part; where N > 0,
/// each v has 16·N values; blocks are whole (`Lanes16::load`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn weighted_row_avx512<const R: usize, const Q: usize, const N: usize, V: Lanes16>(
    heads: &mut [f32],
    part: usize,
    at: usize,
    vs: [V; R],
) {
    use std::arch::x86_64::*;
    let dv = if N > 0 { 16 * N } else { vs[0].len() };
    let p: [[__m512; R]; Q] =
        std::array::from_fn(|i| std::array::from_fn(|r| _mm512_set1_ps(heads[i * part + at + r])));
    for c in (0..dv).step_by(16) {
        let m = super::lane_mask(dv - c);
        // SAFETY: the loads and stores are masked to the dv − c values left of each v and of
        // each partial's first dv.
        unsafe {
            let x: [__m512; R] = std::array::from_fn(|r| vs[r].load(c, dv - c));
            for (i, p) in p.iter().enumerate() {
                let a = heads.as_mut_ptr().add(i * part + c);
                let mut sum = _mm512_maskz_loadu_ps(m, a);
                for (p, x) in p.iter().zip(x) {
                    sum = _mm512_fmadd_ps(*p, x, sum);
                }
                _mm512_mask_storeu_ps(a, m, sum);
            }
        }
    }
}

/// `weighted_row_avx512` on AVX2, one row: eight lanes at a time (`Lanes8`: values, or q8_0
/// blocks widened as they are loaded), a ragged tail of fewer than eight values one at a time.
///
/// # Safety
/// AVX2 and FMA; heads holds Q partials of `part` ≥ dv values, at < part; where N > 0,
/// v has 16·N values; blocks are whole (`Lanes8::load`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn weighted_row_avx2<const Q: usize, const N: usize, V: Lanes8>(
    heads: &mut [f32],
    part: usize,
    at: usize,
    v: V,
) {
    use std::arch::x86_64::*;
    let dv = if N > 0 { 16 * N } else { v.len() };
    let full = dv / 8 * 8;
    let p: [__m256; Q] = std::array::from_fn(|i| _mm256_set1_ps(heads[i * part + at]));
    // (eights counted, not stepped through: with N > 0 the loop unrolls)
    for c in (0..full / 8).map(|e| 8 * e) {
        // SAFETY: c + 8 ≤ dv values of v and of each partial's first dv.
        unsafe {
            let x = v.load(c);
            for (i, p) in p.iter().enumerate() {
                let a = heads.as_mut_ptr().add(i * part + c);
                _mm256_storeu_ps(a, _mm256_fmadd_ps(*p, x, _mm256_loadu_ps(a)));
            }
        }
    }
    for o in heads.chunks_exact_mut(part).take(Q) {
        let p = o[at];
        for (c, o) in o[full..dv].iter_mut().enumerate() {
            *o = p.mul_add(v.at(full + c), *o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Q8Block;
    use half::bf16;

    /// The AVX-512 walk a test asks for: 0 the CPU's (`four_rows_pay`), 1 four rows at a time,
    /// 2 one row at a time. Both give the same bits, so another test that runs meanwhile gets
    /// the results it would get either way.
    #[cfg(target_arch = "x86_64")]
    pub(super) static WALK: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

    /// x's rows of `width` as C's entries, and the f32 values they stand for.
    fn cached<C: KvElem>(x: &[f32], width: usize) -> (Vec<C>, Vec<f32>) {
        let rows = x.len() / width;
        let mut c = vec![C::default(); rows * C::entries(width)];
        C::store(&mut c, x, width);
        let mut f = vec![0f32; x.len()];
        C::widen(None, &c, rows, width, &mut f);
        (c, f)
    }

    /// o and lse of one decoding step over all `tkv` cached rows of k and v, on `isa`'s loops.
    fn run_c<C: KvElem>(
        isa: Option<Isa>,
        (q, k, v): (&[f32], &[C], &[C]),
        (b, tkv, s): (usize, usize, &AttnShape),
    ) -> (Vec<f32>, Vec<f32>) {
        let (mut o, mut lse) = (vec![0f32; b * s.nq * s.dv], vec![0f32; b * s.nq]);
        attention_decode_on(isa, &mut o, &mut lse, q, k, v, b, tkv, tkv, s);
        (o, lse)
    }

    /// A whole decoding step gives the same bits with the AVX-512 rows taken four at a time as
    /// one at a time, whichever walk this CPU would pick: f32, bf16 and q8_0 caches, GQA groups
    /// of 4 and 1, one chunk whose last row is left over past its fours (77 cached) and chunks
    /// of 128 rows with a shorter last one (600 cached: 4 × 128 and 88).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn both_avx512_walks_decode_the_same_bits() {
        use std::sync::atomic::Ordering::Relaxed;
        if !Isa::Avx512.available() {
            return;
        }
        let mut seed = 5u32;
        for (tkv, nq, nk, dk) in [(77, 8, 2, 64), (600, 4, 4, 32), (600, 8, 8, 128)] {
            let s = AttnShape {
                nq,
                nk,
                nv: nk,
                dk,
                dv: dk,
                diff_pairs: false,
            };
            let b = 2;
            let q = crate::lcg_values(b * nq * dk, &mut seed, 1.0);
            let (kx, vx) = (
                crate::lcg_values(b * tkv * nk * dk, &mut seed, 2.0),
                crate::lcg_values(b * tkv * nk * dk, &mut seed, 2.0),
            );
            fn walked<C: KvElem>(x: &[f32], y: &[f32], q: &[f32], s: &AttnShape, b: usize) {
                let (w, tkv) = (s.nk * s.dk, x.len() / (b * s.nk * s.dk));
                let (k, v) = (cached::<C>(x, w).0, cached::<C>(y, w).0);
                let run = |walk: u8| {
                    WALK.store(walk, Relaxed);
                    let (o, lse) = run_c(Some(Isa::Avx512), (q, &k, &v), (b, tkv, s));
                    WALK.store(0, Relaxed);
                    o.iter()
                        .chain(&lse)
                        .map(|x| x.to_bits())
                        .collect::<Vec<_>>()
                };
                let (fours, ones) = (run(1), run(2));
                assert!(fours.iter().any(|&x| x != 0), "{s:?}: nothing computed");
                assert_eq!(fours, ones, "{s:?}: the walks differ");
            }
            walked::<f32>(&kx, &vx, &q, &s, b);
            walked::<bf16>(&kx, &vx, &q, &s, b);
            walked::<Q8Block>(&kx, &vx, &q, &s, b);
        }
    }

    /// Four cached rows at a time (`dot_tree::<4, ..>` with `sum_lanes_tree4`,
    /// `weighted_row_avx512::<4, ..>`) give each row's bits as one row at a time: f32, bf16
    /// and q8_0 rows, one to four queries, heads of 32, 64 and 128 values, sums of mixed
    /// magnitudes (where a different order of additions would show).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn four_rows_at_a_time_give_one_row_at_a_time_bits() {
        if !Isa::Avx512.available() {
            return;
        }
        fn check<const Q: usize, const N: usize>(seed: &mut u32) {
            let w = 16 * N;
            let mut xs = crate::lcg_values(Q * w, seed, 1.0);
            xs.iter_mut().step_by(7).for_each(|x| *x *= 1e4);
            let rows: Vec<Vec<f32>> = (0..4).map(|_| crate::lcg_values(w, seed, 3.0)).collect();
            let b16: Vec<Vec<bf16>> = rows
                .iter()
                .map(|r| r.iter().map(|&x| bf16::from_f32(x)).collect())
                .collect();
            let q8: Vec<Vec<Q8Block>> = rows
                .iter()
                .map(|r| r.chunks(32).map(Q8Block::quantize).collect())
                .collect();
            let part = w + 2 + 4;
            let mut heads = crate::lcg_values(Q * part, seed, 1.0);
            fn both<const Q: usize, const N: usize, W: Lanes16>(
                xs: &[f32],
                ws: [W; 4],
                heads: &[f32],
                part: usize,
            ) {
                let w = 16 * N;
                // SAFETY: AVX-512F (checked); every row holds w = 16·N values, xs Q times w,
                // heads Q partials of part = w + 6 values.
                unsafe {
                    let four = super::super::dot_tree::<4, Q, N, _>(xs, ws, false);
                    for (r, f) in four.iter().enumerate() {
                        let [one] = super::super::dot_tree::<1, Q, N, _>(xs, [ws[r]], false);
                        let bits = |d: &[f32; Q]| d.map(f32::to_bits);
                        assert_eq!(bits(f), bits(&one), "row {r}, Q {Q}, N {N}");
                    }
                    let (mut a, mut b) = (heads.to_vec(), heads.to_vec());
                    weighted_row_avx512::<4, Q, N, _>(&mut a, part, w + 2, ws);
                    for (r, v) in ws.into_iter().enumerate() {
                        weighted_row_avx512::<1, Q, N, _>(&mut b, part, w + 2 + r, [v]);
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&a), bits(&b), "Q {Q}, N {N}");
                }
            }
            heads.iter_mut().step_by(5).for_each(|x| *x *= 100.0);
            both::<Q, N, _>(&xs, std::array::from_fn(|r| &rows[r][..]), &heads, part);
            both::<Q, N, _>(&xs, std::array::from_fn(|r| &b16[r][..]), &heads, part);
            both::<Q, N, _>(&xs, std::array::from_fn(|r| &q8[r][..]), &heads, part);
        }
        let mut seed = 11;
        check::<1, 2>(&mut seed);
        check::<1, 4>(&mut seed);
        check::<1, 8>(&mut seed);
        check::<2, 4>(&mut seed);
        check::<4, 4>(&mut seed);
        check::<4, 8>(&mut seed);
    }

    /// A bf16 or q8_0 cache decodes exactly as an f32 cache holding the same (widened) values,
    /// on the portable loops and on each vector unit's the CPU has (AVX-512, AVX2), which agree
    /// with the portable ones to rounding: ragged head widths (dk 20 and 24, dv 40, 12 and 8:
    /// on AVX2 a pair of blocks of eight, a lone block, a tail; q8_0 rows widened first, heads
    /// across blocks), the unrolled ones (32, 64, 128) and whole blocks not unrolled (96, 160:
    /// q8_0 read as blocks on AVX-512 in both), a last chunk of 13 rows (77 cached) and chunks
    /// of 64 (600 cached), GQA groups of 4, 2 and 1, two sequences.
    #[test]
    fn bf16_and_q8_caches_decode_as_their_widened_values_on_every_path() {
        let paths: Vec<Option<Isa>> = Isa::available_all().map(Some).collect();
        let mut seed = 1u32;
        let mut rand = |n: usize| crate::lcg_values(n, &mut seed, 2.0);
        let b = 2;
        for (tkv, nq, nk, nv, dk, dv) in [
            (77, 8, 2, 2, 20, 40),
            (77, 4, 2, 2, 32, 8),
            (77, 6, 6, 6, 16, 16),
            (77, 4, 4, 4, 24, 12),
            (600, 4, 4, 2, 64, 128),
            (600, 8, 2, 2, 64, 128),
            (77, 4, 2, 2, 96, 160),
        ] {
            let s = AttnShape {
                nq,
                nk,
                nv,
                dk,
                dv,
                diff_pairs: false,
            };
            let q = rand(b * nq * dk);
            let (kx, vx) = (rand(b * tkv * nk * dk), rand(b * tkv * nv * dv));
            let run = |isa: Option<Isa>, k: &[f32], v: &[f32]| {
                let (mut o, mut lse) = (vec![0f32; b * nq * dv], vec![0f32; b * nq]);
                attention_decode_on(isa, &mut o, &mut lse, &q, k, v, b, tkv, tkv, &s);
                (o, lse)
            };
            let (kb, kbf) = cached::<bf16>(&kx, nk * dk);
            let (vb, vbf) = cached::<bf16>(&vx, nv * dv);
            let (k8, k8f) = cached::<Q8Block>(&kx, nk * dk);
            let (v8, v8f) = cached::<Q8Block>(&vx, nv * dv);
            assert!(kbf != k8f && k8f != kx, "{s:?}: the three caches differ");
            let portable = run(None, &kbf, &vbf);
            assert!(portable.0.iter().any(|&x| x != 0.0));
            for &isa in paths.iter().chain([&None]) {
                let f = run(isa, &kbf, &vbf);
                let shape = (b, tkv, &s);
                assert_eq!(run_c(isa, (&q, &kb, &vb), shape), f, "{s:?} {isa:?}: bf16");
                let f8 = run(isa, &k8f, &v8f);
                assert_eq!(run_c(isa, (&q, &k8, &v8), shape), f8, "{s:?} {isa:?}: q8_0");
                for (a, b) in
                    f.0.iter()
                        .chain(&f.1)
                        .zip(portable.0.iter().chain(&portable.1))
                {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{s:?} {isa:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn query_groups_are_the_aligned_runs_that_share_key_and_value_heads() {
        let shape = |nq, nk, nv, diff_pairs| AttnShape {
            nq,
            nk,
            nv,
            dk: 8,
            dv: 8,
            diff_pairs,
        };
        // standard MHA; GQA of 2 and of 4 (diff_v2); diff_v1's sub-heads alternate key heads;
        // groups of 3 fit no aligned run of 2; 8 over 1 is taken 4 at a time
        for (s, want) in [
            (shape(8, 8, 8, false), 1),
            (shape(4, 2, 2, false), 2),
            (shape(16, 4, 4, false), 4),
            (shape(8, 8, 4, true), 1),
            (shape(6, 2, 2, false), 1),
            (shape(8, 1, 1, false), 4),
        ] {
            assert_eq!(query_group(&s), want, "{s:?}");
        }
    }
}

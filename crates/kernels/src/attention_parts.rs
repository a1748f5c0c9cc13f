//! What the attention kernels pass between them: a call's head layout (`AttnShape`), the key
//! tile's width (`BK`), and a query block's per-row state (`Online` in the forward, `PairRow`
//! in the backward), shared by the tile kernel (attention.rs), its AVX-512 score epilogues
//! (attention_scores.rs) and the decoding kernel (attention_decode.rs), below all three.

use super::exp_nonpos;

/// Keys per tile of the tile kernel (attention.rs).
pub(crate) const BK: usize = 64;

/// Head counts and widths of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    /// NQ query heads of width DK
    pub nq: usize,
    /// NK key heads of width DK
    pub nk: usize,
    /// NV value heads of width DV
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    /// diff_v1: query sub-head j of group g reads key sub-head 2g + j % 2 (Q1 with K1, Q2 with K2).
    pub diff_pairs: bool,
}

impl AttnShape {
    /// Query head j reads value head j / (NQ / NV): plain GQA grouping.
    pub fn v_head(&self, j: usize) -> usize {
        j / (self.nq / self.nv)
    }
    pub fn k_head(&self, j: usize) -> usize {
        if self.diff_pairs {
            2 * self.v_head(j) + j % 2
        } else {
            j / (self.nq / self.nk)
        }
    }
    pub(crate) fn check(&self) {
        assert!(
            self.nq.is_multiple_of(self.nv) && self.nq.is_multiple_of(self.nk),
            "{self:?}"
        );
        if self.diff_pairs {
            assert_eq!(self.nk, 2 * self.nv, "{self:?}");
        }
    }
}

/// A query block's online-softmax state, one entry per row: the running max m and sum l, and
/// corr = exp(m_old − m_new), by which the current key tile rescales what the row accumulated
/// before.
pub(crate) struct Online<'a> {
    pub m: &'a mut [f32],
    pub l: &'a mut [f32],
    pub corr: &'a mut [f32],
}

impl Online<'_> {
    /// Row r's max after a tile whose scaled scores peak at `m_row`: sets corr and returns
    /// the new max. A max that did not move skips the exp, whose value there (e⁰) is 1
    /// exactly.
    pub fn raise(&mut self, r: usize, m_row: f32) -> f32 {
        let m_new = self.m[r].max(m_row);
        self.corr[r] = if m_new == self.m[r] {
            1.0
        } else {
            exp_nonpos(self.m[r] - m_new)
        };
        m_new
    }

    /// Row r's sum rescaled and the tile's `sum` of exp(S − m_new) added; m_new kept.
    pub fn settle(&mut self, r: usize, m_new: f32, sum: f32) {
        self.l[r] = self.l[r] * self.corr[r] + sum;
        self.m[r] = m_new;
    }
}

/// The second map of a pair in the backward's row pass: its score and dS rows, its lse and
/// delta, and the pair's λ.
pub(crate) struct PairRow<'a> {
    pub p: &'a mut [f32],
    pub ds: &'a mut [f32],
    pub lse_delta: (f32, f32),
    pub lambda: f32,
}

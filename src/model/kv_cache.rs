//! The KV cache of one sequence: every layer's rotated keys and values so far, so that each new
//! token attends to the prefix in O(T) without recomputing it. The rows are f32, or bf16
//! (`--kv-cache bf16`: half the bytes that each decoding step reads, the values rounded to
//! nearest even as they are written, widened again as attention loads them), or q8_0
//! (`--kv-cache q8_0`: blocks of 32 int8 quants with an f32 scale, 1.125 bytes a value, as
//! Q8_0 rounds; widened as attention loads them, `kernels::KvElem`).

use super::Model;
use crate::config::ModelConfig;
use crate::kernels::{KvElem, Q8Block};
use half::bf16;

/// The element type of a KV cache's rows: a model's `kv_cache` setting, which every cache made
/// for it takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvKind {
    #[default]
    /// Keys and values as computed.
    F32,
    /// Rounded to bf16 as they are cached: half the bytes.
    Bf16,
    /// Blocks of 32 int8 values with one f32 scale: 9/32 of the bytes.
    Q8_0,
}

impl KvKind {
    /// Every kind.
    pub const ALL: [KvKind; 3] = [KvKind::F32, KvKind::Bf16, KvKind::Q8_0];

    /// Its `--kv-cache` name.
    pub fn as_str(self) -> &'static str {
        match self {
            KvKind::F32 => "f32",
            KvKind::Bf16 => "bf16",
            KvKind::Q8_0 => "q8_0",
        }
    }

    /// Bytes a cached row of `width` values takes.
    pub fn row_bytes(self, width: usize) -> usize {
        fn of<C: KvElem>(width: usize) -> usize {
            C::BYTES * C::entries(width)
        }
        match self {
            KvKind::F32 => of::<f32>(width),
            KvKind::Bf16 => of::<bf16>(width),
            KvKind::Q8_0 => of::<Q8Block>(width),
        }
    }
}

impl std::fmt::Display for KvKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KvKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        KvKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| format!("unknown KV cache type `{s}` (expected f32, bf16 or q8_0)"))
    }
}

/// Per layer, (capacity, NK, DK) rotated keys and (capacity, NV, DV) values, a row of w
/// values as `C::entries(w)` entries.
pub(crate) struct Rows<C> {
    pub k: Vec<Vec<C>>,
    pub v: Vec<Vec<C>>,
}

impl<C: KvElem> Rows<C> {
    /// Rows for `capacity` tokens of `layers` layers, keys and values `widths` wide.
    fn new(layers: usize, capacity: usize, (kw, vw): (usize, usize)) -> Self {
        let zeros = |w: usize| vec![C::default(); capacity * C::entries(w)];
        Rows {
            k: (0..layers).map(|_| zeros(kw)).collect(),
            v: (0..layers).map(|_| zeros(vw)).collect(),
        }
    }

    fn bytes(&self) -> usize {
        C::BYTES * self.k.iter().chain(&self.v).map(|x| x.len()).sum::<usize>()
    }

    /// The rows of tokens [start, end) of rows that hold `held` tokens, every layer.
    fn cut(&self, held: usize, (start, end): (usize, usize)) -> Self {
        let part = |x: &Vec<Vec<C>>| -> Vec<Vec<C>> {
            x.iter()
                .map(|l| {
                    let e = l.len() / held.max(1);
                    l[start * e..end * e].to_vec()
                })
                .collect()
        };
        Rows {
            k: part(&self.k),
            v: part(&self.v),
        }
    }

    /// Writes `b`'s rows (of `tokens` tokens) at token `at` of rows that hold `held`.
    fn put(&mut self, held: usize, at: usize, b: &Self, tokens: usize) {
        let put = |x: &mut Vec<Vec<C>>, y: &Vec<Vec<C>>| {
            for (l, m) in x.iter_mut().zip(y) {
                let e = l.len() / held.max(1);
                l[at * e..(at + tokens) * e].copy_from_slice(m);
            }
        };
        put(&mut self.k, &b.k);
        put(&mut self.v, &b.v);
    }
}

/// The rows in the cache's entry type.
pub(crate) enum Store {
    F32(Rows<f32>),
    Bf16(Rows<bf16>),
    Q8(Rows<Q8Block>),
}

/// The keys and values of every layer for one sequence, so that each new token attends to the past without recomputing it.
pub struct KvCache {
    /// tokens the cache can hold
    pub capacity: usize,
    /// tokens cached so far (the position of the next token)
    pub len: usize,
    /// The element type the rows are stored in.
    pub kind: KvKind,
    pub(crate) store: Store,
}

impl KvCache {
    /// An empty cache for up to `capacity` tokens (at most the model's context), of the
    /// model's `kv_cache` kind.
    pub fn new(model: &Model, capacity: usize) -> Self {
        let c = &model.config;
        let capacity = capacity.min(c.max_position_embeddings);
        let (layers, widths) = (c.num_hidden_layers, Self::widths(c));
        KvCache {
            capacity,
            len: 0,
            kind: model.kv_cache,
            store: match model.kv_cache {
                KvKind::F32 => Store::F32(Rows::new(layers, capacity, widths)),
                KvKind::Bf16 => Store::Bf16(Rows::new(layers, capacity, widths)),
                KvKind::Q8_0 => Store::Q8(Rows::new(layers, capacity, widths)),
            },
        }
    }

    /// Floats a token takes in one layer: its rotated keys and its values.
    fn widths(c: &ModelConfig) -> (usize, usize) {
        (
            c.n_key_heads() * c.head_dim,
            c.num_key_value_heads * c.value_head_dim(),
        )
    }

    /// Bytes of `KvCache::new(model, capacity)` for a model of `config` whose caches are of
    /// `kind`, computable before allocating (saturating: an overflow reads as `usize::MAX`).
    pub fn bytes_for(config: &ModelConfig, kind: KvKind, capacity: usize) -> usize {
        let (kw, vw) = Self::widths(config);
        let capacity = capacity.min(config.max_position_embeddings);
        capacity
            .saturating_mul(kind.row_bytes(kw).saturating_add(kind.row_bytes(vw)))
            .saturating_mul(config.num_hidden_layers)
    }

    /// Forget the cached tokens (the buffers are kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Bytes the cache holds.
    pub fn bytes(&self) -> usize {
        self.store.bytes()
    }

    /// A copy of the rows of cached tokens [start, end), every layer: a block that
    /// `append` puts into another cache of the same kind (prefix caching).
    pub fn cut(&self, start: usize, end: usize) -> KvBlock {
        assert!(
            start <= end && end <= self.len,
            "cut {start}..{end} of {}",
            self.len
        );
        let (held, span) = (self.capacity, (start, end));
        KvBlock {
            tokens: end - start,
            store: match &self.store {
                Store::F32(r) => Store::F32(r.cut(held, span)),
                Store::Bf16(r) => Store::Bf16(r.cut(held, span)),
                Store::Q8(r) => Store::Q8(r.cut(held, span)),
            },
        }
    }

    /// Appends a block's rows after the cached tokens, as if they had been computed here.
    /// Errors on a block of another kind or one that does not fit.
    pub fn append(&mut self, b: &KvBlock) -> crate::error::Result<()> {
        if self.len + b.tokens > self.capacity {
            return Err(crate::error::Error::Invalid(format!(
                "a block of {} tokens does not fit a cache of {} holding {}",
                b.tokens, self.capacity, self.len
            )));
        }
        let (held, at, n) = (self.capacity, self.len, b.tokens);
        match (&mut self.store, &b.store) {
            (Store::F32(r), Store::F32(x)) => r.put(held, at, x, n),
            (Store::Bf16(r), Store::Bf16(x)) => r.put(held, at, x, n),
            (Store::Q8(r), Store::Q8(x)) => r.put(held, at, x, n),
            _ => {
                return Err(crate::error::Error::Invalid(
                    "a block of another KV cache type".into(),
                ))
            }
        }
        self.len += n;
        Ok(())
    }
}

impl Store {
    fn bytes(&self) -> usize {
        match self {
            Store::F32(r) => r.bytes(),
            Store::Bf16(r) => r.bytes(),
            Store::Q8(r) => r.bytes(),
        }
    }
}

/// The keys and values of a run of tokens in every layer, cut from one cache (`KvCache::cut`)
/// to be appended to another (`KvCache::append`).
pub struct KvBlock {
    /// tokens it holds
    pub tokens: usize,
    store: Store,
}

impl KvBlock {
    /// Bytes it holds.
    pub fn bytes(&self) -> usize {
        self.store.bytes()
    }
}

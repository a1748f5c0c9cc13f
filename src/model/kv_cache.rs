//! The KV cache of one sequence: every layer's rotated keys and values so far, so that each new
//! token attends to the prefix in O(T) without recomputing it.

use super::Model;
use crate::config::ModelConfig;

pub struct KvCache {
    /// tokens the cache can hold
    pub capacity: usize,
    /// tokens cached so far (the position of the next token)
    pub len: usize,
    /// per layer, (capacity, NK, DK) rotated keys
    pub(crate) k: Vec<Vec<f32>>,
    /// per layer, (capacity, NV, DV) values
    pub(crate) v: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for up to `capacity` tokens (at most the model's context).
    pub fn new(model: &Model, capacity: usize) -> Self {
        let c = &model.config;
        let capacity = capacity.min(c.max_position_embeddings);
        let (kw, vw) = Self::widths(c);
        KvCache {
            capacity,
            len: 0,
            k: (0..c.num_hidden_layers)
                .map(|_| vec![0.0; capacity * kw])
                .collect(),
            v: (0..c.num_hidden_layers)
                .map(|_| vec![0.0; capacity * vw])
                .collect(),
        }
    }

    /// Floats a token takes in one layer: its rotated keys and its values.
    fn widths(c: &ModelConfig) -> (usize, usize) {
        (
            c.n_key_heads() * c.head_dim,
            c.num_key_value_heads * c.value_head_dim(),
        )
    }

    /// Bytes of `KvCache::new(model, capacity)` for a model of `config`, computable before
    /// allocating (saturating: an overflow reads as `usize::MAX`).
    pub fn bytes_for(config: &ModelConfig, capacity: usize) -> usize {
        let (kw, vw) = Self::widths(config);
        let capacity = capacity.min(config.max_position_embeddings);
        capacity
            .saturating_mul(kw.saturating_add(vw))
            .saturating_mul(config.num_hidden_layers)
            .saturating_mul(4)
    }

    /// Forget the cached tokens (the buffers are kept).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn bytes(&self) -> usize {
        4 * self.k.iter().chain(&self.v).map(|x| x.len()).sum::<usize>()
    }
}

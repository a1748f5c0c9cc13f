//! What a use of a model needs in memory, counted from its config and the sizes asked for
//! (`--batch`, `--context`, prompts, `--parallel`) before anything is allocated, so that an
//! absurd figure is refused in one line instead of aborting on an allocation. The figures are
//! the buffers' own sizes (`Workspace::bytes_for`, `KvCache::bytes_for`), the ones
//! `difftx bench memory` reports.

use super::bf16_weights::Bf16Weights;
use super::f32_panels::F32Panels;
use super::{KvCache, KvKind, Model, Workspace};
use crate::config::{check_memory, ModelConfig};
use crate::error::{Error, Result};

/// Bytes by kind; each saturates rather than overflows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Need {
    /// f32 parameters, and for training their gradients and AdamW's two moments
    pub params: usize,
    /// activations and scratch of the workspaces
    pub workspace: usize,
    /// the KV caches
    pub kv: usize,
    /// the weights kept a second time for inference: bf16 copies (`--bf16`,
    /// `Workspace::keep_bf16_weights`) or f32 panels (a batch's decoding, `keep_f32_panels`)
    pub copies: usize,
}

impl Need {
    /// Training `batch` windows of `seq` tokens: parameters, gradients, m and v, one workspace.
    pub fn training(config: &ModelConfig, batch: usize, seq: usize) -> Self {
        Need {
            params: config.num_params().saturating_mul(16),
            workspace: Workspace::bytes_for(config, batch, seq),
            kv: 0,
            copies: 0,
        }
    }

    /// Inference: the weights, workspaces of (batch, seq) each, and `caches` KV caches of
    /// `kind` of up to `cache_len` tokens each.
    pub fn inference(
        config: &ModelConfig,
        workspaces: &[(usize, usize)],
        (caches, cache_len, kind): (usize, usize, KvKind),
    ) -> Self {
        let workspace = workspaces.iter().fold(0usize, |a, &(b, t)| {
            a.saturating_add(Workspace::bytes_for_inference(config, b, t))
        });
        Need {
            params: config.num_params().saturating_mul(4),
            workspace,
            kv: KvCache::bytes_for(config, kind, cache_len).saturating_mul(caches),
            copies: 0,
        }
    }

    /// With the weights kept a second time for inference, at the bytes they will take: bf16
    /// copies where `model` multiplies in bf16 (`Workspace::keep_bf16_weights`), else f32
    /// panels where `panels` (`Workspace::keep_f32_panels`).
    pub fn with_copies(self, model: &Model, panels: bool) -> Self {
        let copies = match (model.precision.is_bf16(), panels) {
            (true, _) => Bf16Weights::bytes_for(&model.layout),
            (false, true) => F32Panels::bytes_for(&model.layout),
            (false, false) => 0,
        };
        Need { copies, ..self }
    }

    pub fn total(&self) -> usize {
        self.params
            .saturating_add(self.workspace)
            .saturating_add(self.kv)
            .saturating_add(self.copies)
    }

    /// Refuses, in one line naming `what` (the flags or input that set the sizes), the figure
    /// and this machine's memory, a need the machine cannot hold.
    pub fn check(&self, what: &str) -> Result<()> {
        let gib = |b: usize| b as f64 / f64::from(1u32 << 30);
        let mut parts = vec![format!("parameters {:.1} GiB", gib(self.params))];
        parts.push(format!(
            "activations and scratch {:.1} GiB",
            gib(self.workspace)
        ));
        if self.kv > 0 {
            parts.push(format!("KV caches {:.1} GiB", gib(self.kv)));
        }
        if self.copies > 0 {
            parts.push(format!("weight copies {:.1} GiB", gib(self.copies)));
        }
        let detail = format!("({})", parts.join(", "));
        check_memory(what, self.total() as f64, &detail).map_err(Error::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, Preset};
    use crate::model::Model;

    #[test]
    fn the_need_is_what_the_buffers_allocate() {
        for kind in AttentionKind::ALL {
            let m = Model::init(ModelConfig::preset(Preset::Tiny, kind), 1).unwrap();
            let (b, t) = (3, 7);
            let ws = Workspace::new(&m, b, t);
            assert_eq!(Need::training(&m.config, b, t).workspace, ws.bytes());
            let need = |kv| Need::inference(&m.config, &[(b, t)], (2, 5, kv));
            for kv in KvKind::ALL {
                let mut mk = m.clone();
                mk.kv_cache = kv;
                assert_eq!(need(kv).kv, 2 * KvCache::new(&mk, 5).bytes(), "{kind} {kv}");
            }
            let need = need(KvKind::F32);
            assert_eq!(need.params, 4 * m.params.len());
            // inference keeps one block's activations, which every block takes in turn
            assert_eq!(need.workspace, Workspace::for_inference(&m, b, t).bytes());
            assert!(need.workspace < ws.bytes());
            let mut ws = Workspace::new(&m, b, t);
            ws.keep_f32_panels(&m);
            let copy = ws.bytes() - Workspace::bytes_for(&m.config, b, t);
            assert_eq!(need.with_copies(&m, true).copies, copy);
            // bf16 copies where the CPU multiplies in bf16, as the server and generation keep
            // them (`keep_weight_copies`); none elsewhere, and the need says so
            let mut bf16 = m.clone();
            bf16.precision = crate::kernels::Precision::Bf16;
            let mut ws = Workspace::new(&bf16, b, t);
            ws.keep_weight_copies(&bf16, false);
            let copy = ws.bytes() - Workspace::bytes_for(&m.config, b, t);
            assert_eq!(need.with_copies(&bf16, false).copies, copy);
        }
    }

    #[test]
    fn absurd_sizes_are_refused_with_the_figure_and_the_machine_s_memory() {
        let c = ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1);
        assert!(Need::training(&c, 4, 32).check("--batch 4").is_ok());
        for (b, t) in [(1 << 40, 32), (usize::MAX, usize::MAX), (1 << 20, 1 << 20)] {
            let e = Need::training(&c, b, t).check("--batch N").unwrap_err();
            let e = e.to_string();
            assert!(
                e.contains("--batch N would need") && e.contains("GiB of memory"),
                "{e}"
            );
            assert_eq!(e.lines().count(), 1);
        }
        let e = Need::inference(&c, &[(1, 1)], (1 << 40, usize::MAX, KvKind::Q8_0))
            .check("1099511627776 prompts");
        assert!(e.unwrap_err().to_string().contains("KV caches"));
    }
}

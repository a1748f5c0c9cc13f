//! The paper's experiments: tasks, measurements and their reports (`difftx repro`, `difftx demo`).

pub mod attention_stats;
pub mod demo;
pub mod icl;
pub mod lm_scaling;
pub mod needle;
pub mod repro;

use crate::error::{Error, Result};
use crate::model::{Model, Workspace};

/// One forward pass over a batch of prompts that all have `t` tokens (needle episodes, ICL
/// prompts); the logits are then in `ws.logits`, row b·t + p for prompt b, position p.
pub(crate) fn forward_prompts<'a>(
    model: &Model,
    ws: &mut Workspace,
    prompts: impl ExactSizeIterator<Item = &'a [u32]>,
    t: usize,
) -> Result<()> {
    let b = prompts.len();
    let mut inputs = Vec::with_capacity(b * t);
    for p in prompts {
        if p.len() != t {
            return Err(Error::Invalid(format!(
                "prompt of {} tokens in a batch of prompts of {t}",
                p.len()
            )));
        }
        inputs.extend_from_slice(p);
    }
    model.forward(ws, &inputs, b, t)
}

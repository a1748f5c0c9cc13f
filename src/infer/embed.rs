//! Text embeddings: the mean over positions of the model's final hidden state (after the final
//! RMSNorm, the input of the language-model head), scaled to unit length. What
//! `/v1/embeddings` answers; a causal language model's embedding, not a trained sentence
//! encoder's (similar texts get similar vectors, but nothing was trained for it).

use crate::error::{Error, Result};
use crate::model::{Model, Workspace};

/// The embedding of each of `inputs` (token ids, each 1 to the context's length): a unit
/// vector of the model's hidden size. Inputs run one at a time, each in one forward pass.
///
/// ```
/// use difftx::prelude::*;
///
/// let model = Model::init(ModelConfig::preset(Preset::Tiny, AttentionKind::DiffV1), 0)?;
/// let tok = Tokenizer::Bytes;
/// let e = embed(&model, &[tok.encode("a cat")?, tok.encode("a dog")?])?;
/// let cosine: f32 = e[0].iter().zip(&e[1]).map(|(a, b)| a * b).sum();
/// assert_eq!(e[0].len(), model.config.hidden_size);
/// assert!(cosine > -1.0 && cosine < 1.0);
/// # Ok::<(), difftx::Error>(())
/// ```
pub fn embed(model: &Model, inputs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
    let (ctx, dm) = (
        model.config.max_position_embeddings,
        model.config.hidden_size,
    );
    // 1. Every input checked before any runs
    for (i, x) in inputs.iter().enumerate() {
        if x.is_empty() || x.len() > ctx {
            return Err(Error::Invalid(format!(
                "input {} is {} tokens; an embedding takes 1 to {ctx} (the model's context)",
                i + 1,
                x.len()
            )));
        }
    }
    let longest = inputs.iter().map(Vec::len).max().unwrap_or(1);
    let mut ws = Workspace::new(model, 1, longest);
    crate::kernels::on_pool(|| {
        inputs
            .iter()
            .map(|x| {
                // 2. The final hidden states of every position (`Workspace::lnf`)
                model.forward(&mut ws, x, 1, x.len())?;
                // 3. Their mean, in f64, scaled to unit length
                let mut mean = vec![0f64; dm];
                for row in ws.lnf[..x.len() * dm].chunks(dm) {
                    mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v as f64);
                }
                let norm = mean.iter().map(|m| m * m).sum::<f64>().sqrt().max(1e-30);
                Ok(mean.iter().map(|m| (m / norm) as f32).collect())
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AttentionKind, ModelConfig, Preset};

    /// Each embedding is the normalised mean of the final norm's rows, whatever else is asked
    /// with it; a prefix's embedding differs from the whole text's; bad lengths are refused.
    #[test]
    fn embeddings_are_unit_means_of_the_final_hidden_states() {
        for kind in AttentionKind::ALL {
            let model = Model::init(ModelConfig::preset(Preset::Tiny, kind), 3).unwrap();
            let (a, b): (Vec<u32>, Vec<u32>) = ((0..40).map(|i| i * 7 % 200).collect(), vec![5]);
            let both = embed(&model, &[a.clone(), b.clone()]).unwrap();
            assert_eq!(embed(&model, std::slice::from_ref(&a)).unwrap()[0], both[0]);
            assert_eq!(embed(&model, &[b]).unwrap()[0], both[1]);
            // the definition, from a forward pass of its own
            let mut ws = Workspace::new(&model, 1, a.len());
            model.forward(&mut ws, &a, 1, a.len()).unwrap();
            let dm = model.config.hidden_size;
            let mut want = vec![0f64; dm];
            for (i, v) in ws.lnf[..a.len() * dm].iter().enumerate() {
                want[i % dm] += *v as f64 / a.len() as f64;
            }
            let n = want.iter().map(|w| w * w).sum::<f64>().sqrt();
            for (g, w) in both[0].iter().zip(&want) {
                assert!(
                    (*g as f64 - w / n).abs() < 1e-6,
                    "{kind:?}: {g} vs {}",
                    w / n
                );
            }
            let len: f64 = both[1].iter().map(|v| (*v as f64).powi(2)).sum();
            assert!((len - 1.0).abs() < 1e-5, "{len}");
            assert_ne!(embed(&model, &[a[..20].to_vec()]).unwrap()[0], both[0]);
            let ctx = model.config.max_position_embeddings;
            for bad in [vec![], vec![1; ctx + 1]] {
                let e = embed(&model, &[vec![1], bad]).unwrap_err().to_string();
                assert!(e.starts_with("input 2 is "), "{e}");
            }
        }
    }
}

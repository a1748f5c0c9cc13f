//! Native checkpoints (docs/SPEC.md): `config.json` + `model.safetensors` with Hugging Face Llama
//! tensor names in torch `Linear` layout. Loading checks every tensor against the config.

use super::model::Model;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::util::manifest::Manifest;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The config's file name in a model directory.
pub const CONFIG_FILE: &str = "config.json";
/// The weights' file name in a model directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";

/// Decodes a tensor's little-endian bytes (F32, BF16 or F16) into f32.
pub fn decode_f32(dtype: Dtype, bytes: &[u8], out: &mut [f32]) -> std::result::Result<(), String> {
    match dtype {
        Dtype::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Dtype::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        Dtype::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        other => {
            return Err(format!(
                "dtype {other:?} is not supported (expected F32, BF16 or F16)"
            ))
        }
    }
    Ok(())
}

/// Reads and parses a safetensors file; a short or corrupt file is an error naming it.
pub fn read_safetensors(path: &Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    SafeTensors::deserialize(&bytes).map_err(|e| Error::Checkpoint {
        path: path.to_path_buf(),
        msg: format!("not a complete safetensors file ({e})"),
    })?;
    Ok(bytes)
}

/// Where a parameter's values come from when loading.
pub(crate) enum Fill {
    /// the tensor of this name in the files
    Tensor(String),
    /// not stored (a Hugging Face DiffLlama per-head norm has no weight): all ones
    Ones,
}

/// Reads each (path, parsed file) pair's tensors into the model's parameters: every stored
/// tensor must be used, every `Fill::Tensor` must exist with the parameter's shape.
pub(crate) fn fill_params(
    model: &mut Model,
    files: &[(PathBuf, SafeTensors)],
    index_path: &Path,
    source: impl Fn(&str) -> Fill,
) -> Result<()> {
    let mut wanted: HashSet<String> = HashSet::new();
    let plan: Vec<Fill> = model.layout.specs.iter().map(|s| source(&s.name)).collect();
    for f in &plan {
        if let Fill::Tensor(n) = f {
            wanted.insert(n.clone());
        }
    }
    for (path, st) in files {
        let mut extra: Vec<&str> = st
            .names()
            .into_iter()
            .filter(|n| !wanted.contains(*n))
            .collect();
        extra.sort();
        if let Some(name) = extra.first() {
            return Err(Error::Checkpoint {
                path: path.clone(),
                msg: format!(
                    "unexpected tensor `{name}` (a {} model with this config.json has no such tensor)",
                    model.config.attention
                ),
            });
        }
    }
    for (spec, fill) in model.layout.specs.iter().zip(plan) {
        let dst = &mut model.params[spec.range()];
        let name = match fill {
            Fill::Ones => {
                dst.fill(1.0);
                continue;
            }
            Fill::Tensor(n) => n,
        };
        let found = files
            .iter()
            .find_map(|(p, st)| st.tensor(&name).ok().map(|v| (p, v)));
        let Some((path, view)) = found else {
            return Err(Error::Checkpoint {
                path: index_path.to_path_buf(),
                msg: format!("missing tensor `{name}`"),
            });
        };
        let err = |msg: String| Error::Checkpoint {
            path: path.clone(),
            msg,
        };
        if view.shape() != spec.shape.as_slice() {
            return Err(err(format!(
                "tensor `{name}` has shape {:?}, expected {:?} from config.json",
                view.shape(),
                spec.shape
            )));
        }
        decode_f32(view.dtype(), view.data(), dst)
            .map_err(|e| err(format!("tensor `{name}`: {e}")))?;
        let bad = dst.iter().filter(|x| !x.is_finite()).count();
        if bad > 0 {
            return Err(err(format!(
                "tensor `{name}` holds {bad} non-finite value(s) (NaN or infinity) of {}; a model with them computes nothing meaningful",
                dst.len()
            )));
        }
    }
    Ok(())
}

/// Reads `DIR/config.json`: its path and its JSON. A missing directory, a missing file and
/// malformed JSON are each one error naming the path.
pub fn read_config(dir: &Path) -> Result<(PathBuf, serde_json::Value)> {
    if !dir.is_dir() {
        return Err(Error::io(
            dir,
            std::io::Error::new(std::io::ErrorKind::NotFound, "model directory not found"),
        ));
    }
    let cpath = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&cpath).map_err(|e| Error::io(&cpath, e))?;
    let json = serde_json::from_str(&text).map_err(|e| Error::Config {
        path: cpath.clone(),
        msg: format!("malformed JSON ({e})"),
    })?;
    Ok((cpath, json))
}

/// The `model_type`s of the Hugging Face directories `interop::hf` reads: transformers' own
/// `llama` and `diffllama`, and `difftx_diffv2`, the remote-code model a diff_v2 export writes.
pub const HF_MODEL_TYPES: &[&str] = &["llama", "diffllama", "difftx_diffv2"];

/// The config's `model_type` when it names a Hugging Face directory (`HF_MODEL_TYPES`).
pub fn hf_model_type(json: &serde_json::Value) -> Option<&str> {
    json.get("model_type")
        .and_then(|v| v.as_str())
        .filter(|t| HF_MODEL_TYPES.contains(t))
}

impl Model {
    /// Loads a native difftx model directory (`config.json` + `model.safetensors`). A Hugging
    /// Face directory is refused here; `interop::load` takes either kind.
    /// A directory with a `manifest.json` is verified against it first.
    pub fn load(dir: &Path) -> Result<Self> {
        crate::util::manifest::verify(dir)?;
        let (cpath, json) = read_config(dir)?;
        if let Some(t) = hf_model_type(&json) {
            return Err(Error::Config {
                path: cpath,
                msg: format!("a Hugging Face `{t}` model, not a native difftx one (load it with difftx::interop::load)"),
            });
        }
        Self::load_native(dir, &cpath, &json)
    }

    /// The native model of `dir` whose `config.json` (at `cpath`) was read already as `json`.
    pub(crate) fn load_native(dir: &Path, cpath: &Path, json: &serde_json::Value) -> Result<Self> {
        let config = ModelConfig::from_json(json, cpath)?;
        let wpath = dir.join(WEIGHTS_FILE);
        let bytes = read_safetensors(&wpath)?;
        let st = SafeTensors::deserialize(&bytes).expect("validated by read_safetensors");
        let mut model = Model::zeros(config)?;
        let files = [(wpath.clone(), st)];
        fill_params(&mut model, &files, &wpath, |name| {
            Fill::Tensor(name.to_string())
        })?;
        Ok(model)
    }

    /// Writes `DIR/config.json` and `DIR/model.safetensors` (f32), each atomically, then
    /// `DIR/manifest.json` with their digests (`util::manifest`).
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let mut manifest = Manifest::begin(dir)?;
        self.save_files(dir, &mut manifest)?;
        manifest.finish(dir)
    }

    /// Writes the model's two files into `dir`, recording them in `manifest` (a training
    /// checkpoint adds its own files before finishing it).
    pub fn save_files(&self, dir: &Path, manifest: &mut Manifest) -> Result<()> {
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = self
            .layout
            .specs
            .iter()
            .map(|s| {
                let data = self.params[s.range()]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
                (s.name.clone(), data, s.shape.clone())
            })
            .collect();
        let views = bytes.iter().map(|(n, d, shape)| {
            let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), d)
                .expect("sizes agree");
            (n.clone(), view)
        });
        let data = safetensors::serialize(views, None).map_err(|e| Error::Checkpoint {
            path: dir.join(WEIGHTS_FILE),
            msg: format!("cannot serialise ({e:?})"),
        })?;
        manifest.write(dir, WEIGHTS_FILE, &data)?;
        let cfg = serde_json::to_string_pretty(&self.config.to_json()).expect("json");
        manifest.write(dir, CONFIG_FILE, cfg.as_bytes())
    }
}

//! Training checkpoints. Each is a model directory (docs/SPEC.md layout, loadable by `eval`) plus the
//! optimizer and trainer state:
//!
//! ```text
//! OUT/checkpoints/step-00000500/
//!   config.json  model.safetensors  [tokenizer.json]     the model
//!   optimizer.safetensors   m.<tensor>, v.<tensor>: AdamW moments in the parameter layout
//!   trainer_state.json      step, AdamW t, sampler (RNG) state, the run's configuration
//!   manifest.json           every other file's size and digest, written last (util::manifest)
//! ```
//!
//! A checkpoint is written into `OUT/checkpoints/.tmp-step-…`, every file synced, then the
//! folder is renamed into place and the parent synced: a folder named `step-…` is complete.
//! Only after that are checkpoints beyond the newest `keep_last` removed.

use super::options::RunConfig;
use super::step::Optimizer;
use crate::data::corpus::SamplerState;
use crate::error::{Error, Result};
use crate::model::checkpoint::{decode_f32, read_config, read_safetensors};
use crate::model::Model;
use crate::util::manifest::{verify, Manifest};
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};

pub const CHECKPOINTS_DIR: &str = "checkpoints";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "trainer_state.json";
/// Held (an OS file lock) by the process training in a run folder; holds its process id.
pub const LOCK_FILE: &str = "train.lock";

/// One writer per run folder: while this lives, the process holds an exclusive lock on
/// `OUT/train.lock`. The OS releases it when the process ends, however it ends, so a lock left
/// by a killed run never blocks the next one.
pub struct RunLock {
    /// `None` where this process held the lock already (see `lock_run`)
    _file: Option<std::fs::File>,
}

/// Takes the run folder's lock, or refuses in one line naming the process that holds it. The
/// process that holds it may take it again (the CLI takes it before preparing the data, the
/// trainer once more when it starts): the second guard holds nothing of its own.
pub fn lock_run(out: &Path) -> Result<RunLock> {
    use std::io::{Read, Seek, Write};
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let path = out.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    match file.try_lock() {
        Ok(()) => {
            let pid = std::process::id().to_string();
            file.set_len(0)
                .and_then(|()| file.rewind())
                .and_then(|()| file.write_all(pid.as_bytes()))
                .map_err(|e| Error::io(&path, e))?;
            Ok(RunLock { _file: Some(file) })
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            if holder.trim() == std::process::id().to_string() {
                return Ok(RunLock { _file: None });
            }
            Err(Error::Invalid(format!(
                "{} is being trained by another process (pid {}); one run folder takes one trainer at a time",
                out.display(),
                holder.trim()
            )))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&path, e)),
    }
}

/// What `trainer_state.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: u32,
    /// optimizer updates done
    pub step: u64,
    /// AdamW's update count (bias correction)
    pub adam_t: u64,
    pub sampler: SamplerState,
    pub tokens_seen: u64,
    /// worker threads of the run that wrote it (bit-exact resumes need the same count)
    pub threads: usize,
    /// the run's resolved configuration (`RunConfig::to_json`)
    pub run: Value,
}

pub fn checkpoint_name(step: u64) -> String {
    format!("step-{step:08}")
}

fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// Complete checkpoints of a run, oldest first.
pub fn list_checkpoints(out: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let dir = out.join(CHECKPOINTS_DIR);
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    let mut v: Vec<(u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            step_of(name.to_str()?).map(|s| (s, e.path()))
        })
        .filter(|(_, p)| p.join(STATE_FILE).is_file())
        .collect();
    v.sort();
    Ok(v)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Everything a checkpoint restores.
pub struct Restored {
    pub model: Model,
    pub m: Vec<f32>,
    pub v: Vec<f32>,
    pub state: TrainerState,
    pub run: RunConfig,
    pub dir: PathBuf,
}

/// Writes the checkpoint of `step` atomically and prunes old ones. `tokenizer` is copied in
/// when the run uses a tokenizer.json. On failure nothing under the final name is touched and
/// the error names the file and the reason.
pub fn save_checkpoint(
    out: &Path,
    model: &Model,
    opt: &Optimizer,
    state: &TrainerState,
    tokenizer: Option<&Path>,
    keep_last: usize,
) -> Result<PathBuf> {
    let dir = out.join(CHECKPOINTS_DIR);
    let name = checkpoint_name(state.step);
    let fin = dir.join(&name);
    let tmp = dir.join(format!(".tmp-{name}"));
    let res = (|| {
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut manifest = Manifest::begin(&tmp)?;
        model.save_files(&tmp, &mut manifest)?;
        test_pause();
        if let Some(t) = tokenizer {
            let bytes = std::fs::read(t).map_err(|e| Error::io(t, e))?;
            manifest.write(&tmp, crate::data::tokenizer::TOKENIZER_FILE, &bytes)?;
        }
        manifest.write(&tmp, OPTIMIZER_FILE, &optimizer_bytes(model, opt)?)?;
        test_pause();
        let js = serde_json::to_string_pretty(state).expect("json");
        manifest.write(&tmp, STATE_FILE, js.as_bytes())?;
        test_pause();
        manifest.finish(&tmp)?;
        sync_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        test_pause();
        if fin.exists() {
            // a damaged leftover of an earlier attempt at this step (resume skipped it)
            std::fs::remove_dir_all(&fin).map_err(|e| Error::io(&fin, e))?;
        }
        std::fs::rename(&tmp, &fin).map_err(|e| Error::io(&fin, e))?;
        sync_dir(&dir).map_err(|e| Error::io(&dir, e))
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Retention: only now that the new one is complete. A failure here only leaves extras.
    if let Ok(all) = list_checkpoints(out) {
        let n = all.len();
        for (s, p) in all.into_iter().take(n.saturating_sub(keep_last)) {
            // rename first, so a crash mid-delete never leaves a half folder named `step-…`
            let del = dir.join(format!(".del-{}", checkpoint_name(s)));
            if std::fs::rename(&p, &del).is_ok() {
                let _ = std::fs::remove_dir_all(&del);
            }
        }
    }
    // leftovers of a crash during an earlier deletion
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(".del-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(fin)
}

/// Test hook: with `DIFFTX_TEST_SAVE_PAUSE_MS=N` set, a checkpoint write sleeps N ms after each
/// of its files, so that tests/train.rs's SIGKILLs at random moments land inside writes on any
/// disk. It only sleeps: what is written, and in which order, is the same.
fn test_pause() {
    static MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *MS.get_or_init(|| {
        std::env::var("DIFFTX_TEST_SAVE_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

fn optimizer_bytes(model: &Model, opt: &Optimizer) -> Result<Vec<u8>> {
    let mut data: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
    for (prefix, buf) in [("m", &opt.m), ("v", &opt.v)] {
        for s in &model.layout.specs {
            let bytes = buf[s.range()]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            data.push((format!("{prefix}.{}", s.name), bytes, s.shape.clone()));
        }
    }
    let views = data.iter().map(|(n, d, shape)| {
        let view = safetensors::tensor::TensorView::new(Dtype::F32, shape.clone(), d)
            .expect("sizes agree");
        (n.clone(), view)
    });
    safetensors::serialize(views, None).map_err(|e| Error::Checkpoint {
        path: OPTIMIZER_FILE.into(),
        msg: format!("cannot serialise ({e:?})"),
    })
}

/// Loads one checkpoint folder, verified first against its `manifest.json` where it has one
/// (checkpoints written before manifests load as before).
pub fn load_checkpoint(dir: &Path) -> Result<Restored> {
    verify(dir)?;
    let spath = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&spath).map_err(|e| Error::io(&spath, e))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: spath.clone(),
        msg: format!("malformed trainer state ({e})"),
    })?;
    let run = RunConfig::from_json(&state.run, &spath)?;
    let (cpath, json) = read_config(dir)?;
    let model = Model::load_native(dir, &cpath, &json)?;
    if model.config != run.model {
        return Err(Error::Checkpoint {
            path: dir.join(crate::model::checkpoint::CONFIG_FILE),
            msg: format!("does not match the run recorded in {STATE_FILE}"),
        });
    }
    let opath = dir.join(OPTIMIZER_FILE);
    let bytes = read_safetensors(&opath)?;
    let st = SafeTensors::deserialize(&bytes).expect("validated");
    let n = model.num_params();
    let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
    for (prefix, buf) in [("m", &mut m), ("v", &mut v)] {
        for s in &model.layout.specs {
            let name = format!("{prefix}.{}", s.name);
            let err = |msg: String| Error::Checkpoint {
                path: opath.clone(),
                msg,
            };
            let view = st
                .tensor(&name)
                .map_err(|_| err(format!("missing tensor `{name}`")))?;
            if view.shape() != s.shape.as_slice() {
                return Err(err(format!(
                    "tensor `{name}` has shape {:?}, expected {:?}",
                    view.shape(),
                    s.shape
                )));
            }
            decode_f32(view.dtype(), view.data(), &mut buf[s.range()])
                .map_err(|e| err(format!("tensor `{name}`: {e}")))?;
        }
    }
    Ok(Restored {
        model,
        m,
        v,
        state,
        run,
        dir: dir.to_path_buf(),
    })
}

/// The newest checkpoint of a run that loads; a damaged newer one is skipped (and reported
/// in the returned notes).
pub fn load_latest(out: &Path) -> Result<(Option<Restored>, Vec<String>)> {
    let mut notes = Vec::new();
    for (_, dir) in list_checkpoints(out)?.into_iter().rev() {
        match load_checkpoint(&dir) {
            Ok(r) => return Ok((Some(r), notes)),
            Err(e) => notes.push(format!("skipping damaged checkpoint: {e}")),
        }
    }
    Ok((None, notes))
}

/// The model directory that `path` names: `path` itself when it holds a `config.json` (or is no
/// run folder: loading it then says what is missing), else, for a training run folder, its
/// newest checkpoint that holds a model, returned with a line saying which.
pub fn model_dir(path: &Path) -> Result<(PathBuf, Option<String>)> {
    let is_run = path.join(CHECKPOINTS_DIR).is_dir();
    if path.join(crate::model::checkpoint::CONFIG_FILE).is_file() || !is_run {
        return Ok((path.to_path_buf(), None));
    }
    let newest = list_checkpoints(path)?.into_iter().rev().find(|(_, dir)| {
        dir.join(crate::model::checkpoint::CONFIG_FILE).is_file()
            && dir.join(crate::model::checkpoint::WEIGHTS_FILE).is_file()
    });
    match newest {
        Some((step, dir)) => {
            let note = format!(
                "{}: a training run; using its newest checkpoint {} (step {step})",
                path.display(),
                checkpoint_name(step)
            );
            Ok((dir, Some(note)))
        }
        None => Err(Error::Config {
            path: path.to_path_buf(),
            msg: "a training run without a complete checkpoint yet (no config.json either)".into(),
        }),
    }
}

/// Refuses a run folder that already holds a checkpoint, for a run that does not resume.
pub fn ensure_fresh(out: &Path) -> Result<()> {
    match list_checkpoints(out)?.last() {
        None => Ok(()),
        Some((step, _)) => Err(Error::Invalid(format!(
            "{} already holds a training run (checkpoint {}); pass --resume to continue it or choose another --out",
            out.display(),
            checkpoint_name(*step)
        ))),
    }
}

/// The run recorded by the newest intact checkpoint (its manifest verified, where it has one)
/// that has a readable trainer state, if any.
pub fn latest_run(out: &Path) -> Result<Option<RunConfig>> {
    for (_, dir) in list_checkpoints(out)?.into_iter().rev() {
        // a damaged checkpoint is passed over here as `load_latest` will (which says so)
        if verify(&dir).is_err() {
            continue;
        }
        let spath = dir.join(STATE_FILE);
        let Ok(text) = std::fs::read_to_string(&spath) else {
            continue;
        };
        let Ok(state) = serde_json::from_str::<TrainerState>(&text) else {
            continue;
        };
        return RunConfig::from_json(&state.run, &spath).map(Some);
    }
    Ok(None)
}

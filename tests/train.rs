//! `difftx train` end to end through the binary: exact resume after SIGKILL, clean stop on
//! SIGTERM, non-finite losses, failed checkpoint writes, bad input, token-file reuse,
//! tokenizer training and plots.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const DEMO: &str = include_str!("../data/demo.txt");

fn text_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A temporary folder holding the demo text, and the run folder `run` to train into.
fn demo_run() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let out = tmp.path().join("run");
    (tmp, data, out)
}

/// A very small diff_v1 run: D 64, 2 layers, context 32, 4 windows per step.
fn small_run<'a>(data: &'a str, out: &'a str, steps: &'a str) -> Vec<&'a str> {
    vec![
        "--threads",
        "2",
        "train",
        "--data",
        data,
        "--out",
        out,
        "--attention",
        "diff_v1",
        "--hidden-size",
        "64",
        "--context",
        "32",
        "--batch",
        "4",
        "--steps",
        steps,
        "--eval-every",
        "10",
    ]
}

fn checkpoints(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("step-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// What a process killed inside a write leaves behind: a checkpoint being staged
/// (`checkpoints/.tmp-step-…`) or deleted (`.del-…`), or a file being replaced
/// (`….tmp`, `util::write_atomic`), each as (name, inode, modification time) so that a
/// leftover seen before a kill is not counted again.
fn write_leftovers(out: &Path) -> Vec<(String, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut v = Vec::new();
    for dir in [out.to_path_buf(), out.join("checkpoints")] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let partial =
                name.starts_with(".tmp-") || name.starts_with(".del-") || name.ends_with(".tmp");
            if let (true, Ok(m)) = (partial, e.metadata()) {
                v.push((name, m.ino(), m.mtime(), m.mtime_nsec()));
            }
        }
    }
    v.sort();
    v
}

/// The step of checkpoint `name` (`step-00000120`).
fn step_of(name: &str) -> usize {
    name.trim_start_matches("step-").parse().unwrap()
}

/// How long to wait for a checkpoint after `after` to appear: (its name, when).
fn wait_for_checkpoint_after(out: &Path, after: &Option<String>) -> (String, Instant) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(c) = checkpoints(out)
            .last()
            .filter(|c| Some(*c) > after.as_ref())
        {
            return (c.clone(), Instant::now());
        }
        assert!(Instant::now() < deadline, "no checkpoint after {after:?}");
        std::thread::sleep(Duration::from_micros(500));
    }
}

#[test]
fn resume_after_sigkill_at_50_random_moments_matches_uninterrupted_run() {
    const KILLS: usize = 50;
    // Steps enough that 50 kills do not reach the end even when the machine speeds up after
    // the period is measured (a Xeon running 8 test binaries at once did: "no checkpoint
    // after step-00000120"); the period is also lowered to what each kill saw.
    const STEPS: usize = 200;
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    // A tiny model checkpointed every step, each of its files followed by a 3 ms pause
    // (`DIFFTX_TEST_SAVE_PAUSE_MS`, which changes no bit written): writes fill most of the run.
    let args = |out: &Path| {
        let mut v: Vec<String> = [
            "--threads",
            "1",
            "train",
            "--data",
            s(&data),
            "--out",
            s(out),
            "--attention",
            "diff_v1",
            "--hidden-size",
            "16",
            "--context",
            "16",
            "--batch",
            "1",
            "--steps",
            &STEPS.to_string(),
            "--eval-every",
            "7",
            "--ckpt-every",
            "1",
            "--keep-last",
            "2",
            "--resume",
        ]
        .map(String::from)
        .to_vec();
        v.truncate(v.len() - usize::from(out == a.as_path()));
        v
    };
    let spawn = |out: &Path| {
        bin()
            .args(args(out))
            .env("DIFFTX_TEST_SAVE_PAUSE_MS", "3")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let t0 = Instant::now();
    // 1. The uninterrupted run, beside the killed one
    let uninterrupted = spawn(&a);

    // 2. The same run killed with SIGKILL at seeded random moments, resumed each time: after
    //    it has saved a new checkpoint, within 1.5 of its step's period
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(26);
    let (mut in_write, mut period) = (0, None::<Duration>);
    let mut newest = None;
    for kill in 0..KILLS {
        let before = write_leftovers(&b);
        let mut child = spawn(&b);
        let (c1, t1) = wait_for_checkpoint_after(&b, &newest);
        let p = *period.get_or_insert_with(|| {
            let (_, t2) = wait_for_checkpoint_after(&b, &Some(c1.clone()));
            t2 - t1
        });
        std::thread::sleep(p.mul_f64(rng.random_range(0.0..1.5)));
        let exited = child.try_wait().unwrap();
        assert!(exited.is_none(), "the run ended before kill {kill}");
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let after = write_leftovers(&b);
        in_write += usize::from(after.iter().any(|x| !before.contains(x)));
        newest = checkpoints(&b).last().cloned();
        // steps saved after c1 within t1.elapsed(): a faster machine than when measured
        let saved = newest.as_ref().map_or(0, |c| step_of(c) - step_of(&c1));
        if saved >= 2 {
            period = Some(p.min(t1.elapsed() / saved as u32));
        }
    }
    let killed_at = newest.clone();
    let err = ok(&bin().args(args(&b)).output().unwrap());
    assert!(err.contains("resuming from"), "{err}");
    ok(&uninterrupted.wait_with_output().unwrap());
    eprintln!(
        "{KILLS} SIGKILLs, {in_write} of them inside a write (a checkpoint or file left \
         incomplete), the last at {killed_at:?}; step period {period:?}; {:.1?} in all",
        t0.elapsed()
    );
    assert!(
        in_write >= 20,
        "only {in_write} of {KILLS} kills landed inside a write"
    );

    // 3. The same bits and the same loss log as the uninterrupted run, and no leftovers
    let last = format!("step-{STEPS:08}");
    let final_dir = |o: &Path| o.join("checkpoints").join(&last);
    for f in ["model.safetensors", "optimizer.safetensors", "config.json"] {
        let (x, y) = (
            std::fs::read(final_dir(&a).join(f)).unwrap(),
            std::fs::read(final_dir(&b).join(f)).unwrap(),
        );
        assert!(x == y, "{f} differs after {KILLS} kills + resumes");
    }
    let (la, lb) = (loss_log(&a), loss_log(&b));
    assert_eq!(la.len(), STEPS);
    assert_eq!(la, lb, "loss logs differ");
    assert_eq!(checkpoints(&b), [format!("step-{:08}", STEPS - 1), last]);
    assert_eq!(write_leftovers(&b), []);
}

#[test]
fn a_signal_saves_a_checkpoint_that_eval_loads_and_exits_as_shells_report_it() {
    for (signal, code) in [("TERM", 143), ("INT", 130)] {
        let tmp = tempfile::tempdir().unwrap();
        let data = text_file(tmp.path(), "gpl.txt", DEMO);
        let out = tmp.path().join("run");
        let mut args = small_run(s(&data), s(&out), "100000");
        args.extend(["--ckpt-every", "0", "--warmup", "10", "--log-every", "5"]);
        let child = bin()
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let metrics = out.join("metrics.jsonl");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::read_to_string(&metrics).map_or(0, |t| t.lines().count()) < 20 {
            assert!(Instant::now() < deadline, "no progress");
            std::thread::sleep(Duration::from_millis(20));
        }
        let st = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "SIG{signal}: {err}");
        assert!(err.contains("interrupted at step"), "{err}");
        assert!(!err.contains("error") && !err.contains("panicked"), "{err}");
        // stderr is a pipe, not a terminal: plain progress lines every 5 steps
        for step in [5, 10, 15, 20] {
            let line = format!("run: step {step}/100000 loss ");
            assert!(err.contains(&line), "no `{line}` in: {err}");
        }
        assert!(err.contains(" tok/s ETA "), "{err}");
        let ck = checkpoints(&out);
        assert_eq!(ck.len(), 1, "{ck:?}");
        let steps_logged = loss_log(&out).len();
        assert_eq!(ck[0], format!("step-{steps_logged:08}"));
        // the checkpoint is a model directory that eval loads
        let model = out.join("checkpoints").join(&ck[0]);
        let e = difftx(&["eval", "--model", s(&model), "--data", s(&data), "--json"]);
        ok(&e);
        let v: Value = serde_json::from_slice(&e.stdout).unwrap();
        assert!(v["loss"].as_f64().unwrap() < 5.0, "{v}");
    }
}

#[test]
fn nan_loss_names_the_step_and_layer_and_keeps_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let out = tmp.path().join("run");
    let mut args = small_run(s(&data), s(&out), "20");
    // an absurd learning rate: step 1 leaves weights near 1e30, step 2 overflows
    args.extend(["--lr", "1e30", "--warmup", "0", "--ckpt-every", "1"]);
    fails_at_the_end_with(&difftx(&args), &["step 2", "layer 0", "step-00000001"]);
    assert_eq!(checkpoints(&out), ["step-00000001"]);
    let m = difftx::Model::load(&out.join("checkpoints/step-00000001")).unwrap();
    assert!(m.params.iter().all(|p| p.is_finite()));
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[test]
fn failed_checkpoint_write_keeps_the_previous_checkpoint_and_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    // root ignores permission bits, so as root the runs drop to user `nobody`
    let as_user = |c: &mut Command| {
        if running_as_root() {
            c.uid(65534).gid(65534);
        }
    };
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let out = tmp.path().join("run");
    let mut args = small_run(s(&data), s(&out), "10");
    args.extend(["--ckpt-every", "5", "--keep-last", "5"]);
    let mut c = bin();
    c.args(&args);
    as_user(&mut c);
    ok(&c.output().unwrap());
    // as if the run had crashed after step 5, on a disk that then refuses writes
    let ck = out.join("checkpoints");
    std::fs::remove_dir_all(ck.join("step-00000010")).unwrap();
    let before = std::fs::read(ck.join("step-00000005/model.safetensors")).unwrap();
    std::fs::set_permissions(&ck, std::fs::Permissions::from_mode(0o555)).unwrap();
    args.push("--resume");
    let mut c = bin();
    c.args(&args);
    as_user(&mut c);
    let o = c.output().unwrap();
    std::fs::set_permissions(&ck, std::fs::Permissions::from_mode(0o755)).unwrap();
    fails_at_the_end_with(
        &o,
        &[
            "cannot write checkpoint step-00000010",
            "Permission denied",
            "previous checkpoint step-00000005 is intact",
        ],
    );
    assert_eq!(checkpoints(&out), ["step-00000005"]);
    let after = std::fs::read(ck.join("step-00000005/model.safetensors")).unwrap();
    assert!(before == after);
    assert!(difftx::Model::load(&ck.join("step-00000005")).is_ok());
}

/// A tmpfs of `bytes` mounted on `at` for as long as it lives; unmounted on drop, whatever
/// the test's outcome.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts it, or says why not (no root, or a sandbox that refuses mounts).
    fn mount(at: &Path, bytes: u64) -> Result<Tmpfs, String> {
        let o = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={}k", bytes.div_ceil(4096) * 4),
            ])
            .args(["tmpfs", s(at)])
            .output()
            .map_err(|e| e.to_string())?;
        match o.status.success() {
            true => Ok(Tmpfs(at.to_path_buf())),
            false => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let umount = |args: &[&str]| Command::new("umount").args(args).status();
        if !umount(&[s(&self.0)]).is_ok_and(|st| st.success()) {
            let _ = umount(&["-l", s(&self.0)]);
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn a_full_disk_keeps_the_previous_checkpoint_and_says_no_space_is_left() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    // 1. The run on an ordinary disk, to compare with and to size a checkpoint
    let (reference, full) = (tmp.path().join("reference"), tmp.path().join("full"));
    let mut args = small_run(s(&data), s(&reference), "10");
    args.extend(["--ckpt-every", "5", "--keep-last", "5"]);
    ok(&difftx(&args));
    let first = reference.join("checkpoints/step-00000005");
    let size = dir_bytes(&first);

    // 2. A filesystem with room for the first checkpoint and the run's other files, not a second
    std::fs::create_dir(&full).unwrap();
    let _mounted = match Tmpfs::mount(&full, size * 3 / 2 + (64 << 10)) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("SKIPPED: cannot mount a tmpfs: {e}");
            return;
        }
    };
    let out = full.join("run");
    args[6] = s(&out);
    let o = difftx(&args);
    fails_at_the_end_with(
        &o,
        &[
            "cannot write checkpoint step-00000010",
            "No space left on device",
            "the previous checkpoint step-00000005 is intact",
        ],
    );
    eprintln!(
        "{}",
        String::from_utf8_lossy(&o.stderr)
            .trim_end()
            .lines()
            .last()
            .unwrap()
    );

    // 3. The previous checkpoint is whole (its manifest verifies) and the reference's bits;
    //    the failed one left nothing behind
    let kept = out.join("checkpoints/step-00000005");
    assert!(difftx::Model::load(&kept).is_ok());
    for f in [
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(std::fs::read(kept.join(f)).unwrap() == std::fs::read(first.join(f)).unwrap());
    }
    let left: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["step-00000005"]);
}

#[test]
fn absurd_sizes_are_refused_before_allocating_with_the_figure_and_the_memory() {
    let (tmp, data, out) = demo_run();
    let huge = (1u64 << 40).to_string();
    let memory = ["would need", "GiB (parameters", "GiB of memory"];
    // training's activations: --batch, and --context with a batch that fits alone
    let run = |batch: &str, context: &str| {
        let o = tmp.path().join(format!("r{batch}x{context}"));
        let mut a = small_run(s(&data), s(&o), "2");
        for (flag, value) in [("--batch", batch), ("--context", context)] {
            let at = a.iter().position(|x| *x == flag).unwrap() + 1;
            a[at] = value;
        }
        difftx(&a)
    };
    let o = run(&huge, "32");
    fails_with(&o, &memory);
    fails_with(&o, &[&format!("--batch {huge} and --context 32")]);
    fails_with(&run("64", "1048576"), &memory);
    ok(&difftx(&small_run(s(&data), s(&out), "2")));
    let model = out.join("checkpoints/step-00000002");
    // evaluation's and the training benchmark's batches
    let e = difftx(&[
        "eval",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--batch",
        &huge,
    ]);
    fails_with(&e, &memory);
    fails_with(&difftx(&["bench", "memory", "--batch", &huge]), &memory);
    // the server's workspaces and KV caches for --parallel sequences
    let o = difftx(&[
        "serve",
        "--model",
        s(&model),
        "--port",
        "0",
        "--parallel",
        &huge,
    ]);
    fails_at_the_end_with(&o, &["serving --parallel", "KV caches", "GiB of memory"]);
}

#[test]
fn bad_input_is_one_line_naming_the_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let out = t.join("run");
    let o = s(&out);
    let empty = text_file(t, "empty.txt", "");
    fails_with(
        &difftx(&["train", "--data", s(&empty), "--out", o]),
        &["empty.txt", "empty data"],
    );
    let short = text_file(t, "short.txt", &"x".repeat(100));
    fails_with(
        &difftx(&["train", "--data", s(&short), "--out", o]),
        &["training data has 99 tokens", "window of 129"],
    );
    fails_with(
        &difftx(&["train", "--data", "/nonexistent/corpus.txt", "--out", o]),
        &["/nonexistent/corpus.txt"],
    );
    let data = text_file(t, "gpl.txt", DEMO);
    let bad_tok = text_file(t, "tokenizer.json", "{ not json");
    fails_with(
        &difftx(&[
            "train",
            "--data",
            s(&data),
            "--tokenizer",
            s(&bad_tok),
            "--out",
            o,
        ]),
        &["tokenizer.json", "cannot read tokenizer"],
    );
    fails_with(
        &difftx(&[
            "train",
            "--data",
            s(&data),
            "--attention",
            "standard",
            "--hidden-size",
            "102",
            "--out",
            o,
        ]),
        &["hidden_size (102)", "num_attention_heads (4)"],
    );
    fails_with(
        &difftx(&["train", "--data", s(&data), "--head-dim", "31", "--out", o]),
        &["head_dim (31) must be even"],
    );
    fails_with(
        &difftx(&[
            "train",
            "--data",
            s(&data),
            "--context",
            "40000",
            "--out",
            o,
        ]),
        &["fewer than one window of 40001"],
    );
    fails_with(
        &difftx(&["train", "--data", s(&data), "--preset", "huge", "--out", o]),
        &["unknown preset `huge`"],
    );
    let toml = text_file(t, "run.toml", "stepz = 3\n");
    fails_with(
        &difftx(&["train", "--config", s(&toml), "--out", o]),
        &["run.toml", "stepz"],
    );
    assert!(!out.exists(), "a failed start wrote into the run folder");
}

#[test]
fn nothing_saved_is_lost_when_a_rerun_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let out = tmp.path().join("run");
    let args = small_run(s(&data), s(&out), "6");
    ok(&difftx(&args));
    let snapshot = |p: &Path| {
        (
            std::fs::read(p.join("checkpoints/step-00000006/model.safetensors")).unwrap(),
            std::fs::read(p.join("metrics.jsonl")).unwrap(),
        )
    };
    let before = snapshot(&out);
    // the same command again, without --resume
    fails_with(
        &difftx(&args),
        &["already holds a training run", "--resume"],
    );
    // --resume with a setting that would change the run
    let mut changed = small_run(s(&data), s(&out), "6");
    changed.extend(["--lr", "0.5", "--resume"]);
    fails_with(&difftx(&changed), &["--resume: lr is 0.5", "used 0.001"]);
    // --resume with missing data
    let mut gone = small_run("/nonexistent/x.txt", s(&out), "6");
    gone.push("--resume");
    fails_with(&difftx(&gone), &["/nonexistent/x.txt"]);
    assert!(snapshot(&out) == before);
}

#[test]
fn config_file_settings_apply_and_flags_override_them() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let toml = text_file(
        tmp.path(),
        "run.toml",
        &format!(
            "data = [{:?}]\nattention = 'standard'\nhidden_size = 64\nmax_position_embeddings = 16\nbatch = 2\nsteps = 9\ngrad_accum = 2\neval_every = 4\n",
            s(&data)
        ),
    );
    let out = tmp.path().join("run");
    ok(&difftx(&[
        "train",
        "--config",
        s(&toml),
        "--steps",
        "5",
        "--out",
        s(&out),
    ]));
    let log = loss_log(&out);
    assert_eq!(log.len(), 5, "--steps overrides the file's 9");
    assert!(log[0].get("lambda").is_none(), "standard has no lambda");
    assert!(log[3]["val_loss"].is_f64() && log[4]["val_loss"].is_f64());
    assert!(log[2].get("val_loss").is_none());
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["run"]["model"]["max_position_embeddings"], 16);
    assert_eq!(run["run"]["train"]["grad_accum"], 2);
    assert_eq!(run["run"]["model"]["num_attention_heads"], 4);
}

#[test]
fn a_second_run_on_the_same_data_reuses_the_token_file() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let ea = ok(&difftx(&small_run(s(&data), s(&a), "2")));
    assert!(ea.contains("written to"), "{ea}");
    let cache: Vec<_> = std::fs::read_dir(tmp.path().join("token-cache"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(cache.len(), 1);
    // byte-level: u16 ids after a 32-byte header
    let len = cache[0].metadata().unwrap().len();
    assert_eq!(len, 32 + 2 * DEMO.len() as u64);
    let mtime = cache[0].metadata().unwrap().modified().unwrap();
    let eb = ok(&difftx(&small_run(s(&data), s(&b), "2")));
    assert!(eb.contains("(reusing"), "{eb}");
    assert_eq!(cache[0].metadata().unwrap().modified().unwrap(), mtime);

    // a damaged cache (an id outside the vocabulary) is tokenized again, not reused
    let good = std::fs::read(cache[0].path()).unwrap();
    let mut bad = good.clone();
    bad[32..34].copy_from_slice(&300u16.to_le_bytes());
    std::fs::write(cache[0].path(), bad).unwrap();
    let ec = ok(&difftx(&small_run(s(&data), s(&tmp.path().join("c")), "2")));
    assert!(
        ec.contains("written to") && !ec.contains("(reusing"),
        "{ec}"
    );
    assert!(std::fs::read(cache[0].path()).unwrap() == good);
}

#[test]
fn a_trained_bpe_tokenizer_trains_a_model_that_eval_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let tok = tmp.path().join("tok.json");
    ok(&difftx(&[
        "tokenizer",
        "train",
        "--data",
        s(&data),
        "--vocab-size",
        "400",
        "--out",
        s(&tok),
    ]));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&tok).unwrap()).unwrap();
    assert_eq!(v["model"]["type"], "BPE");
    assert_eq!(v["model"]["vocab"].as_object().unwrap().len(), 400);
    let out = tmp.path().join("run");
    let mut args = small_run(s(&data), s(&out), "4");
    args.extend(["--tokenizer", s(&tok)]);
    ok(&difftx(&args));
    let ck = out.join("checkpoints/step-00000004");
    assert!(ck.join("tokenizer.json").is_file());
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(ck.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["vocab_size"], 400);
    let e = difftx(&["eval", "--model", s(&ck), "--data", s(&data), "--json"]);
    let r: Value = serde_json::from_slice(&e.stdout).unwrap();
    // fewer tokens than bytes: the merges were learned and used
    let tokens = r["tokens"].as_u64().unwrap();
    assert!(tokens < DEMO.len() as u64 * 2 / 3, "{tokens} tokens");
    assert!(
        (r["loss"].as_f64().unwrap() - 400f64.ln()).abs() < 0.5,
        "{r}"
    );
}

#[test]
fn plot_overlays_several_runs_into_one_png() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", DEMO);
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    ok(&difftx(&small_run(s(&data), s(&a), "20")));
    let mut args = small_run(s(&data), s(&b), "20");
    args[8] = "standard";
    ok(&difftx(&args));
    assert!(a.join("loss.png").is_file());
    let png = tmp.path().join("both.png");
    let err = ok(&difftx(&["plot", s(&a), s(&b), "--out", s(&png)]));
    assert!(!err.contains("warning"), "{err}");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[1..4], b"PNG");
    // a run with another tokenizer counts other tokens: the plot says so
    let tok = tmp.path().join("tok.json");
    let bpe = [
        "tokenizer",
        "train",
        "--data",
        s(&data),
        "--vocab-size",
        "300",
    ];
    ok(&difftx(&[&bpe[..], &["--out", s(&tok)]].concat()));
    let c = tmp.path().join("c");
    let mut args = small_run(s(&data), s(&c), "5");
    args.extend(["--tokenizer", s(&tok)]);
    ok(&difftx(&args));
    let err = ok(&difftx(&["plot", s(&a), s(&c), "--out", s(&png)]));
    assert!(
        err.contains("warning: these runs use different tokenizers"),
        "{err}"
    );
    assert!(
        err.contains("byte-level") && err.contains("tok.json"),
        "{err}"
    );
    // bits per byte: byte-level runs convert, and steps and tokens both work as the x axis;
    // a tokenizer run does not record its bytes per token and is refused in one line
    let err = ok(&difftx(&[
        "plot",
        s(&a),
        s(&b),
        "--bits-per-byte",
        "--x-axis",
        "tokens",
        "--out",
        s(&png),
    ]));
    assert!(!err.contains("warning"), "{err}");
    fails_with(
        &difftx(&["plot", s(&a), s(&c), "--bits-per-byte", "--out", s(&png)]),
        &["tok.json", "bytes per token", "bits per byte"],
    );
    fails_with(
        &difftx(&["plot", s(&a), "/nonexistent/run", "--out", s(&png)]),
        &["/nonexistent/run/metrics.jsonl"],
    );
}

#[test]
fn a_resumed_run_prints_the_same_summary_and_counts_only_its_own_steps() {
    let (_tmp, data, out) = demo_run();
    let mut args = small_run(s(&data), s(&out), "20");
    args.extend(["--ckpt-every", "10"]);
    let first = ok(&difftx(&args));
    let summary = |err: &str| {
        err.lines()
            .find(|l| l.contains("matched at these settings"))
            .unwrap_or_else(|| panic!("no summary line in: {err}"))
            .to_string()
    };
    assert!(first.contains("done, 20 steps in "), "{first}");
    // back to step 10, then resume with nothing but --resume
    std::fs::remove_dir_all(out.join("checkpoints/step-00000020")).unwrap();
    let again = ok(&difftx(&["train", "--out", s(&out), "--resume"]));
    assert_eq!(summary(&again), summary(&first));
    assert!(again.contains("done, step 20: 10 steps in "), "{again}");
    assert!(again.contains("(resumed at 10)"), "{again}");
    // run.json records f32 settings as they were written
    let run_json = std::fs::read_to_string(out.join("run.json")).unwrap();
    assert!(run_json.contains("\"beta1\": 0.9,"), "{run_json}");
    assert!(run_json.contains("\"lr\": 0.001,"), "{run_json}");
}

#[test]
fn a_tokenizer_smaller_than_asked_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "gpl.txt", &DEMO[..4000]);
    let tok = tmp.path().join("tok.json");
    let err = ok(&difftx(&[
        "tokenizer",
        "train",
        "--data",
        s(&data),
        "--vocab-size",
        "70000",
        "--out",
        s(&tok),
    ]));
    assert!(
        err.contains("--vocab-size 70,000 asked for more tokens"),
        "{err}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&tok).unwrap()).unwrap();
    let n = v["model"]["vocab"].as_object().unwrap().len();
    let stopped = format!("BPE stopped at {}", difftx::util::thousands(n));
    assert!(err.contains(&stopped), "{err}: {n}");
}

#[test]
fn extend_steps_trains_past_the_end_at_the_final_learning_rate() {
    let (tmp, data, out) = demo_run();
    ok(&difftx(&small_run(s(&data), s(&out), "10")));
    // a larger --steps on resume is refused, with the way to do it
    let mut more = small_run(s(&data), s(&out), "15");
    more.push("--resume");
    fails_with(
        &difftx(&more),
        &["steps is 15", "used 10", "--extend-steps"],
    );
    let err = ok(&difftx(&[
        "train",
        "--out",
        s(&out),
        "--resume",
        "--extend-steps",
        "5",
    ]));
    assert!(
        err.contains("decays to 1.00e-4 by step 10, then stays there until step 15"),
        "{err}"
    );
    assert!(err.contains("done, step 15: 5 steps in "), "{err}");
    let log = loss_log(&out);
    assert_eq!(log.len(), 15);
    let lrs: Vec<f64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["lr"]
                .as_f64()
                .unwrap()
        })
        .collect();
    for lr in &lrs[9..] {
        assert!((lr - 1e-4).abs() < 1e-9, "{lrs:?}");
    }
    // extending again keeps the decay's end; --extend-steps without a run, or with --steps, refuses
    let err = ok(&difftx(&[
        "train",
        "--out",
        s(&out),
        "--resume",
        "--extend-steps",
        "2",
    ]));
    assert!(
        err.contains("by step 10, then stays there until step 17"),
        "{err}"
    );
    let fresh = tmp.path().join("fresh");
    fails_with(
        &difftx(&[
            "train",
            "--out",
            s(&fresh),
            "--resume",
            "--extend-steps",
            "2",
        ]),
        &["holds none"],
    );
    fails_with(
        &difftx(&[
            "train",
            "--out",
            s(&out),
            "--resume",
            "--extend-steps",
            "2",
            "--steps",
            "30",
        ]),
        &["give neither"],
    );
}

#[test]
fn a_second_trainer_on_one_run_folder_is_refused_until_the_first_dies() {
    let (_tmp, data, out) = demo_run();
    let mut args = small_run(s(&data), s(&out), "100000");
    args.extend(["--ckpt-every", "5"]);
    let mut first = bin()
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpoints_or_none(&out).is_empty() {
        assert!(Instant::now() < deadline, "no checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    // a second trainer, resuming or fresh, refuses in one line naming the holder
    let pid = first.id().to_string();
    let mut again = args.clone();
    again.push("--resume");
    fails_with(&difftx(&again), &[s(&out), "another process", &pid]);
    // SIGKILL leaves the lock file behind, but the OS lock is gone: a resume proceeds
    first.kill().unwrap();
    first.wait().unwrap();
    assert!(out.join("train.lock").is_file());
    let steps = checkpoints_or_none(&out).len();
    assert!(steps > 0);
    let mut resume = small_run(s(&data), s(&out), "100000");
    resume.extend(["--ckpt-every", "5", "--resume"]);
    let mut second = bin().args(&resume).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let _ = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    let code = second.wait().unwrap().code();
    assert!(
        matches!(code, Some(143) | Some(0)),
        "resume after SIGKILL: {code:?}"
    );
}

fn checkpoints_or_none(out: &Path) -> Vec<String> {
    if out.join("checkpoints").is_dir() {
        checkpoints(out)
    } else {
        Vec::new()
    }
}

#[test]
fn training_text_a_tokenizer_cannot_represent_is_refused_and_not_cached() {
    let tmp = tempfile::tempdir().unwrap();
    let words = ["[UNK]", "the", "cat", "sat", "on", "mat"];
    let vocab: serde_json::Map<String, Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.to_string(), i.into()))
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    });
    let tok = text_file(tmp.path(), "tok.json", &tok.to_string());
    let data = text_file(tmp.path(), "d.txt", &"the cat sat on the dog ".repeat(200));
    let out = tmp.path().join("run");
    let cache = tmp.path().join("cache");
    let args = [
        "train",
        "--data",
        s(&data),
        "--tokenizer",
        s(&tok),
        "--out",
        s(&out),
        "--context",
        "8",
        "--token-cache",
        s(&cache),
    ];
    fails_with(
        &difftx(&args),
        &[
            "d.txt",
            "cannot represent 600 of its 3400",
            "17.65%",
            "refused above 1%",
        ],
    );
    let left: Vec<_> = std::fs::read_dir(&cache).map_or(Vec::new(), |d| d.flatten().collect());
    assert!(left.is_empty(), "a refused text left {:?}", left[0].path());
    assert!(!out.exists());
}

/// A temporary folder holding a fresh `tiny` standard model (`m`) and the demo text.
fn standard_model_and_text() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("m");
    let data = text_file(tmp.path(), "demo.txt", DEMO);
    ok(&difftx(&[
        "init",
        "--attention",
        "standard",
        "--out",
        s(&model),
    ]));
    (tmp, model, data)
}

/// Fine-tuning: `--init-from` starts from a model's weights (at learning rate 0 they stay bit
/// for bit as they were, through a resume too), takes its config and tokenizer, and refuses
/// flags that would give another model.
#[test]
fn init_from_starts_from_the_models_weights_and_refuses_another_shape() {
    let (tmp, model, data) = standard_model_and_text();
    let run = tmp.path().join("r");
    let lr0 = [
        "--lr",
        "0",
        "--min-lr",
        "0",
        "--batch",
        "2",
        "--eval-every",
        "3",
    ];
    let mut args = vec!["train", "--init-from", s(&model), "--data", s(&data)];
    args.extend(lr0);
    args.extend(["--steps", "3", "--out", s(&run)]);
    let err = ok(&difftx(&args));
    assert!(
        err.contains("fine-tuning") && err.contains("starting from the weights"),
        "{err}"
    );
    let original = std::fs::read(model.join("model.safetensors")).unwrap();
    let step3 = run.join("checkpoints/step-00000003/model.safetensors");
    assert!(
        std::fs::read(step3).unwrap() == original,
        "weights moved at lr 0"
    );
    // a resumed fine-tuning run keeps its model and its start
    ok(&difftx(&[
        "train",
        "--resume",
        "--extend-steps",
        "2",
        "--out",
        s(&run),
    ]));
    let step5 = run.join("checkpoints/step-00000005/model.safetensors");
    assert!(
        std::fs::read(step5).unwrap() == original,
        "weights moved at lr 0"
    );
    // flags that contradict the model, each one line naming both values
    let refused: [(&[&str], &[&str]); 4] = [
        (
            &["--hidden-size", "999"],
            &["--hidden-size 999", "hidden_size is 128"],
        ),
        (
            &["--attention", "diff_v1"],
            &["--attention diff_v1", "retrofit"],
        ),
        (&["--preset", "small"], &["--preset small", "--init-from"]),
        (
            &["--tokenizer", "/nonexistent/tokenizer.json"],
            &["/nonexistent/tokenizer.json"],
        ),
    ];
    for (i, (flags, needles)) in refused.iter().enumerate() {
        let out = tmp.path().join(format!("bad{i}"));
        let mut args = vec!["train", "--init-from", s(&model), "--data", s(&data)];
        args.extend(*flags);
        args.extend(["--out", s(&out)]);
        fails_with(&difftx(&args), needles);
        assert!(!out.join("checkpoints").exists(), "{flags:?} wrote a run");
    }
    // a Hugging Face Llama directory brings its tokenizer.json along
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama_gqa");
    let out = tmp.path().join("hf");
    let args = [
        "train",
        "--init-from",
        s(&hf),
        "--data",
        s(&data),
        "--steps",
        "2",
    ];
    ok(&difftx(
        &[&args[..], &["--batch", "2", "--out", s(&out)]].concat(),
    ));
    let run_json: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    let tok = run_json["run"]["tokenizer"].as_str().unwrap();
    assert!(tok.ends_with("llama_gqa/tokenizer.json"), "{tok}");
}

/// Context extension (paper §3.3): `--init-from` with a longer `--context` and a larger
/// `--rope-theta` keeps every weight (at learning rate 0, bit for bit) and records the new
/// context and θ in the checkpoint's config, through a resume too; `init --context` sets a
/// model's context.
#[test]
fn context_extension_keeps_every_weight_and_takes_the_new_context_and_theta() {
    let tmp = tempfile::tempdir().unwrap();
    let data = text_file(tmp.path(), "demo.txt", DEMO);
    let model = tmp.path().join("m");
    let init = ["init", "--attention", "diff_v1", "--context", "48"];
    let err = ok(&difftx(&[&init[..], &["--out", s(&model)]].concat()));
    assert!(err.contains("context 48"), "{err}");
    let config = |dir: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
    };
    assert_eq!(config(&model)["max_position_embeddings"], 48);
    let run = tmp.path().join("long");
    let args = [
        "train",
        "--init-from",
        s(&model),
        "--context",
        "96",
        "--rope-theta",
        "40000",
        "--lr",
        "0",
        "--min-lr",
        "0",
        "--batch",
        "2",
        "--steps",
        "2",
        "--data",
        s(&data),
    ];
    ok(&difftx(&[&args[..], &["--out", s(&run)]].concat()));
    ok(&difftx(&[
        "train",
        "--resume",
        "--extend-steps",
        "1",
        "--out",
        s(&run),
    ]));
    let original = std::fs::read(model.join("model.safetensors")).unwrap();
    for step in ["00000002", "00000003"] {
        let ck = run.join(format!("checkpoints/step-{step}"));
        assert!(std::fs::read(ck.join("model.safetensors")).unwrap() == original);
        let c = config(&ck);
        assert_eq!(c["max_position_embeddings"], 96, "{c}");
        assert_eq!(c["rope_theta"], 40000.0, "{c}");
    }
    // the extended model scores windows of its new context
    let e = difftx(&["eval", "--model", s(&run), "--data", s(&data), "--json"]);
    let v: Value = serde_json::from_slice(&e.stdout).unwrap();
    assert_eq!(v["length"], 96, "{}", ok(&e));
}

/// `retrofit`: a standard model into diff_v2 at no loss gap, then fine-tuned with
/// `--init-from`; a diff model is refused in one line.
#[test]
fn retrofit_to_diff_v2_keeps_the_loss_and_fine_tunes() {
    let (tmp, model, data) = standard_model_and_text();
    let retro = tmp.path().join("retro");
    let args = ["retrofit", "--model", s(&model), "--attention", "diff_v2"];
    let err = ok(&difftx(
        &[&args[..], &["--data", s(&data), "--out", s(&retro)]].concat(),
    ));
    assert!(err.contains("(gap +0.0000)"), "{err}");
    let again = tmp.path().join("again");
    let args = ["retrofit", "--model", s(&retro), "--attention", "diff_v1"];
    fails_with(
        &difftx(&[&args[..], &["--out", s(&again)]].concat()),
        &["already diff_v2"],
    );
    assert!(!again.exists());
    let run = tmp.path().join("run");
    let args = [
        "train",
        "--init-from",
        s(&retro),
        "--data",
        s(&data),
        "--steps",
        "2",
    ];
    let err = ok(&difftx(
        &[&args[..], &["--batch", "2", "--out", s(&run)]].concat(),
    ));
    assert!(
        err.contains("fine-tuning") && err.contains("diff_v2"),
        "{err}"
    );
}

#[test]
fn a_damaged_newest_checkpoint_is_named_and_resume_falls_back_to_the_previous_one() {
    // 1. A finished run with checkpoints at steps 3 and 6
    let (_tmp, data, out) = demo_run();
    let mut args = small_run(s(&data), s(&out), "6");
    args.extend(["--ckpt-every", "3", "--keep-last", "2", "--resume"]);
    ok(&difftx(&args));
    assert_eq!(checkpoints(&out), ["step-00000003", "step-00000006"]);
    let newest = out.join("checkpoints/step-00000006");
    let files = [
        "config.json",
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
        "manifest.json",
    ];
    let pristine: Vec<Vec<u8>> = files
        .iter()
        .map(|f| std::fs::read(newest.join(f)).unwrap())
        .collect();
    for (f, good) in files.iter().zip(&pristine) {
        // 2. One byte of one file of the newest checkpoint altered, its size unchanged
        let path = newest.join(f);
        let mut bad = good.clone();
        bad[good.len() / 2] ^= 0x01;
        std::fs::write(&path, &bad).unwrap();
        let e = eval_run_folder(&out, &data);
        assert_eq!(e.status.code(), Some(1));
        let msg = String::from_utf8_lossy(&e.stderr);
        assert!(msg.contains(&format!("{}:", path.display())), "{f}: {msg}");
        // 3. --resume names it in one line, retrains from step 3, ends on the same bits
        let err = ok(&difftx(&args));
        let skipped: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("skipping damaged checkpoint"))
            .collect();
        assert_eq!(skipped.len(), 1, "{f}: {err}");
        assert!(skipped[0].contains(&path.display().to_string()), "{err}");
        assert!(err.contains("step-00000003"), "{f}: {err}");
        for (g, want) in files.iter().zip(&pristine) {
            let got = std::fs::read(newest.join(g)).unwrap();
            assert!(&got == want, "{g} differs after falling back ({f} damaged)");
        }
    }
}

fn eval_run_folder(out: &Path, data: &Path) -> Output {
    difftx(&["eval", "--model", s(out), "--data", s(data)])
}

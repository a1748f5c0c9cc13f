//! `difftx repro`: the paper's claims measured side by side over the three kinds.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:
  difftx repro --quick --out runs/repro-quick      (smoke run, about 15 s on 2 cores)
  difftx repro --dry-run --out runs/repro          (print what the full run will do)
  difftx repro --out runs/repro                    (full run: 3 kinds × 3 seeds, about 35 min on 2 cores)
  difftx repro --long --quick --out runs/long-quick (the long-context study's smoke run)
  difftx repro --long --dry-run --out runs/long     (the long-context study's plan)
  bash scripts/long_corpus.sh && difftx repro --long --out runs/long
                                                   (the study on a real corpus; resumable)")]
pub struct ReproArgs {
    /// The long-context study (docs/REPRO_LONG.md): pretrain on a corpus, extend the context
    /// 4×, score loss by position and needles. Rerun the command to continue after a stop.
    #[arg(long)]
    pub long: bool,
    /// Smoke run: tiny models, few steps, two context lengths; CI runs it.
    #[arg(long)]
    pub quick: bool,
    /// Seeds per kind [default: 3, or 1 with --quick].
    #[arg(long)]
    pub seeds: Option<usize>,
    /// Training steps of each needle model, overriding the plan's (to time or shorten a run).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Text: a file or a folder of fortunes [default: /usr/share/games/fortunes, the demo
    /// text with --quick]; with --long, the corpus folder [default: corpus/long].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Output folder: REPRO.md, needle_heatmap.png, results.json, models/.
    #[arg(long)]
    pub out: PathBuf,
    /// Print the plan and exit without training.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(a: ReproArgs) -> Result<()> {
    use difftx::experiments::corpus::{Corpus, FORTUNES_DIR};
    if a.long {
        return run_long(a);
    }
    use difftx::experiments::repro::{run_repro, ReproPlan};
    let mut plan = if a.quick {
        ReproPlan::quick()
    } else {
        ReproPlan::full()
    };
    if let Some(n) = a.seeds {
        plan.seeds = n;
    }
    if let Some(n) = a.steps {
        plan.train.steps = n;
        plan.train.warmup = plan.train.warmup.min(n / 10);
    }
    plan.validate()?;
    for line in plan.describe() {
        eprintln!("repro: {line}");
    }
    let corpus = match (&a.corpus, a.quick) {
        (Some(p), _) => Corpus::load(p)?,
        (None, true) => Corpus {
            text: difftx::experiments::demo::DEMO_TEXT.as_bytes().to_vec(),
            line: format!(
                "the built-in demo text (data/demo.txt, {} bytes; the last 10% is validation)",
                difftx::experiments::demo::DEMO_TEXT.len()
            ),
        },
        // A dry run states the plan even where the default corpus is not installed yet.
        (None, false) => match Corpus::load(std::path::Path::new(FORTUNES_DIR)) {
            Err(e) if a.dry_run => Corpus {
                text: Vec::new(),
                line: format!("{e} (scripts/repro.sh installs it)"),
            },
            r => r?,
        },
    };
    eprintln!("repro: corpus: {}", corpus.line);
    if a.dry_run {
        return Ok(());
    }
    let report = run_repro(&plan, &corpus, &a.out, &command_line(), |line| {
        eprintln!("repro: {line}")
    })?;
    eprintln!("repro: wrote {}", report.display());
    Ok(())
}

/// The command as typed, for the report.
fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, arg)| {
            if i == 0 {
                "difftx".to_string()
            } else if arg.is_empty() || arg.contains(char::is_whitespace) {
                format!("'{arg}'")
            } else {
                arg
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `repro --long`: the plan, the corpus (the demo text split in two for --quick), the units.
fn run_long(a: ReproArgs) -> Result<()> {
    use difftx::experiments::long::{run_long, Ended, LongCorpus, LongPlan};
    // 1. The plan
    let mut plan = if a.quick {
        LongPlan::quick()
    } else {
        LongPlan::full()
    };
    if let Some(n) = a.seeds {
        plan.seeds = n;
    }
    if let Some(n) = a.steps {
        plan.steps = n;
    }
    plan.validate()?;
    let describe = || {
        for line in plan.describe() {
            eprintln!("repro --long: {line}");
        }
    };
    // 2. The corpus
    let corpus = match (&a.corpus, a.quick) {
        (Some(dir), _) => LongCorpus::open(dir),
        (None, true) if !a.dry_run => Ok(quick_corpus(&a.out)?),
        (None, _) => LongCorpus::open(std::path::Path::new("corpus/long")),
    };
    let corpus = match corpus {
        Err(e) if a.dry_run => {
            describe();
            eprintln!("repro --long: corpus: {e}");
            return Ok(());
        }
        c => c?,
    };
    if a.dry_run {
        describe();
        eprintln!("repro --long: corpus: {}", corpus.train.display());
        return Ok(());
    }
    difftx::experiments::long::run::check_plan(&plan, &corpus, &a.out)?;
    describe();
    // 3. The units, each with a progress bar; Ctrl-C stops with a checkpoint
    let stop = super::progress::Stop::new()?;
    let mut observer = |name: &str| -> Box<dyn difftx::train::Observer> {
        Box::new(super::progress::Progress::new(name, None))
    };
    let mut note = |line: &str| eprintln!("repro --long: {line}");
    let command = command_line();
    match run_long(
        &plan,
        &corpus,
        &a.out,
        &command,
        &stop.flag,
        &mut observer,
        &mut note,
    )? {
        Ended::Report(p) => eprintln!("repro --long: wrote {}", p.display()),
        Ended::Interrupted => {
            eprintln!("repro --long: interrupted; run the same command again to continue");
            return Err(stop.interrupted().into());
        }
    }
    Ok(())
}

/// The quick run's corpus: the demo text's first 90% to train on, the rest to validate,
/// byte-level, written into OUT/corpus.
fn quick_corpus(out: &std::path::Path) -> Result<difftx::experiments::long::LongCorpus> {
    let dir = out.join("corpus");
    std::fs::create_dir_all(&dir)?;
    let text = difftx::experiments::demo::DEMO_TEXT;
    let cut = text[..text.len() * 9 / 10]
        .rfind('\n')
        .map_or(text.len() * 9 / 10, |p| p + 1);
    difftx::util::write_atomic(&dir.join("train.txt"), &text.as_bytes()[..cut])?;
    difftx::util::write_atomic(&dir.join("valid.txt"), &text.as_bytes()[cut..])?;
    Ok(difftx::experiments::long::LongCorpus::open(&dir)?)
}

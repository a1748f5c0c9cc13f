//! `difftx repro`: the paper's claims measured side by side over the three kinds.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
#[command(after_help = "Examples:
  difftx repro --quick --out runs/repro-quick      (smoke run, about 15 s on 2 cores)
  difftx repro --dry-run --out runs/repro          (print what the full run will do)
  difftx repro --out runs/repro                    (full run: 3 kinds × 3 seeds, about 35 min on 2 cores)")]
pub struct ReproArgs {
    /// Smoke run: tiny models, few steps, two context lengths; CI runs it.
    #[arg(long)]
    pub quick: bool,
    /// Seeds per kind [default: 3, or 1 with --quick].
    #[arg(long)]
    pub seeds: Option<usize>,
    /// Training steps of each needle model, overriding the plan's (to time or shorten a run).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Text for the language-modelling and ablation part: a text file or a folder of fortune
    /// files [default: /usr/share/games/fortunes (Debian's `fortunes`; scripts/repro.sh
    /// installs it), or the built-in demo text with --quick].
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
    let command = std::env::args()
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
        .join(" ");
    let report = run_repro(&plan, &corpus, &a.out, &command, |line| {
        eprintln!("repro: {line}")
    })?;
    eprintln!("repro: wrote {}", report.display());
    Ok(())
}

//! The `difftx` command line. `main` parses and routes; each command's arguments and printing
//! live in `cli/` (one file per command), and everything that computes lives in the library.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

mod cli;

use anyhow::{bail, Result};
use clap::FromArgMatches;
use cli::args::{command, Cli, Cmd, NO_BF16};
use difftx::kernels::Precision;

fn main() {
    let matches = command().get_matches();
    // Die quietly on a closed pipe (`difftx … | head`), as Unix tools do, instead of panicking.
    // Not the server: a client that hangs up must cost it one request, not the process (its
    // HTTP stack writes with writev, which raises SIGPIPE on a reset connection).
    if matches.subcommand_name() != Some("serve") {
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(e) = try_main(cli, matches.subcommand_name().unwrap_or("")) {
        // A run stopped by a signal has said so; it exits as shells report a signal (130, 143).
        if let Some(cli::progress::Interrupted(code)) = e.downcast_ref() {
            std::process::exit(*code);
        }
        // One line: the error and its causes, no backtrace.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn try_main(cli: Cli, name: &str) -> Result<()> {
    if cli.bf16 && name == "repro" {
        bail!("--bf16 does not apply to `difftx repro`: its experiments run in f32, as the published report's do; leave it off");
    }
    if cli.bf16 && NO_BF16.contains(&name) {
        bail!("--bf16 changes nothing for `difftx {name}`, which runs no matrix products; leave it off");
    }
    if let Some(n) = cli.threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()?;
    }
    let Some(precision) = Precision::new(cli.bf16) else {
        bail!(
            "--bf16 needs {}; this machine has none, so leave it off",
            Precision::bf16_requirement()
        );
    };
    match cli.cmd {
        Cmd::Demo(a) => cli::demo::run(a, precision),
        Cmd::Train(a) => cli::train::run(*a, precision),
        Cmd::Tokenizer(c) => cli::tokenizer::run(c),
        Cmd::Plot(a) => cli::plot::run(a),
        Cmd::Eval(a) => cli::eval::run(a, precision),
        Cmd::Generate(a) => cli::generate::run(a, precision),
        Cmd::Repro(a) => cli::repro::run(a),
        Cmd::Needle(a) => cli::needle::run(a, precision),
        Cmd::AttentionMap(a) => cli::attention_map::run(a, precision),
        Cmd::Export(a) => cli::export::run(a),
        Cmd::Init(a) => cli::init::run(a),
        Cmd::Retrofit(a) => cli::retrofit::run(a, precision),
        #[cfg(feature = "serve")]
        Cmd::Serve(a) => cli::serve::run(*a, precision),
        Cmd::Bench(c) => cli::bench::run(c, precision),
        Cmd::Presets => {
            cli::presets::run();
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::args::Cli;
    use clap::CommandFactory;

    /// Every flag of every command says what it does in `--help`.
    #[test]
    fn every_flag_has_a_description() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if id != "help" && id != "version" && a.get_help().is_none() {
                    missing.push(format!("{path} --{id}"));
                }
            }
            for s in cmd.get_subcommands() {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "difftx", &mut missing);
        assert!(missing.is_empty(), "flags without help: {missing:?}");
        Cli::command().debug_assert();
        crate::cli::args::command().debug_assert();
    }

    /// `--bf16` shows in the help of the commands it changes, and only there.
    #[test]
    fn bf16_is_in_the_help_where_it_matters() {
        let help = |path: &[&str]| {
            let mut c = crate::cli::args::command();
            c.build();
            let mut sub = &mut c;
            for p in path {
                sub = sub.find_subcommand_mut(p).unwrap();
            }
            sub.render_long_help().to_string()
        };
        for p in [
            &["eval"][..],
            &["train"],
            &["generate"],
            &["bench", "decode"],
        ] {
            assert!(help(p).contains("--bf16"), "{p:?}");
        }
        for p in [
            &["plot"][..],
            &["presets"],
            &["tokenizer", "train"],
            &["repro"],
        ] {
            assert!(!help(p).contains("--bf16"), "{p:?}");
        }
    }
}

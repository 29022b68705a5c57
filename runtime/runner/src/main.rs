//! `kiln-run`: runs and inspects `.kiln` artifacts with the runtime alone.
//! The same commands as `kiln run` and `kiln inspect`, in a binary without
//! the compiler — small enough to ship to an edge box or a robot next to its
//! artifacts.

use clap::{Parser, Subcommand};
use kiln_runner::{cmd_inspect, cmd_run, RunArgs};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "kiln-run", version, about = "Runs and inspects .kiln artifacts (kiln's runtime, no compiler)")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an artifact with inputs from .npy files.
    #[command(
        after_help = "Examples:\n  kiln-run run model.kiln --input 0=x.npy --output-dir out/\n  kiln-run run policy.kiln --steps log/ --output-dir out/ --json"
    )]
    Run(Box<RunArgs>),
    /// Describe an artifact: inputs, outputs, kernels, memory.
    Inspect {
        artifact: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Run(args) => cmd_run(&args),
        Command::Inspect { artifact, json } => cmd_inspect(&artifact, json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

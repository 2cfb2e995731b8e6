//! `hetmem`: information, the KV-cache demo, and benchmarks.

mod args;
mod bench;
mod common;
mod demo;
mod info;

use clap::{Parser, Subcommand};

/// hetmem: a heterogeneous-memory runtime (Level Zero virtual memory and memory extensions,
/// ACL managed memory) over host and CUDA backends.
#[derive(Parser, Debug)]
#[command(name = "hetmem", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Backend, driver, devices and the configuration in force.
    Info(info::Args),
    /// The main job: a growable KV cache over virtual memory, driven by LLM request sizes.
    Demo(demo::Args),
    /// Benchmarks, each against its raw baseline in the same run.
    Bench(bench::Args),
}

fn main() {
    // Die quietly on a closed pipe (`hetmem info | head`), as command-line tools do.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Info(a) => info::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = r {
        eprintln!("hetmem: {e}");
        std::process::exit(1);
    }
}

//! `pmovmm`: a KVM virtual machine monitor for encrypted persistent memory objects.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use pmovmm::cli::cxl::{self, CxlCommand};
use pmovmm::cli::store::{self, StoreCommand};
use pmovmm::config::{ConsoleOutput, RunArgs, VmConfig};
use pmovmm::exit::ExitReason;
use pmovmm::machine::Machine;
use pmovmm::sandbox::VmSandbox;

/// pmovmm: boots a Linux guest with encrypted persistent memory objects.
#[derive(Parser)]
#[command(name = "pmovmm", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Boot a guest and run it until it powers off.
    ///
    /// Exit status: 0 when the guest powers off or reboots, 2 when the guest
    /// kernel panicked, 3 when a vCPU triple-faulted, 1 on VMM errors.
    Run(Box<RunArgs>),
    /// Manage a PMO store file on the host (the guest is not involved).
    #[command(subcommand)]
    Store(StoreCommand),
    /// Manage CXL Type 3 media files on the host (the guest is not involved).
    #[command(subcommand)]
    Cxl(CxlCommand),
}

fn run(args: &RunArgs) -> Result<std::convert::Infallible, String> {
    let cfg = VmConfig::from_args(args).map_err(|e| e.to_string())?;
    pmovmm::machine::block_sigterm().map_err(|e| format!("block SIGTERM: {e}"))?;
    // Before the machine is built: every thread it starts confines itself.
    let sandbox = VmSandbox::install(&cfg).map_err(|e| e.to_string())?;
    let interactive = cfg.console == ConsoleOutput::Stdout && std::io::stdin().is_terminal();
    let mut machine = Machine::new(&cfg).map_err(|e| e.to_string())?;
    let reason = machine
        .run(interactive, Some(&sandbox))
        .map_err(|e| e.to_string())?;
    match &reason {
        ExitReason::PowerOff => log::info!("guest powered off"),
        ExitReason::Reset => log::info!("guest requested a reset; stopping"),
        ExitReason::Panic => eprintln!("pmovmm: guest kernel panicked"),
        ExitReason::TripleFault => eprintln!("pmovmm: guest triple-faulted"),
        ExitReason::Error(e) => eprintln!("pmovmm: {e}"),
    }
    // vCPU threads may still sit in KVM_RUN on guest memory the machine owns:
    // end the process here, before anything is torn down under them.
    std::process::exit(reason.exit_code());
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(&args).map(|never| match never {}),
        Command::Store(cmd) => store::run(cmd).map_err(|e| e.to_string()),
        Command::Cxl(cmd) => cxl::run(cmd).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("pmovmm: {msg}");
            ExitCode::FAILURE
        }
    }
}

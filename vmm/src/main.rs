//! `pmovmm`: a KVM virtual machine monitor for encrypted persistent memory objects.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pmo_store::crypto::KdfParams;
use pmo_store::CreateOptions;
use pmo_virtio::cli_support as store_cli;
use pmo_virtio::cli_support::StoreFile;

use pmovmm::config::{ConsoleOutput, RunArgs, VmConfig};
use pmovmm::exit::ExitReason;
use pmovmm::machine::{Console, Machine, MachineConfig};

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
    Run(RunArgs),
    /// Manage a PMO store file on the host (the guest is not involved).
    #[command(subcommand)]
    Store(StoreCommand),
    /// Manage CXL Type 3 media files on the host (the guest is not involved).
    #[command(subcommand)]
    Cxl(CxlCommand),
}

#[derive(Subcommand)]
enum CxlCommand {
    /// Create the media file of a --cxl-t3 device (refuses to overwrite a non-empty file),
    /// so its final size is known before a VM starts.
    Create {
        file: PathBuf,
        /// Device capacity: a non-zero multiple of 256M.
        #[arg(long)]
        size: String,
    },
}

fn cxl(cmd: CxlCommand) -> Result<(), String> {
    match cmd {
        CxlCommand::Create { file, size } => {
            refuse_overwrite(&file)?;
            let size = pmovmm::config::parse_size(&size).map_err(|e| e.to_string())?;
            if size == 0 || !size.is_multiple_of(pmovmm::config::CXL_ALIGN) {
                return Err(format!("size {size}: not a non-zero multiple of 256M"));
            }
            let cfg = cxl_t3::expander::ExpanderConfig::new(&file, size);
            let e = |err: cxl_t3::expander::ExpanderError| format!("{}: {err}", file.display());
            let exp = cxl_t3::expander::Expander::open(&cfg).map_err(e)?;
            exp.shutdown().map_err(e)?;
        }
    }
    Ok(())
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Format a new store file (refuses to overwrite a non-empty file).
    Create {
        file: PathBuf,
        /// Size of the store, bytes or with a K/M/G/T suffix (sparse on disk).
        #[arg(long)]
        size: String,
        /// PMO table slots: the most PMOs the store can hold [default: 65536].
        #[arg(long)]
        slots: Option<u32>,
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// Create a PMO in a store, as the guest's pcreate would.
    Mkpmo {
        file: PathBuf,
        name: String,
        size: String,
        #[command(flatten)]
        key: KeyArg,
        /// Default design of its attach sessions: wedi, bp-ip, bp-id, sp-ip, sp-id, d.
        #[arg(long, default_value = "d")]
        design: String,
        /// Page cipher and tag: xts-blake3, paper, aes-gcm.
        #[arg(long, default_value = "xts-blake3")]
        suite: String,
        /// Argon2id cost of the key derivation: m=SIZE,t=PASSES,p=LANES or fast
        /// [default: m=64M,t=3,p=1].
        #[arg(long, value_name = "m=SIZE,t=N,p=N|fast")]
        kdf: Option<String>,
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// List the PMOs in a store.
    Ls {
        file: PathBuf,
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// Show the store's on-media layout and every PMO record (no key needed).
    Inspect { file: PathBuf },
    /// Run recovery and a keyless structural check of every PMO.
    Fsck {
        file: PathBuf,
        #[command(flatten)]
        anchor: AnchorArg,
    },
    /// Destroy a PMO: its data is scrubbed and its space reclaimed.
    Destroy {
        file: PathBuf,
        name: String,
        #[command(flatten)]
        key: KeyArg,
        #[command(flatten)]
        anchor: AnchorArg,
    },
}

/// Keys come from a file, never from the command line (where `ps` would show them).
#[derive(Args)]
struct KeyArg {
    /// File holding the PMO's key (its bytes, up to 64; a trailing newline is dropped).
    #[arg(long, value_name = "FILE")]
    key_file: PathBuf,
}

/// The store's rollback anchor, as `pmovmm run --pmo-anchor` takes it.
#[derive(Args)]
struct AnchorArg {
    /// Rollback anchor kept outside the store: a store older than it is refused; created from
    /// the store when missing.
    #[arg(long, value_name = "FILE")]
    anchor: Option<PathBuf>,
}

fn store(cmd: StoreCommand) -> Result<(), String> {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let e = |e: store_cli::CliError| e.to_string();
    match cmd {
        StoreCommand::Create {
            file,
            size,
            slots,
            anchor,
        } => {
            refuse_overwrite(&file)?;
            let size = store_cli::parse_size(&size).map_err(e)?;
            let sf = StoreFile {
                path: &file,
                anchor: anchor.anchor.as_deref(),
            };
            store_cli::store_create(sf, size, slots, &mut out, &mut err).map_err(e)?;
        }
        StoreCommand::Mkpmo {
            file,
            name,
            size,
            key,
            design,
            suite,
            kdf,
            anchor,
        } => {
            let opts = CreateOptions {
                design: store_cli::parse_design(&design).map_err(e)?,
                suite: store_cli::parse_suite(&suite).map_err(e)?,
                kdf: Some(match kdf {
                    Some(k) => KdfParams::parse(&k).map_err(|err| format!("--kdf: {err}"))?,
                    None => KdfParams::DEFAULT,
                }),
            };
            let size = store_cli::parse_size(&size).map_err(e)?;
            let key = store_cli::read_key_file(&key.key_file).map_err(e)?;
            let sf = StoreFile {
                path: &file,
                anchor: anchor.anchor.as_deref(),
            };
            store_cli::pmo_create(sf, &name, size, &key, opts, &mut out).map_err(e)?;
        }
        StoreCommand::Ls { file, anchor } => {
            let sf = StoreFile {
                path: &file,
                anchor: anchor.anchor.as_deref(),
            };
            store_cli::store_ls(sf, &mut out).map_err(e)?;
        }
        StoreCommand::Inspect { file } => {
            store_cli::store_inspect(&file, &mut out).map_err(e)?;
        }
        StoreCommand::Fsck { file, anchor } => {
            let sf = StoreFile {
                path: &file,
                anchor: anchor.anchor.as_deref(),
            };
            let report = store_cli::store_fsck(sf, &mut out, &mut err).map_err(e)?;
            if !report.problems.is_empty() {
                return Err(format!(
                    "{}: {} problem(s) found",
                    file.display(),
                    report.problems.len()
                ));
            }
        }
        StoreCommand::Destroy {
            file,
            name,
            key,
            anchor,
        } => {
            let key = store_cli::read_key_file(&key.key_file).map_err(e)?;
            let sf = StoreFile {
                path: &file,
                anchor: anchor.anchor.as_deref(),
            };
            store_cli::store_destroy(sf, &name, &key, &mut out).map_err(e)?;
        }
    }
    Ok(())
}

/// Formatting truncates: never do it to a file that holds anything.
fn refuse_overwrite(file: &Path) -> Result<(), String> {
    match std::fs::metadata(file) {
        Ok(m) if m.len() > 0 => Err(format!(
            "{}: exists and is not empty; refusing to format over it",
            file.display()
        )),
        _ => Ok(()),
    }
}

fn machine_config(cfg: VmConfig) -> MachineConfig {
    MachineConfig {
        kernel: cfg.kernel,
        initrd: cfg.initrd,
        cmdline: cfg.cmdline,
        memory: cfg.memory,
        cpus: cfg.cpus,
        pmem: cfg
            .pmem
            .into_iter()
            .map(|p| (p.path, Some(p.size)))
            .collect(),
        console: match cfg.console {
            ConsoleOutput::Stdout => Console::Stdout,
            ConsoleOutput::File(p) => Console::File(p),
        },
        pmo: cfg.pmo,
        cxl_t3: cfg.cxl_t3,
    }
}

fn run(args: &RunArgs) -> Result<std::convert::Infallible, String> {
    let cfg = VmConfig::from_args(args).map_err(|e| e.to_string())?;
    pmovmm::machine::block_sigterm().map_err(|e| format!("block SIGTERM: {e}"))?;
    let interactive = cfg.console == ConsoleOutput::Stdout && std::io::stdin().is_terminal();
    let mut machine = Machine::new(&machine_config(cfg)).map_err(|e| e.to_string())?;
    let reason = machine.run(interactive).map_err(|e| e.to_string())?;
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
        Command::Store(cmd) => store(cmd),
        Command::Cxl(cmd) => cxl(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("pmovmm: {msg}");
            ExitCode::FAILURE
        }
    }
}

//! Why a configuration was rejected.

use std::io;
use std::path::{Path, PathBuf};

use sizes::{ByteSize, SizeError};

use super::{MAX_CPUS, MAX_CXL_T3, MAX_MEMORY, MIN_MEMORY};
use crate::layout;

/// Why a configuration was rejected; each message is one line that names the offending value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `--seccomp` is not on, log or off.
    #[error("seccomp \"{0}\": expected on, log or off")]
    InvalidSeccomp(String),
    /// `--landlock` is not on, require or off.
    #[error("landlock \"{0}\": expected on, require or off")]
    InvalidLandlock(String),
    /// Neither `--kernel` nor `kernel` in the file.
    #[error("no kernel given: use --kernel FILE or `kernel` in the config file")]
    MissingKernel,
    /// A file that cannot be used; `what` says which ("kernel file", ...).
    #[error("{what} {}: {reason}", path.display())]
    File {
        /// Which file it is to the VM.
        what: &'static str,
        /// Its path as given (resolved against the config file's directory).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The TOML file does not parse or has unknown or mistyped fields.
    #[error("config file {}: {reason}", path.display())]
    ConfigFile {
        /// The `--config` file.
        path: PathBuf,
        /// Where and why, one line.
        reason: String,
    },
    /// A size that does not parse.
    #[error(transparent)]
    Size(#[from] SizeError),
    /// A device option string (`--pmem` ...) that does not parse.
    #[error("invalid {option} \"{text}\": {reason}")]
    InvalidOption {
        /// The option's name without dashes.
        option: &'static str,
        /// Its value as given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Guest RAM that is not a whole number of 2 MiB pages.
    #[error("memory {0}: must be a multiple of 2M")]
    MemoryNotAligned(ByteSize),
    /// Less guest RAM than a Linux guest needs.
    #[error("memory {0}: must be at least {min}", min = ByteSize(MIN_MEMORY))]
    MemoryTooSmall(ByteSize),
    /// More guest RAM than the guest address map holds.
    #[error("memory {0}: must be at most {max} (the guest address map)", max = ByteSize(MAX_MEMORY))]
    MemoryTooLarge(ByteSize),
    /// A vCPU count out of range or not a number.
    #[error("cpus \"{0}\": expected a number from 1 to {MAX_CPUS}")]
    InvalidCpus(String),
    /// A command line longer than the boot protocol carries.
    #[error("kernel command line is {0} bytes: must be shorter than {max}", max = layout::CMDLINE_MAX_SIZE)]
    CmdlineTooLong(usize),
    /// A command line the boot protocol would cut short.
    #[error("kernel command line contains a NUL byte")]
    CmdlineNul,
    /// A pmem region that is not a whole number of 2 MiB pages.
    #[error("pmem {}: size {size} is not a multiple of 2M", path.display())]
    PmemNotAligned {
        /// Backing file.
        path: PathBuf,
        /// Its size.
        size: ByteSize,
    },
    /// A pmem device of no bytes.
    #[error("pmem {}: size must not be zero", path.display())]
    PmemZero {
        /// Backing file.
        path: PathBuf,
    },
    /// An existing file whose length is not the size given: neither is cut or padded.
    #[error("pmem {}: the file holds {file} but {size} was given", path.display())]
    PmemSizeMismatch {
        /// Backing file.
        path: PathBuf,
        /// Its length.
        file: ByteSize,
        /// The size given.
        size: ByteSize,
    },
    /// A pmem file to create without a size.
    #[error("pmem {}: the file does not exist or is empty, give its size as FILE,SIZE", path.display())]
    PmemNeedsSize {
        /// Backing file.
        path: PathBuf,
    },
    /// Two pmem devices over one file.
    #[error("pmem {}: given twice", path.display())]
    PmemDuplicate {
        /// Backing file.
        path: PathBuf,
    },
    /// More pmem than the device-memory area holds.
    #[error("pmem devices total {0}: more than the {max} of device memory", max = ByteSize(layout::DEVICE_MEM_SIZE))]
    PmemTooLarge(ByteSize),
    /// Two expanders over one media file.
    #[error("cxl-t3 media {}: given twice", path.display())]
    CxlDuplicate {
        /// Media file.
        path: PathBuf,
    },
    /// Two expanders with one `id=`.
    #[error("cxl-t3 id={0}: given twice")]
    CxlIdDuplicate(String),
    /// More guest-visible expanders than host bridges.
    #[error("more than {MAX_CXL_T3} --cxl-t3 devices shown to the guest")]
    CxlTooMany,
    /// A `guest=off` expander that no PMO store uses.
    #[error("cxl-t3 media {}: kept from the guest (guest=off) but no --pmo-store cxl= uses it", path.display())]
    CxlUnused {
        /// Media file.
        path: PathBuf,
    },
    /// An expander capacity the decoders cannot map.
    #[error("size {0}: must be a non-zero multiple of 256M")]
    CxlSize(ByteSize),
    /// An empty console value.
    #[error("console \"{0}\": expected a file name or stdout")]
    InvalidConsole(String),
    /// PMO options without a store to apply them to.
    #[error(
        "--pmo-design, --pmo-window, --pmo-predictor, --pmo-kdf, --pmo-anchor, --pmo-master-key and --pmo-dram need --pmo-store"
    )]
    PmoWithoutStore,
    /// `--pmo-dram` for a store that is not on an expander: there is no CXL tier to demote to.
    #[error("--pmo-dram needs the PMO store on an expander (--pmo-store cxl=NAME): that is the tier cold pages go to")]
    PmoDramWithoutCxl,
    /// `--pmo-design` names no design.
    #[error("--pmo-design: {0}")]
    PmoDesign(#[from] pmo_store::UnknownDesign),
    /// `--pmo-predictor` names no predictor, or a bad depth.
    #[error("--pmo-predictor: {0}")]
    PmoPredictor(#[from] pmo_policies::PolicyError),
    /// A CXL design (`c`, `cl`, `cf`) for a store that is not on an expander: nothing would encrypt
    /// its pages at rest.
    #[error("--pmo-design {0}: a CXL design needs the PMO store on an expander (--pmo-store cxl=NAME), whose range keys encrypt its pages")]
    PmoDesignWithoutCxl(String),
    /// A DRAM budget that is not whole pages, or larger than the window.
    #[error("--pmo-dram {0}: not a non-zero multiple of 4K within the PMO window")]
    PmoDram(ByteSize),
    /// An Argon2id cost that does not parse or is out of bounds.
    #[error("--pmo-kdf: {0}")]
    PmoKdf(String),
    /// A store to create without a size.
    #[error("PMO store {}: does not exist; give its size to create it (FILE,SIZE)", path.display())]
    PmoStoreSize {
        /// Store file.
        path: PathBuf,
    },
    /// `--pmo-store cxl=NAME` with no such expander.
    #[error("--pmo-store cxl={0}: no --cxl-t3 has id={0}")]
    PmoCxlUnknown(String),
    /// `--pmo-store cxl=NAME` on an expander the guest sees.
    #[error("--pmo-store cxl={0}: the guest sees that expander; give it guest=off")]
    PmoCxlGuest(String),
    /// A store on an expander without the key its PMO extents are keyed from.
    #[error("--pmo-store cxl=NAME needs --pmo-master-key FILE")]
    PmoNoMasterKey,
    /// A master key for a store that does not use one.
    #[error("--pmo-master-key is for a PMO store on an expander (--pmo-store cxl=NAME)")]
    PmoMasterKeyUnused,
    /// A working area for design `c` that leaves no room for the store.
    #[error("--pmo-store direct={direct}: must be a non-zero multiple of 2M leaving at least 16M of the {device} expander to the store")]
    PmoDirect {
        /// The size asked for.
        direct: ByteSize,
        /// The expander's size.
        device: ByteSize,
    },
    /// A PMO window the address map cannot hold or the pager cannot use.
    #[error("PMO window {0}: must be a non-zero multiple of 2M, at most 64G")]
    PmoWindow(ByteSize),
}

/// A file error in one line: "No such file or directory (os error 2)" becomes "No such file or
/// directory".
pub(super) fn file_error(what: &'static str, path: &Path, e: &io::Error) -> ConfigError {
    let text = e.to_string();
    let reason = match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    };
    file_error_msg(what, path, &reason)
}

/// A file error with our own reason.
pub(super) fn file_error_msg(what: &'static str, path: &Path, reason: &str) -> ConfigError {
    ConfigError::File {
        what,
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

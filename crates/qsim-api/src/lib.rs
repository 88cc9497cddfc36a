//! The library behind every door of qsim.
//!
//! Each command is: a plain spec (the command line and the Python package
//! map their arguments to it) → one library call → a typed result that
//! renders itself (text, JSON, tables). The simulation-only commands' calls
//! are in `qsim-sim` (`experiment`, `plan`, `recommend`, `options`,
//! `compare`, `calibrate`, `trace`, `sim2real`); this crate holds those that
//! drive both the simulation and the live parts, which do not know each
//! other:
//!
//! - [`load`]: a shared-deployment scenario played against a real endpoint
//!   (`qsim load`), beside the plan's prediction;
//! - [`replay`]: a hosted experiment's client side run for real against an
//!   endpoint (`qsim replay`): attempts, rows, the summary records;
//!
//! Errors are [`Error`]: a configuration or input problem (exit 2), a
//! failure at run time (exit 1), or a target that is not met (exit 1).

pub mod load;
pub mod replay;

use qsim_sim::config::ConfigError;

/// What a library call can fail with.
#[derive(Debug)]
pub enum Error {
    /// Bad input: a file, field or flag (exit 2).
    Config(ConfigError),
    /// A failure at run time (the network, a file being written): exit 1.
    Io(String),
    /// A target that cannot be met: exit 1.
    Unmet(String),
}

impl Error {
    /// The exit code the command line uses for it.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) => 2,
            Error::Io(_) | Error::Unmet(_) => 1,
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(e)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(e) => write!(f, "{e}"),
            Error::Io(e) | Error::Unmet(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

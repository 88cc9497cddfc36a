//! Experiment files: loading (with `--set` overrides), validation and the
//! simulation drivers that run them.

pub mod config;
pub mod hosted;
pub mod server;

pub use config::HostedSuite;
pub use server::ServerSuite;

use crate::config::{apply_set, read_toml, ConfigError};
use std::path::Path;

/// A loaded experiment file.
#[derive(Debug, Clone)]
pub enum ExperimentFile {
    Hosted(HostedSuite),
    Server(ServerSuite),
    /// A shared deployment (`kind = "shared"`): run as `qsim plan --scenarios FILE`.
    Shared(std::path::PathBuf),
}

impl ExperimentFile {
    /// The hosted-API suite, if this file is one.
    pub fn into_hosted(self) -> Option<HostedSuite> {
        match self {
            ExperimentFile::Hosted(s) => Some(s),
            _ => None,
        }
    }
}

/// Load an experiment file, applying `--set PATH=VALUE` overrides first.
pub fn load(path: &Path, sets: &[String]) -> Result<ExperimentFile, ConfigError> {
    let mut v = read_toml(path)?;
    for s in sets {
        apply_set(&mut v, s)?;
    }
    let src = path.display().to_string();
    let kind = v
        .get("kind")
        .ok_or_else(|| {
            ConfigError::new(
                &src,
                "kind",
                "missing; expected \"hosted\", \"server\" or \"shared\"",
            )
        })?
        .as_str()
        .ok_or_else(|| ConfigError::new(&src, "kind", "must be a string"))?
        .to_string();
    match kind.as_str() {
        "hosted" => Ok(ExperimentFile::Hosted(HostedSuite::from_value(path, v)?)),
        "server" => Ok(ExperimentFile::Server(ServerSuite::from_value(path, v)?)),
        "shared" if !sets.is_empty() => Err(ConfigError::new(
            "--set",
            "",
            "not supported for kind = \"shared\" files; use qsim plan's flags (--capacity, --reserve, …)",
        )),
        "shared" => Ok(ExperimentFile::Shared(path.to_path_buf())),
        other => Err(ConfigError::new(
            &src,
            "kind",
            format!("unknown experiment kind {other:?}; expected \"hosted\", \"server\" or \"shared\""),
        )),
    }
}

//! Experiment files: loading (with `--set` overrides), validation and the
//! simulation drivers that run them.

pub mod budget;
pub mod config;
pub mod extras;
pub mod hosted;
pub mod scaling;
pub mod server;
pub mod trace_plan;
pub mod trace_plan_run;

pub use config::HostedSuite;
pub use server::ServerSuite;

use crate::config::{apply_set, read_toml, ConfigError};
use crate::report::records::Records;
use std::path::Path;

/// A loaded experiment file: every kind loads, validates and runs through
/// this one interface (`--set`, `--seeds`, `--only`, `qsim sweep`).
#[derive(Debug, Clone)]
pub enum ExperimentFile {
    Hosted(HostedSuite),
    Server(ServerSuite),
    /// A shared deployment (`kind = "shared"`): the plan's arguments with the
    /// file, its `--set` overrides and `--only` (validated at load).
    Shared(crate::plan::PlanSpec),
}

impl ExperimentFile {
    /// The hosted-API suite, if this file is one.
    pub fn into_hosted(self) -> Option<HostedSuite> {
        match self {
            ExperimentFile::Hosted(s) => Some(s),
            _ => None,
        }
    }

    /// Keep only the named experiments or scenarios (`--only`).
    pub fn retain_only(&mut self, only: &[String]) -> Result<(), ConfigError> {
        match self {
            ExperimentFile::Hosted(s) => s.retain_only(only),
            ExperimentFile::Server(s) => s.retain_only(only),
            ExperimentFile::Shared(a) => {
                a.only = only.to_vec();
                crate::plan::build(a).map(|_| ())
            }
        }
    }

    /// Run `seeds` seeds from `seed`, each reduced to tidy records at once.
    pub fn records(&self, seed: u64, seeds: u64) -> Result<Records, ConfigError> {
        let mut out = Records::default();
        for k in 0..seeds {
            let s = seed.wrapping_add(k);
            match self {
                ExperimentFile::Hosted(suite) => {
                    crate::report::hosted::records(&mut out, s, &hosted::run_suite(suite, s))
                }
                ExperimentFile::Server(suite) => {
                    crate::report::server::records(&mut out, s, &server::run_suite(suite, s))
                }
                ExperimentFile::Shared(args) => {
                    let (file, model) = crate::plan::build(args)?;
                    let runs = crate::plan::simulate(&file, &model, s, true);
                    crate::plan::seeds::records(&mut out, s, &runs);
                }
            }
        }
        Ok(out)
    }
}

/// Load an experiment file, applying `--set PATH=VALUE` overrides first.
pub fn load(path: &Path, sets: &[String]) -> Result<ExperimentFile, ConfigError> {
    let mut v = read_toml(path)?;
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
    if kind == "shared" {
        let args = crate::plan::PlanSpec {
            scenarios: Some(path.to_path_buf()),
            sets: sets.to_vec(),
            seed: 1,
            seeds: 1,
            ..Default::default()
        };
        crate::plan::build(&args)?;
        return Ok(ExperimentFile::Shared(args));
    }
    for s in sets {
        apply_set(&mut v, s)?;
    }
    match kind.as_str() {
        "hosted" => Ok(ExperimentFile::Hosted(HostedSuite::from_value(path, v)?)),
        "server" => Ok(ExperimentFile::Server(ServerSuite::from_value(path, v)?)),
        "options" => Err(ConfigError::new(
            &src,
            "kind",
            "a deployment-options file: run it with `qsim options FILE`",
        )),
        other => Err(ConfigError::new(
            &src,
            "kind",
            format!(
                "unknown experiment kind {other:?}; expected \"hosted\", \"server\" or \"shared\""
            ),
        )),
    }
}

/// Load an experiment file for `run` and `sweep`. A server or hosted-API
/// profile given in its place is named as such, and field paths name array
/// items by their `name` ([`crate::config::name_fields`]).
pub fn load_file(file: &Path, sets: &[String]) -> Result<ExperimentFile, ConfigError> {
    load(file, sets).map_err(|e| {
        let src = file.display().to_string();
        if e.source == src {
            if let Some(w) = crate::config::read_toml(file)
                .ok()
                .and_then(|v| crate::config::profile_not_experiment(&src, &v))
            {
                return w;
            }
        }
        crate::config::name_fields(e, Some(file), sets)
    })
}

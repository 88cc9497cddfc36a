//! `--out DIR` of `qsim run`, `sweep`, `plan` and `merge`: the tidy records
//! handed to the qsim-results crate as plain data (polars lives there
//! only), the manifest's facts gathered here, and the directory written
//! atomically by [`crate::output::write_dir`].

use crate::cli::common::CliError;
use qsim_results::{Axis, Input, Manifest, Results, ResultsBuilder, ResultsError};
use qsim_sim::config::ConfigError;
use qsim_sim::report::records::Records;
use std::path::{Path, PathBuf};

/// The command line as the manifest records it: `qsim` and the arguments
/// as given (the binary's own path left out, so it does not depend on where
/// qsim is installed).
pub fn command_line() -> Vec<String> {
    std::iter::once("qsim".to_string())
        .chain(
            std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned()),
        )
        .collect()
}

fn internal(e: ResultsError) -> CliError {
    CliError::Io(format!("results tables: {e}"))
}

/// The tables of `points` (grid index, its records) over `axes`.
pub fn tables(
    axes: &[qsim_sim::sweep::Axis],
    points: &[(usize, &Records)],
) -> Result<Results, CliError> {
    let axes: Vec<Axis> = axes
        .iter()
        .map(|(path, values)| Axis {
            path: path.clone(),
            values: values.clone(),
        })
        .collect();
    let mut b = ResultsBuilder::new(axes);
    for (p, records) in points {
        for r in records.iter() {
            b.push(*p, r.seed, r.subject, r.metric, r.value)
                .map_err(internal)?;
        }
    }
    Ok(b.finish())
}

/// The manifest of this process's run: qsim's version, the command line,
/// every input file read (with its SHA-256), the seeds, grid and shard.
pub fn manifest(
    axes: &[qsim_sim::sweep::Axis],
    seed: u64,
    seeds: u64,
    shard: Option<qsim_sim::sweep::Shard>,
) -> Manifest {
    Manifest {
        version: env!("CARGO_PKG_VERSION").to_string(),
        command: command_line(),
        inputs: qsim_sim::config::files_read()
            .iter()
            .map(|(name, text)| Input::new(name.clone(), text.as_bytes()))
            .collect(),
        seed,
        seeds,
        axes: axes
            .iter()
            .map(|(path, values)| Axis {
                path: path.clone(),
                values: values.clone(),
            })
            .collect(),
        shard: shard.map(|s| (s.index, s.count)),
        merged: vec![],
    }
}

/// Write the tables and manifest to `dir` (atomically; see
/// [`crate::output`] for the rules).
pub fn write(
    dir: &Path,
    force: bool,
    results: &Results,
    manifest: &Manifest,
) -> Result<(), CliError> {
    let files = qsim_results::output_files(results, manifest).map_err(internal)?;
    Ok(crate::output::write_dir("--out", dir, &files, force)?)
}

/// Refuse a bad `--out DIR` before anything runs.
pub fn check(dir: &Path, force: bool) -> Result<(), CliError> {
    crate::output::check_dir("--out", dir, qsim_results::FILE_NAMES, force)?;
    Ok(())
}

/// `qsim merge DIR… --out DIR`: the shards' directories into the
/// single-machine tables.
pub fn merge(dirs: &[PathBuf], out: &Path, force: bool) -> Result<(), CliError> {
    check(out, force)?;
    let m = qsim_results::merge::merge_dirs(dirs, command_line(), &qsim_sim::input::load_data)
        .map_err(|e| CliError::Config(ConfigError::new(e.what, "", e.reason)))?;
    write(out, force, &m.results, &m.manifest)
}

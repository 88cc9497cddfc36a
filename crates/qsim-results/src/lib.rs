//! qsim's result tables, the only place polars is used (never in qsim-core
//! or the simulation).
//!
//! The root crate hands over plain data — tidy records `(point, seed,
//! subject, metric, value)`, the swept axes, and the facts for the manifest
//! — and gets back file contents:
//!
//! - `runs.parquet` / `runs.csv`: one row per run (grid point, its
//!   parameters, seed, subject) with every metric as a column;
//! - `points.parquet` / `points.csv`: per point, subject and metric, the
//!   median, mean and 90 % interval (p05, p95) over the seeds;
//! - `manifest.json`: qsim's version, the command line, the SHA-256 of every
//!   input file, the seeds, the grid (and shard), and of each table file.
//!
//! Also: [`merge::merge_dirs`] (shard directories → the single-machine
//! tables), [`read::read_column`] (one column of a CSV, Parquet or JSON
//! Lines file) and [`table::write_table`] (named columns → Parquet + CSV).

pub mod error;
pub mod manifest;
pub mod merge;
pub mod parquet_rows;
pub mod read;
pub mod results;
pub mod table;

pub use error::ResultsError;
pub use manifest::{Input, Manifest};
pub use read::{read_column, read_parquet_text};
pub use results::{Axis, Results, ResultsBuilder, FILE_NAMES, MANIFEST};
pub use table::{encode_table, write_table, NamedColumn, Values};

/// Every file of an output directory, (name, bytes): the four tables and
/// `manifest.json` (which lists the tables' sizes and hashes).
pub fn output_files(
    results: &Results,
    manifest: &Manifest,
) -> Result<Vec<(String, Vec<u8>)>, ResultsError> {
    let mut files = results.encode()?;
    let m = manifest.to_json(&files);
    files.push((MANIFEST.to_string(), m.into_bytes()));
    Ok(files)
}

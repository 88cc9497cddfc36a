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

//!
//! Without the default feature `polars` only the polars-free part builds:
//! the columns ([`columns`]), the tables' columns from tidy records
//! ([`ResultsBuilder`], [`Results::runs_columns`], [`Results::points_columns`])
//! and the manifest; the Python package builds its `.to_polars()` frames
//! from these columns with the Python polars package.

pub mod columns;
pub mod error;
pub mod manifest;
#[cfg(feature = "polars")]
pub mod merge;
#[cfg(feature = "polars")]
pub mod parquet_rows;
#[cfg(feature = "polars")]
pub mod read;
pub mod results;
#[cfg(feature = "polars")]
pub mod table;

pub use columns::{NamedColumn, Values};
pub use error::ResultsError;
pub use manifest::{Input, Manifest};
#[cfg(feature = "polars")]
pub use read::{read_column, read_parquet_text};
pub use results::{Axis, Results, ResultsBuilder, FILE_NAMES, MANIFEST};
#[cfg(feature = "polars")]
pub use table::{encode_table, write_table};

/// Every file of an output directory, (name, bytes): the four tables and
/// `manifest.json` (which lists the tables' sizes and hashes).
#[cfg(feature = "polars")]
pub fn output_files(
    results: &Results,
    manifest: &Manifest,
) -> Result<Vec<(String, Vec<u8>)>, ResultsError> {
    let mut files = results.encode()?;
    let m = manifest.to_json(&files);
    files.push((MANIFEST.to_string(), m.into_bytes()));
    Ok(files)
}

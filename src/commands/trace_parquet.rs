//! The Parquet reader of request traces: `qsim proxy`'s Parquet decision
//! log read through qsim-results (polars, which qsim-sim does not link),
//! registered with qsim-sim's trace reader at start-up, which then reads
//! the rows as it reads the JSON Lines log.

use qsim_sim::trace::read::ParquetRows;

fn open(file: std::fs::File, columns: &[&str]) -> Result<ParquetRows, String> {
    Ok(Box::new(qsim_results::parquet_rows::ParquetRows::open(
        file, columns,
    )?))
}

/// Register the reader (idempotent).
pub fn register() {
    qsim_sim::trace::read::set_parquet_rows(open);
}

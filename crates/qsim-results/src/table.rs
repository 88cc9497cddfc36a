//! Named columns of plain values → a polars DataFrame → Parquet and CSV bytes.

use crate::error::ResultsError;
use polars::prelude::*;
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

pub use crate::columns::{NamedColumn, Values};

fn polars_err(what: &str, e: PolarsError) -> ResultsError {
    ResultsError::new(what, e.to_string())
}

/// The columns as a DataFrame. All columns must have the same length and
/// distinct names.
pub fn frame(columns: &[NamedColumn]) -> Result<DataFrame, ResultsError> {
    let height = columns.first().map_or(0, |c| c.values.len());
    for (i, c) in columns.iter().enumerate() {
        if c.values.len() != height {
            return Err(ResultsError::new(
                format!("column {}", c.name),
                format!(
                    "{} values, but column {} has {height}",
                    c.values.len(),
                    columns[0].name
                ),
            ));
        }
        if columns[..i].iter().any(|o| o.name == c.name) {
            return Err(ResultsError::new(
                format!("column {}", c.name),
                "the name is given twice",
            ));
        }
    }
    let cols: Vec<Column> = columns
        .iter()
        .map(|c| {
            let name: PlSmallStr = c.name.as_str().into();
            match &c.values {
                Values::Str(v) => Column::new(name, v),
                Values::F64(v) => Column::new(name, v),
                Values::I64(v) => Column::new(name, v),
                Values::U64(v) => Column::new(name, v),
                Values::U32(v) => Column::new(name, v),
                Values::Bool(v) => Column::new(name, v),
            }
        })
        .collect();
    DataFrame::new(height, cols).map_err(|e| polars_err("table", e))
}

/// A DataFrame as Parquet bytes (zstd, statistics on; the same bytes for
/// the same frame whatever the thread count).
pub fn parquet_bytes(df: &mut DataFrame) -> Result<Vec<u8>, ResultsError> {
    let mut buf = Cursor::new(Vec::new());
    ParquetWriter::new(&mut buf)
        .finish(df)
        .map_err(|e| polars_err("parquet", e))?;
    Ok(buf.into_inner())
}

/// A DataFrame as CSV bytes: a header line, `,` separators, nulls as empty
/// fields, fields quoted only when they need it.
pub fn csv_bytes(df: &mut DataFrame) -> Result<Vec<u8>, ResultsError> {
    let mut buf = Vec::new();
    CsvWriter::new(&mut buf)
        .include_header(true)
        .finish(df)
        .map_err(|e| polars_err("csv", e))?;
    Ok(buf)
}

/// A table encoded both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub parquet: Vec<u8>,
    pub csv: Vec<u8>,
}

/// Encode named columns as Parquet and CSV bytes (for callers that place
/// the files themselves, e.g. qsim's atomic `--out DIR`).
pub fn encode_table(columns: &[NamedColumn]) -> Result<Encoded, ResultsError> {
    let mut df = frame(columns)?;
    Ok(Encoded {
        parquet: parquet_bytes(&mut df)?,
        csv: csv_bytes(&mut df)?,
    })
}

/// Write named columns to `STEM.parquet` and `STEM.csv` (`stem` is a path
/// without extension, e.g. `attempts` → `attempts.parquet`,
/// `attempts.csv`). Each file goes to a temporary name in the same
/// directory and is renamed into place once complete, so a reader never
/// sees half a file; an existing file is replaced. Returns the two paths.
pub fn write_table(
    stem: &Path,
    columns: &[NamedColumn],
) -> Result<(PathBuf, PathBuf), ResultsError> {
    let enc = encode_table(columns)?;
    let pq = stem.with_extension("parquet");
    let csv = stem.with_extension("csv");
    write_atomic(&pq, &enc.parquet)?;
    write_atomic(&csv, &enc.csv)?;
    Ok((pq, csv))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ResultsError> {
    let name = path.display().to_string();
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| ResultsError::new(&name, "names no file"))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let io = |e: std::io::Error| ResultsError::new(&name, e.to_string());
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res.map_err(io)
}

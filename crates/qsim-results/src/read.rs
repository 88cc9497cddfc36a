//! `read_column`: one column of a CSV, Parquet or JSON Lines file, as text.

use crate::error::ResultsError;
use polars::prelude::*;
use std::path::Path;

/// How a file's bytes are read: the caller's bounded reader (the binary
/// passes `qsim_sim::input::load_data`, which reads only regular files up
/// to a cap), so that this crate never reads an input unbounded.
pub type Load<'a> = &'a dyn Fn(&Path) -> Result<Vec<u8>, String>;

/// The file formats [`read_column`] reads, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Csv,
    Parquet,
    Jsonl,
}

impl Format {
    /// The format of `path` from its extension (`.csv`; `.parquet`, `.pq`;
    /// `.jsonl`, `.ndjson`), case-insensitive.
    pub fn of(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "csv" => Some(Format::Csv),
            "parquet" | "pq" => Some(Format::Parquet),
            "jsonl" | "ndjson" => Some(Format::Jsonl),
            _ => None,
        }
    }
}

/// The values of column `column` of the CSV, Parquet or JSON Lines file at
/// `path`, in row order, as text: a CSV field as written, a Parquet value
/// cast to text, a JSON string as is and any other JSON value as JSON. A
/// missing column, a missing (null or empty) value or an unreadable file is
/// an error naming the file (and the row or line).
pub fn read_column(path: &Path, column: &str, load: Load) -> Result<Vec<String>, ResultsError> {
    let name = path.display().to_string();
    let format = Format::of(path).ok_or_else(|| {
        ResultsError::new(
            &name,
            "unknown format: expected a .csv, .parquet (.pq) or .jsonl (.ndjson) file",
        )
    })?;
    let bytes = load(path).map_err(|e| ResultsError::new(&name, e))?;
    match format {
        Format::Jsonl => read_jsonl(&name, bytes, column),
        Format::Csv | Format::Parquet => {
            let df = read_frame(bytes, format).map_err(|e| ResultsError::new(&name, e))?;
            column_text(&name, &df, column)
        }
    }
}

/// Named columns of text values (`None`: null).
pub type TextColumns = Vec<(String, Vec<Option<String>>)>;

/// Every column of a Parquet file as text (a value cast to text, `None`
/// for a null), in the file's column order.
pub fn read_parquet_text(path: &Path, load: Load) -> Result<TextColumns, ResultsError> {
    let name = path.display().to_string();
    let bytes = load(path).map_err(|e| ResultsError::new(&name, e))?;
    let df = read_frame(bytes, Format::Parquet).map_err(|e| ResultsError::new(&name, e))?;
    df.columns()
        .iter()
        .map(|c| {
            let t = c
                .cast(&DataType::String)
                .map_err(|e| ResultsError::new(&name, format!("column {:?}: {e}", c.name())))?;
            let ca = t
                .str()
                .map_err(|e| ResultsError::new(&name, format!("column {:?}: {e}", c.name())))?;
            Ok((
                c.name().to_string(),
                ca.iter().map(|v| v.map(str::to_string)).collect(),
            ))
        })
        .collect()
}

fn read_frame(bytes: Vec<u8>, format: Format) -> Result<DataFrame, String> {
    let cur = std::io::Cursor::new(bytes);
    match format {
        // every column read as text, exactly as written
        Format::Csv => CsvReadOptions::default()
            .with_has_header(true)
            .with_infer_schema_length(Some(0))
            .into_reader_with_file_handle(cur)
            .finish()
            .map_err(|e| e.to_string()),
        Format::Parquet => ParquetReader::new(cur).finish().map_err(|e| e.to_string()),
        Format::Jsonl => unreachable!("JSON Lines are read with serde_json"),
    }
}

fn column_text(name: &str, df: &DataFrame, column: &str) -> Result<Vec<String>, ResultsError> {
    let col = df.column(column).map_err(|_| {
        let have: Vec<String> = df
            .get_column_names()
            .iter()
            .map(|c| c.to_string())
            .collect();
        ResultsError::new(
            name,
            format!("no column {column:?} (columns: {})", have.join(", ")),
        )
    })?;
    let text = col
        .cast(&DataType::String)
        .map_err(|e| ResultsError::new(name, format!("column {column:?}: {e}")))?;
    let ca = text
        .str()
        .map_err(|e| ResultsError::new(name, format!("column {column:?}: {e}")))?;
    ca.iter()
        .enumerate()
        .map(|(i, v)| {
            v.map(str::to_string).ok_or_else(|| {
                ResultsError::new(name, format!("column {column:?}: row {}: no value", i + 1))
            })
        })
        .collect()
}

fn read_jsonl(name: &str, bytes: Vec<u8>, column: &str) -> Result<Vec<String>, ResultsError> {
    let text = String::from_utf8(bytes)
        .map_err(|e| ResultsError::new(name, format!("cannot read file: not UTF-8: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |r: String| ResultsError::new(name, format!("line {}: {r}", i + 1));
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| at(format!("invalid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| at("not a JSON object".into()))?;
        match obj.get(column) {
            Some(serde_json::Value::String(s)) => out.push(s.clone()),
            None | Some(serde_json::Value::Null) => {
                return Err(at(format!("no value for column {column:?}")))
            }
            Some(other) => out.push(other.to_string()),
        }
    }
    Ok(out)
}

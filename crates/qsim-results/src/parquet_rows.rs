//! A Parquet file read a batch of rows at a time, each row handed on as
//! one JSON object line (`{"column": value, …}`: numbers and booleans as
//! JSON literals, text as JSON strings, a null as `null`), so that a
//! reader of JSON Lines (the trace reader of `qsim proxy`'s decision log)
//! reads a Parquet log through the same parser. Memory: one batch of
//! [`BATCH`] rows of the chosen columns (polars decodes whole row groups:
//! the proxy writes at most 65,536 records per file); the file itself is
//! read through polars' memory map (pages of the page cache).

use polars::prelude::*;
use std::cell::Cell;
use std::fs::File;
use std::panic::AssertUnwindSafe;

/// Rows decoded per batch.
pub const BATCH: usize = 16_384;

/// The rows of one Parquet file as JSON object lines.
pub struct ParquetRows {
    file: File,
    /// The chosen columns the file has (JSON-escaped names alongside).
    columns: Vec<String>,
    keys: Vec<String>,
    total: usize,
    offset: usize,
    batch: std::vec::IntoIter<Vec<u8>>,
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Run `f`, a panic in polars (a corrupt file it does not check) becoming
/// an error: the panic message is not printed (a hook installed once stays
/// quiet on this thread while `f` runs, and defers to the previous hook
/// everywhere else).
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                prev(info)
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let r = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    r.unwrap_or_else(|p| {
        let why = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        Err(format!("not a readable Parquet file ({})", one_line(&why)))
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl ParquetRows {
    /// Open `file` (a regular file, opened by the caller) and read the
    /// columns of `wanted` it has (the others are left unread; a missing
    /// one is absent from every line).
    pub fn open(file: File, wanted: &[&str]) -> Result<ParquetRows, String> {
        let probe = file.try_clone().map_err(|e| format!("cannot read: {e}"))?;
        let (columns, total) = guarded(|| {
            let mut r = ParquetReader::new(probe);
            let schema = r.schema().map_err(|e| {
                format!("not a readable Parquet file: {}", one_line(&e.to_string()))
            })?;
            let total = r.num_rows().map_err(|e| {
                format!("not a readable Parquet file: {}", one_line(&e.to_string()))
            })?;
            let columns: Vec<String> = wanted
                .iter()
                .filter(|w| schema.get(w).is_some())
                .map(|w| w.to_string())
                .collect();
            Ok((columns, total))
        })?;
        let keys = columns
            .iter()
            .map(|c| serde_json::to_string(c).expect("a string serialises"))
            .collect();
        Ok(ParquetRows {
            file,
            columns,
            keys,
            total,
            offset: 0,
            batch: Vec::new().into_iter(),
        })
    }

    /// Rows in the file.
    pub fn rows(&self) -> usize {
        self.total
    }

    fn read_batch(&mut self) -> Result<(), String> {
        let len = BATCH.min(self.total - self.offset);
        let at = self.offset;
        let lines = if self.columns.is_empty() {
            vec![b"{}".to_vec(); len]
        } else {
            let f = self
                .file
                .try_clone()
                .map_err(|e| format!("cannot read: {e}"))?;
            let (columns, keys) = (&self.columns, &self.keys);
            guarded(|| {
                let bad = |e: PolarsError| {
                    format!(
                        "rows {}..{}: not a readable Parquet file: {}",
                        at + 1,
                        at + len,
                        one_line(&e.to_string())
                    )
                };
                let df = ParquetReader::new(f)
                    .with_columns(Some(columns.clone()))
                    .with_slice(Some((at, len)))
                    .read_parallel(ParallelStrategy::None)
                    .finish()
                    .map_err(bad)?;
                if df.height() != len {
                    return Err(format!(
                        "rows {}..{}: {} rows read, not a complete Parquet file",
                        at + 1,
                        at + len,
                        df.height()
                    ));
                }
                let mut lines: Vec<Vec<u8>> = vec![b"{".to_vec(); len];
                for (k, name) in columns.iter().enumerate() {
                    let c = df.column(name).map_err(bad)?;
                    let quoted = !(c.dtype().is_primitive_numeric() || c.dtype().is_bool());
                    let text = c.cast(&DataType::String).map_err(bad)?;
                    let ca = text.str().map_err(bad)?;
                    for (line, v) in lines.iter_mut().zip(ca.iter()) {
                        if k > 0 {
                            line.push(b',');
                        }
                        line.extend_from_slice(keys[k].as_bytes());
                        line.push(b':');
                        match v {
                            None => line.extend_from_slice(b"null"),
                            Some(s) if quoted => line.extend_from_slice(
                                serde_json::to_string(s)
                                    .expect("a string serialises")
                                    .as_bytes(),
                            ),
                            Some(s) => line.extend_from_slice(s.as_bytes()),
                        }
                    }
                }
                for line in &mut lines {
                    line.push(b'}');
                }
                Ok(lines)
            })?
        };
        self.offset += len;
        self.batch = lines.into_iter();
        Ok(())
    }
}

impl Iterator for ParquetRows {
    type Item = Result<Vec<u8>, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(line) = self.batch.next() {
            return Some(Ok(line));
        }
        if self.offset >= self.total {
            return None;
        }
        if let Err(e) = self.read_batch() {
            // nothing more after an error
            self.offset = self.total;
            return Some(Err(e));
        }
        self.batch.next().map(Ok)
    }
}

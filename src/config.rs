//! Configuration loading: TOML files → `toml::Value` (with `--set`
//! overrides) → serde `Raw*` structs (`deny_unknown_fields`) → validated
//! types. Every error names the file, the field path and the reason.

use serde::de::DeserializeOwned;
use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration error: exit code 2.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The file (or `--flag`) the error is about.
    pub source: String,
    /// Dotted path of the offending field, empty if it concerns the whole source.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(source: impl Into<String>, field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            source: source.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Prefix the field path with `prefix` (for nested validation).
    pub fn under(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            self.field = if self.field.is_empty() {
                prefix.to_string()
            } else {
                format!("{prefix}.{}", self.field)
            };
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.source, self.reason)
        } else {
            write!(f, "{}: field `{}`: {}", self.source, self.field, self.reason)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Read and parse a TOML file.
pub fn read_toml(path: &Path) -> Result<toml::Value, ConfigError> {
    let src = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(&src, "", format!("cannot read file: {e}")))?;
    parse_toml(&src, &text)
}

/// Parse TOML text; `source` names it in errors.
pub fn parse_toml(source: &str, text: &str) -> Result<toml::Value, ConfigError> {
    text.parse::<toml::Table>()
        .map(toml::Value::Table)
        .map_err(|e| {
            let msg = e.message().to_string();
            let loc = e
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            ConfigError::new(source, "", format!("invalid TOML{loc}: {msg}"))
        })
}

/// Deserialize a value into a `Raw*` struct, reporting the failing field path.
pub fn from_value<T: DeserializeOwned>(source: &str, value: toml::Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        ConfigError::new(source, field, e.into_inner().to_string())
    })
}

/// Parse a scalar given on the command line: integer, float, bool, else string.
fn parse_scalar(s: &str) -> toml::Value {
    if let Ok(i) = s.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(f) = s.parse::<f64>() {
        toml::Value::Float(f)
    } else if let Ok(b) = s.parse::<bool>() {
        toml::Value::Boolean(b)
    } else {
        toml::Value::String(s.to_string())
    }
}

/// Apply `--set path=value` to a parsed file. Path segments are separated by
/// dots; a numeric segment indexes an array (`experiment.1.workers=8`). The
/// parent of the last segment must exist; the last segment may be new (it is
/// then checked like any field when the file is deserialized). Only scalars
/// can be set, and a scalar cannot replace a table or an array.
pub fn apply_set(root: &mut toml::Value, assignment: &str) -> Result<(), ConfigError> {
    let flag = format!("--set {assignment}");
    let (path, raw) = assignment
        .split_once('=')
        .ok_or_else(|| ConfigError::new(&flag, "", "expected PATH=VALUE"))?;
    let path = path.trim();
    if path.is_empty() {
        return Err(ConfigError::new(&flag, "", "empty path"));
    }
    let segs: Vec<&str> = path.split('.').collect();
    let mut cur = root;
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let here = segs[..=i].join(".");
        cur = match cur {
            toml::Value::Table(t) => {
                if last {
                    if let Some(old) = t.get(*seg) {
                        if old.is_table() || old.is_array() {
                            return Err(ConfigError::new(&flag, &here, "is a table or array, not a scalar"));
                        }
                    }
                    t.insert(seg.to_string(), parse_scalar(raw.trim()));
                    return Ok(());
                }
                t.get_mut(*seg)
                    .ok_or_else(|| ConfigError::new(&flag, &here, "no such field in the file"))?
            }
            toml::Value::Array(a) => {
                let idx: usize = seg
                    .parse()
                    .map_err(|_| ConfigError::new(&flag, &here, "expected an array index"))?;
                let len = a.len();
                let slot = a.get_mut(idx).ok_or_else(|| {
                    ConfigError::new(&flag, &here, format!("index out of range (array has {len} elements)"))
                })?;
                if last {
                    if slot.is_table() || slot.is_array() {
                        return Err(ConfigError::new(&flag, &here, "is a table or array, not a scalar"));
                    }
                    *slot = parse_scalar(raw.trim());
                    return Ok(());
                }
                slot
            }
            _ => {
                return Err(ConfigError::new(
                    &flag,
                    segs[..i].join("."),
                    "is a scalar, it has no fields",
                ))
            }
        };
    }
    unreachable!("loop returns on the last segment")
}

/// Resolve a path written in a file relative to that file's directory.
pub fn resolve_relative(base_file: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_file.parent().unwrap_or(Path::new(".")).join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_paths() {
        let mut v = parse_toml("t", "workers = 64\n[[experiment]]\nname = \"a\"\n[x]\ny = 1\n").unwrap();
        apply_set(&mut v, "workers=16").unwrap();
        apply_set(&mut v, "experiment.0.workers=8").unwrap();
        apply_set(&mut v, "x.y=0.5").unwrap();
        assert_eq!(v["workers"].as_integer(), Some(16));
        assert_eq!(v["experiment"][0]["workers"].as_integer(), Some(8));
        assert_eq!(v["x"]["y"].as_float(), Some(0.5));
        let e = apply_set(&mut v, "nope.z=1").unwrap_err();
        assert_eq!(e.field, "nope");
        assert!(apply_set(&mut v, "experiment.3.workers=1").is_err());
        assert!(apply_set(&mut v, "x=1").is_err());
        assert!(apply_set(&mut v, "novalue").is_err());
    }
}

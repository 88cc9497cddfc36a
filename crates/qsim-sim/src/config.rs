//! Configuration loading: TOML files → `toml::Value` (with `--set`
//! overrides) → serde `Raw*` structs (`deny_unknown_fields`) → validated
//! types. Every error names the file, the field path and the reason.
//!
//! Errors print as one line, `qsim: <file>: <field path>: <reason>`. Field
//! paths have one style: dotted, an array item by its index
//! (`experiment.0.retry.base_s`; [`ConfigError::new`] rewrites serde's
//! `experiment[0]` so), and the CLI then names items that have a `name`
//! by it ([`ConfigError::named_in`]: `experiment.exp2-backoff.retry.base_s`,
//! `scenario.heavy.rpm`). A flag is a source of its own: `qsim: --out x: …`.

use serde::de::DeserializeOwned;
use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration error: exit code 2.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The file (or `--flag`) the error is about.
    pub source: String,
    /// Dotted path of the offending field (array items by index, or by
    /// name after [`ConfigError::named_in`]), empty if it concerns the
    /// whole source.
    pub field: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(
        source: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        ConfigError {
            source: source.into(),
            field: dotted(&field.into()),
            reason: reason.into(),
        }
    }

    /// Name array items by their `name` in the field path: with `root` the
    /// document the error is about, `experiment.1.retry.base_s` becomes
    /// `experiment.exp2-backoff.retry.base_s`. Items without a name, or
    /// whose name is not unique in their array, keep their index.
    pub fn named_in(mut self, root: &toml::Value) -> Self {
        if self.field.is_empty() {
            return self;
        }
        let mut cur = Some(root);
        let mut out: Vec<String> = Vec::new();
        for seg in self.field.split('.') {
            let mut label = seg.to_string();
            cur = match (cur, seg.parse::<usize>()) {
                (Some(toml::Value::Array(a)), Ok(i)) => {
                    fn name_of(v: &toml::Value) -> Option<&str> {
                        v.get("name").and_then(|n| n.as_str())
                    }
                    if let Some(n) = a.get(i).and_then(name_of) {
                        if !n.is_empty() && a.iter().filter(|v| name_of(v) == Some(n)).count() == 1
                        {
                            label = path_label(n);
                        }
                    }
                    a.get(i)
                }
                (Some(v @ toml::Value::Table(_)), _) => v.get(seg),
                _ => None,
            };
            out.push(label);
        }
        self.field = out.join(".");
        self
    }

    /// Prefix the field path with `prefix` (for nested validation).
    pub fn under(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            let prefix = dotted(prefix);
            self.field = if self.field.is_empty() {
                prefix
            } else {
                format!("{prefix}.{}", self.field)
            };
        }
        self
    }
}

/// `a[0].b` → `a.0.b`: the one path style.
fn dotted(field: &str) -> String {
    if field.contains('[') {
        field
            .replace("].", ".")
            .replace(['[', ']'], ".")
            .trim_end_matches('.')
            .to_string()
    } else {
        field.to_string()
    }
}

/// An item name as a path segment: quoted if it could be misread.
fn path_label(name: &str) -> String {
    if name.contains(['.', ' ', '"', ':']) || name.parse::<usize>().is_ok() {
        format!("{name:?}")
    } else {
        name.to_string()
    }
}

/// Squash a (possibly multi-line) message into one line.
pub fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = one_line(&self.reason);
        if self.field.is_empty() {
            write!(f, "{}: {}", self.source, reason)
        } else {
            write!(f, "{}: {}: {}", self.source, self.field, reason)
        }
    }
}

/// A model file given where an experiment file is expected: the error that
/// says so, if `v` (the document of `source`) looks like a server or a
/// hosted-API profile rather than an experiment.
pub fn profile_not_experiment(source: &str, v: &toml::Value) -> Option<ConfigError> {
    let has = |k: &str| v.get(k).is_some();
    match v.get("kind").and_then(|k| k.as_str()) {
        Some("server")
            if !has("scenario") && ["scheduler", "kv_cache", "iteration"].iter().any(|k| has(k)) =>
        {
            Some(ConfigError::new(
                source,
                "",
                "this is a server profile (kind = \"server\"), not an experiment file; an experiment file names it with `server = \"...\"` (see experiments/nim-load.toml), or pass it to qsim plan --model",
            ))
        }
        Some("hosted")
            if !has("experiment") && ["limits", "rejection", "latency"].iter().any(|k| has(k)) =>
        {
            Some(ConfigError::new(
                source,
                "",
                "this is a hosted-API profile (kind = \"hosted\"), not an experiment file; an experiment file names it with `endpoint = \"...\"` (see experiments/fmapi-pacing.toml)",
            ))
        }
        _ => None,
    }
}

/// Validate a duration in seconds read from a file or flag: finite, at
/// least 0 (above 0 if `positive`) and at most [`crate::time::MAX_SECS`],
/// so that it and sums of many such durations fit the nanosecond clock.
pub fn duration_s(source: &str, field: &str, v: f64, positive: bool) -> Result<f64, ConfigError> {
    let r = if positive {
        crate::time::try_secs_positive(v)
    } else {
        crate::time::try_secs(v)
    };
    r.map(|_| v)
        .map_err(|e| ConfigError::new(source, field, e.to_string()))
}

impl std::error::Error for ConfigError {}

/// Every file [`read_toml`] has read in this process (name → contents),
/// for the `manifest.json` of `--out DIR`.
static FILES_READ: std::sync::Mutex<std::collections::BTreeMap<String, String>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

pub(crate) fn note_read(src: &str, text: &str) {
    let mut m = FILES_READ.lock().unwrap_or_else(|p| p.into_inner());
    if m.get(src).map(String::as_str) != Some(text) {
        m.insert(src.to_string(), text.to_string());
    }
}

/// The files read so far, in name order: (name as given, contents).
pub fn files_read() -> Vec<(String, String)> {
    let m = FILES_READ.lock().unwrap_or_else(|p| p.into_inner());
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// The contents of an embedded file the binary cannot be built without
/// (noted as read, for the manifest's inputs).
pub fn embedded_must(name: &str) -> &'static str {
    let text = crate::embedded::get(name).unwrap_or_else(|| panic!("{name} is not embedded"));
    note_read(&format!("{}{name}", crate::embedded::PREFIX), text);
    text
}

/// Read and parse a TOML file, or an embedded one (`builtin:NAME`).
pub fn read_toml(path: &Path) -> Result<toml::Value, ConfigError> {
    let src = path.display().to_string();
    if let Some(name) = src.strip_prefix(crate::embedded::PREFIX) {
        let text = crate::embedded::get(name)
            .ok_or_else(|| ConfigError::new(&src, "", "no such embedded file"))?;
        note_read(&src, text);
        return parse_toml(&src, text);
    }
    let text = crate::input::read_text(path, crate::input::Kind::Config)
        .map_err(|e| ConfigError::new(&src, "", e))?;
    note_read(&src, &text);
    parse_toml(&src, &text)
}

/// Does a file (or embedded file) exist?
pub fn source_exists(path: &Path) -> bool {
    let s = path.display().to_string();
    match s.strip_prefix(crate::embedded::PREFIX) {
        Some(name) => crate::embedded::get(name).is_some(),
        None => path.is_file(),
    }
}

/// Why a referenced file (a profile, a batch) cannot be read, as the end of
/// a message about it: `"{what} not found: PATH"` when nothing is there
/// (or no embedded file has the name), else the bounded reader's reason
/// (`PATH: cannot read: a FIFO, not a regular file …`), checked before the
/// path is opened or resolved through a link.
pub fn source_problem(what: &str, path: &Path) -> Option<String> {
    let s = path.display().to_string();
    if let Some(name) = s.strip_prefix(crate::embedded::PREFIX) {
        return crate::embedded::get(name)
            .is_none()
            .then(|| format!("{what} not found: {s}"));
    }
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("{what} not found: {s}"))
        }
        _ => crate::input::check(path)
            .err()
            .map(|r| format!("{what} {s}: {r}")),
    }
}

/// Rewrite an error's field path to name array items (`scenario.heavy.rpm`,
/// not `scenario.2.rpm`), reading the document it is about: `file` with the
/// `--set` overrides if the error is about it, else the file (or embedded
/// file) the error names.
pub fn name_fields(e: ConfigError, file: Option<&Path>, sets: &[String]) -> ConfigError {
    if !e.field.split('.').any(|s| s.parse::<usize>().is_ok()) {
        return e;
    }
    let doc = match file {
        Some(f) if f.display().to_string() == e.source => read_toml(f).ok().map(|mut v| {
            for s in sets {
                let _ = apply_set(&mut v, s);
            }
            v
        }),
        _ => {
            let name = e
                .source
                .strip_suffix(" (embedded)")
                .map(|n| PathBuf::from(format!("{}{n}", crate::embedded::PREFIX)));
            let p = name.unwrap_or_else(|| PathBuf::from(&e.source));
            if source_exists(&p) {
                read_toml(&p).ok()
            } else {
                None
            }
        }
    };
    match doc {
        Some(v) => e.named_in(&v),
        None => e,
    }
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

/// Check a file's `kind` field against the kind expected here (`what`
/// describes it in the message, e.g. "a server profile").
pub fn expect_kind(file: &str, got: &str, want: &str, what: &str) -> Result<(), ConfigError> {
    if got == want {
        return Ok(());
    }
    Err(ConfigError::new(
        file,
        "kind",
        format!("expected {want:?} for {what}, got {got:?}"),
    ))
}

/// Apply `--set path=value` to a parsed file. Path segments are separated by
/// dots; a numeric segment indexes an array (`experiment.1.workers=8`), and
/// so does the `name` of an item (`consumer.A.reserved_pct=40`). The
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
    // `option[2].replicas` (as errors name fields) is `option.2.replicas`
    let path = path.replace('[', ".").replace(']', "");
    let segs: Vec<&str> = path.split('.').filter(|s| !s.is_empty()).collect();
    let mut cur = root;
    for (i, seg) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let here = segs[..=i].join(".");
        cur = match cur {
            toml::Value::Table(t) => {
                if last {
                    if let Some(old) = t.get(*seg) {
                        if old.is_table() || old.is_array() {
                            return Err(ConfigError::new(
                                &flag,
                                &here,
                                "is a table or array, not a scalar",
                            ));
                        }
                    }
                    t.insert(seg.to_string(), parse_scalar(raw.trim()));
                    return Ok(());
                }
                t.get_mut(*seg)
                    .ok_or_else(|| ConfigError::new(&flag, &here, "no such field in the file"))?
            }
            toml::Value::Array(a) => {
                // an index, or the `name` of a table in the array
                let idx: usize = match seg.parse() {
                    Ok(i) => i,
                    Err(_) => a
                        .iter()
                        .position(|x| x.get("name").and_then(|n| n.as_str()) == Some(*seg))
                        .ok_or_else(|| {
                            ConfigError::new(
                                &flag,
                                &here,
                                "expected an array index or the name of an item",
                            )
                        })?,
                };
                let len = a.len();
                let slot = a.get_mut(idx).ok_or_else(|| {
                    ConfigError::new(
                        &flag,
                        &here,
                        format!("index out of range (array has {len} elements)"),
                    )
                })?;
                if last {
                    if slot.is_table() || slot.is_array() {
                        return Err(ConfigError::new(
                            &flag,
                            &here,
                            "is a table or array, not a scalar",
                        ));
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
    let base = base_file.display().to_string();
    if let Some(name) = base.strip_prefix(crate::embedded::PREFIX) {
        if !p.starts_with(crate::embedded::PREFIX) && !Path::new(p).is_absolute() {
            return PathBuf::from(format!(
                "{}{}",
                crate::embedded::PREFIX,
                crate::embedded::join(name, p)
            ));
        }
    }
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
        let mut v = parse_toml(
            "t",
            "workers = 64\n[[experiment]]\nname = \"a\"\n[x]\ny = 1\n",
        )
        .unwrap();
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

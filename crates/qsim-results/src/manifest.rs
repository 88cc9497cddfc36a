//! `manifest.json`: what produced an output directory. Only things that
//! follow from the inputs and the command line are recorded — no
//! timestamps, host names or thread counts — so the manifest is
//! byte-identical whenever the tables are.

use crate::error::ResultsError;
use crate::results::Axis;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The SHA-256 of `bytes` as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An input file: its name as qsim read it (a path, or `builtin:NAME` for
/// an embedded file) and the SHA-256 of its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub path: String,
    pub sha256: String,
}

impl Input {
    pub fn new(path: impl Into<String>, contents: &[u8]) -> Self {
        Input {
            path: path.into(),
            sha256: sha256_hex(contents),
        }
    }
}

/// A shard that a merged directory was made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedShard {
    pub dir: String,
    pub command: Vec<String>,
}

/// The manifest of an output directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// qsim's version.
    pub version: String,
    /// The command line, program name first (`qsim`).
    pub command: Vec<String>,
    /// Every file read, in name order.
    pub inputs: Vec<Input>,
    pub seed: u64,
    pub seeds: u64,
    /// The swept parameters (none for run and plan).
    pub axes: Vec<Axis>,
    /// (index, count) for `qsim sweep --shard I/N`.
    pub shard: Option<(usize, usize)>,
    /// For `qsim merge`: the shards, in shard order.
    pub merged: Vec<MergedShard>,
}

impl Manifest {
    /// The manifest as pretty JSON (with a final newline), listing `files`
    /// (name, bytes) with their sizes and hashes.
    pub fn to_json(&self, files: &[(String, Vec<u8>)]) -> String {
        let v = json!({
            "qsim_version": self.version,
            "command": self.command,
            "inputs": self.inputs.iter().map(|i| json!({"path": i.path, "sha256": i.sha256})).collect::<Vec<_>>(),
            "seed": self.seed,
            "seeds": self.seeds,
            "grid": {
                "points": crate::results::grid_size(&self.axes),
                "axes": self.axes.iter().map(|a| json!({"path": a.path, "values": a.values})).collect::<Vec<_>>(),
            },
            "shard": self.shard.map(|(i, n)| json!({"index": i, "count": n})),
            "merged_from": self.merged.iter().map(|m| json!({"dir": m.dir, "command": m.command})).collect::<Vec<_>>(),
            "files": files.iter().map(|(n, b)| json!({"name": n, "bytes": b.len(), "sha256": sha256_hex(b)})).collect::<Vec<_>>(),
        });
        let mut s = serde_json::to_string_pretty(&v).expect("a JSON value always serializes");
        s.push('\n');
        s
    }

    /// Read a manifest written by [`Manifest::to_json`]; `what` names the
    /// file in errors.
    pub fn parse(what: &str, text: &str) -> Result<Manifest, ResultsError> {
        let bad = |r: &str| ResultsError::new(what, r.to_string());
        let v: Value = serde_json::from_str(text)
            .map_err(|e| ResultsError::new(what, format!("invalid JSON: {e}")))?;
        let s = |k: &str| -> Result<String, ResultsError> {
            v[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(&format!("{k}: missing or not a string")))
        };
        let u = |k: &str| -> Result<u64, ResultsError> {
            v[k].as_u64()
                .ok_or_else(|| bad(&format!("{k}: missing or not a whole number")))
        };
        let strings = |x: &Value, k: &str| -> Result<Vec<String>, ResultsError> {
            x.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|e| e.as_str().map(str::to_string))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| bad(&format!("{k}: missing or not a list of strings")))
        };
        let inputs = v["inputs"]
            .as_array()
            .ok_or_else(|| bad("inputs: missing or not a list"))?
            .iter()
            .map(|i| match (i["path"].as_str(), i["sha256"].as_str()) {
                (Some(p), Some(h)) => Ok(Input {
                    path: p.into(),
                    sha256: h.into(),
                }),
                _ => Err(bad("inputs: each needs a path and a sha256")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let axes = v["grid"]["axes"]
            .as_array()
            .ok_or_else(|| bad("grid.axes: missing or not a list"))?
            .iter()
            .map(|a| {
                Ok(Axis {
                    path: a["path"]
                        .as_str()
                        .ok_or_else(|| bad("grid.axes: each needs a path"))?
                        .into(),
                    values: strings(&a["values"], "grid.axes.values")?,
                })
            })
            .collect::<Result<Vec<_>, ResultsError>>()?;
        let shard = match &v["shard"] {
            Value::Null => None,
            sh => match (sh["index"].as_u64(), sh["count"].as_u64()) {
                (Some(i), Some(n)) if i < n => Some((i as usize, n as usize)),
                _ => return Err(bad("shard: needs index < count")),
            },
        };
        let merged = match &v["merged_from"] {
            Value::Null => vec![],
            m => m
                .as_array()
                .ok_or_else(|| bad("merged_from: not a list"))?
                .iter()
                .map(|x| {
                    Ok(MergedShard {
                        dir: x["dir"].as_str().unwrap_or_default().into(),
                        command: strings(&x["command"], "merged_from.command")?,
                    })
                })
                .collect::<Result<Vec<_>, ResultsError>>()?,
        };
        Ok(Manifest {
            version: s("qsim_version")?,
            command: strings(&v["command"], "command")?,
            inputs,
            seed: u("seed")?,
            seeds: u("seeds")?,
            axes,
            shard,
            merged,
        })
    }
}

//! Merge the output directories of `qsim sweep --shard I/N --out DIR` into
//! the tables a single-machine run writes: each shard's runs are read back
//! from its `runs.parquet` and pushed again, so the merged tables are built
//! by the same code, in the same order, as the unsharded ones.

use crate::error::ResultsError;
use crate::manifest::{sha256_hex, Manifest, MergedShard};
use crate::read::Load;
use crate::results::{Results, ResultsBuilder, MANIFEST, RUNS_PARQUET};
use polars::prelude::*;
use std::path::{Path, PathBuf};

/// A merged result: the tables and the manifest to write with them.
pub struct Merged {
    pub results: Results,
    pub manifest: Manifest,
}

/// Merge shard directories (any order). `command` is the merge's command
/// line, recorded in the merged manifest with each shard's own.
pub fn merge_dirs(
    dirs: &[PathBuf],
    command: Vec<String>,
    load: Load,
) -> Result<Merged, ResultsError> {
    let mut shards: Vec<(String, Manifest, PathBuf)> = Vec::new();
    for d in dirs {
        let name = d.display().to_string();
        let mpath = d.join(MANIFEST);
        let text = load(&mpath)
            .and_then(|b| String::from_utf8(b).map_err(|e| format!("not UTF-8: {e}")))
            .map_err(|e| {
                ResultsError::new(
                    &name,
                    format!(
                        "not a qsim output directory: cannot read {MANIFEST}: {}",
                        e.trim_start_matches("cannot read: ")
                    ),
                )
            })?;
        let m = Manifest::parse(&mpath.display().to_string(), &text)?;
        if m.shard.is_none() {
            return Err(ResultsError::new(
                &name,
                "not a shard (written without --shard I/N): nothing to merge it with",
            ));
        }
        check_file_hash(&name, d, &text, load)?;
        shards.push((name, m, d.clone()));
    }
    let Some((first_name, first, _)) = shards.first().cloned() else {
        return Err(ResultsError::new("qsim merge", "no directories given"));
    };
    let count = first.shard.map_or(0, |s| s.1);
    let mut owner: Vec<Option<&str>> = vec![None; count];
    for (name, m, _) in &shards {
        let differ = |what: &str| {
            ResultsError::new(
                name,
                format!("its {what} differ from those of {first_name}: shards of different sweeps"),
            )
        };
        if m.version != first.version {
            return Err(differ("qsim version and results"));
        }
        if m.inputs != first.inputs {
            return Err(differ("input files (sha256)"));
        }
        if m.axes != first.axes {
            return Err(differ("grid axes"));
        }
        if (m.seed, m.seeds) != (first.seed, first.seeds) {
            return Err(differ("seeds"));
        }
        let (i, n) = m.shard.expect("checked above");
        if n != count {
            return Err(differ("shard counts"));
        }
        if let Some(other) = owner[i] {
            return Err(ResultsError::new(
                name,
                format!("shard {i}/{n} is also {other}: a shard given twice"),
            ));
        }
        owner[i] = Some(name);
    }
    if let Some(missing) = owner.iter().position(Option::is_none) {
        return Err(ResultsError::new(
            "qsim merge",
            format!("shard {missing}/{count} is in none of the directories: a shard is missing"),
        ));
    }
    shards.sort_by_key(|(_, m, _)| m.shard.map(|s| s.0));
    let mut b = ResultsBuilder::new(first.axes.clone());
    for (name, m, dir) in &shards {
        push_runs(&mut b, name, dir, m, load)?;
    }
    let manifest = Manifest {
        version: first.version.clone(),
        command,
        inputs: first.inputs.clone(),
        seed: first.seed,
        seeds: first.seeds,
        axes: first.axes.clone(),
        shard: None,
        merged: shards
            .iter()
            .map(|(name, m, _)| MergedShard {
                dir: name.clone(),
                command: m.command.clone(),
            })
            .collect(),
    };
    Ok(Merged {
        results: b.finish(),
        manifest,
    })
}

/// The shard's runs.parquet must be the one its manifest lists.
fn check_file_hash(name: &str, dir: &Path, manifest: &str, load: Load) -> Result<(), ResultsError> {
    let v: serde_json::Value = serde_json::from_str(manifest)
        .map_err(|e| ResultsError::new(name, format!("{MANIFEST}: {e}")))?;
    let want = v["files"]
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["name"] == RUNS_PARQUET))
        .and_then(|f| f["sha256"].as_str())
        .ok_or_else(|| ResultsError::new(name, format!("{MANIFEST} lists no {RUNS_PARQUET}")))?;
    let p = dir.join(RUNS_PARQUET);
    let bytes = load(&p).map_err(|e| ResultsError::new(p.display().to_string(), e))?;
    if sha256_hex(&bytes) != want {
        return Err(ResultsError::new(
            p.display().to_string(),
            format!("does not match the sha256 in {MANIFEST}: changed after qsim wrote it"),
        ));
    }
    Ok(())
}

fn push_runs(
    b: &mut ResultsBuilder,
    name: &str,
    dir: &Path,
    m: &Manifest,
    load: Load,
) -> Result<(), ResultsError> {
    let p = dir.join(RUNS_PARQUET);
    let what = p.display().to_string();
    let bad = |r: String| ResultsError::new(&what, r);
    let bytes = load(&p).map_err(bad)?;
    let df = ParquetReader::new(std::io::Cursor::new(bytes))
        .finish()
        .map_err(|e| bad(e.to_string()))?;
    let names: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let mut fixed: Vec<&str> = vec!["point"];
    fixed.extend(m.axes.iter().map(|a| a.path.as_str()));
    fixed.extend(["seed", "subject"]);
    if names.len() < fixed.len() || names[..fixed.len()] != fixed[..] {
        return Err(bad(format!(
            "expected the columns {} first",
            fixed.join(", ")
        )));
    }
    let pe = |e: PolarsError| bad(e.to_string());
    let point = df.column("point").map_err(pe)?.u32().map_err(pe)?;
    let seed = df.column("seed").map_err(pe)?.u64().map_err(pe)?;
    let subject = df.column("subject").map_err(pe)?.str().map_err(pe)?;
    let metrics: Vec<(&str, &Float64Chunked)> = names[fixed.len()..]
        .iter()
        .map(|n| Ok((n.as_str(), df.column(n).map_err(pe)?.f64().map_err(pe)?)))
        .collect::<Result<_, ResultsError>>()?;
    let (index, count) = m.shard.expect("a shard");
    for row in 0..df.height() {
        let (Some(p), Some(s), Some(subj)) = (point.get(row), seed.get(row), subject.get(row))
        else {
            return Err(bad(format!(
                "row {}: point, seed or subject missing",
                row + 1
            )));
        };
        let p = p as usize;
        if p % count != index {
            return Err(bad(format!(
                "row {}: point {p} does not belong to shard {index}/{count} ({name})",
                row + 1
            )));
        }
        for (cname, col) in &metrics {
            let mname = crate::results::column_metric(cname, &fixed);
            if let Some(v) = col.get(row) {
                b.push(p, s, subj, mname, v)
                    .map_err(|e| bad(format!("row {}: {}", row + 1, e.reason)))?;
            }
        }
    }
    Ok(())
}

//! A Pacer's policy: the client of a hosted experiment, validated by the
//! simulation's own loader (`HostedSuite::from_value`), so a policy given
//! as a Python dict, an experiment file's client and `--set`-style
//! overrides mean exactly what they mean to `qsim run`, with the same
//! errors (fields named as the user wrote them).

use qsim_sim::config::ConfigError;
use qsim_sim::experiment::config::ClientKind;
use qsim_sim::experiment::ExperimentFile;
use std::path::Path;

/// A validated client and the random stream scope the simulation gives it
/// (`1 + the experiment's index in its file`).
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub client: ClientKind,
    pub scope: u64,
    /// The experiment's rows and max_tokens (what `recommend` sized).
    pub rows: u64,
    pub max_tokens: u64,
}

/// The suite-level keys of a policy dict (the rest belong to the one
/// experiment).
const SUITE_KEYS: &[&str] = &["workers", "sdk_retries", "sdk", "policy", "managed"];

/// A policy dict (JSON text from Python) → the client, through a
/// one-experiment hosted document. Error paths are the dict's own
/// (`retry.base_s`), the source `policy`.
pub fn from_dict(json: &str) -> Result<Policy, ConfigError> {
    let src = "policy";
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| ConfigError::new(src, "", e.to_string()))?;
    let serde_json::Value::Object(map) = v else {
        return Err(ConfigError::new(src, "", "must be a dict"));
    };
    let mut suite = toml::map::Map::new();
    let mut exp = toml::map::Map::new();
    exp.insert("name".into(), "pacer".into());
    exp.insert("client".into(), "pool".into());
    for (k, v) in map {
        if v.is_null() {
            continue;
        }
        let tv: toml::Value = serde_json::from_value(v)
            .map_err(|e| ConfigError::new(src, k.as_str(), e.to_string()))?;
        if SUITE_KEYS.contains(&k.as_str()) {
            suite.insert(k, tv);
        } else {
            exp.insert(k, tv);
        }
    }
    // the simulation's defaults for what a Pacer does not use
    suite
        .entry("workers".to_string())
        .or_insert(toml::Value::Integer(1));
    suite.insert("kind".into(), "hosted".into());
    suite.insert(
        "endpoint".into(),
        "builtin:models/databricks-claude-haiku-4-5.toml".into(),
    );
    suite.insert("rows".into(), toml::Value::Integer(1));
    suite.insert("max_tokens".into(), toml::Value::Integer(1));
    let dist: toml::Value = toml::from_str("dist = \"const\"\nvalue = 1").expect("a constant");
    suite.insert("input_tokens".into(), dist.clone());
    suite.insert("output_tokens".into(), dist);
    suite.insert(
        "experiment".into(),
        toml::Value::Array(vec![toml::Value::Table(exp)]),
    );
    let doc = toml::Value::Table(suite);
    let s = qsim_sim::experiment::HostedSuite::from_value(Path::new(src), doc).map_err(unnest)?;
    let e = &s.experiments[0];
    Ok(Policy {
        name: "policy".into(),
        client: e.client.clone(),
        scope: 1 + e.index,
        rows: e.rows,
        max_tokens: e.max_tokens,
    })
}

/// An error about the dict's one experiment names the dict's own field.
fn unnest(mut e: ConfigError) -> ConfigError {
    for p in ["experiment.0.", "experiment[0]."] {
        if let Some(rest) = e.field.strip_prefix(p) {
            e.field = rest.to_string();
        }
    }
    if e.field == "experiment.0" || e.field == "experiment[0]" {
        e.field.clear();
    }
    e
}

/// The client of experiment `name` (default: the file's only pool or
/// managed experiment; with several, the name is needed) of a hosted
/// experiment file, after `sets` (`--set` overrides).
pub fn from_file(file: &str, name: Option<&str>, sets: &[String]) -> Result<Policy, ConfigError> {
    let path = Path::new(file);
    let suite = match crate::sim::load(path, sets)? {
        ExperimentFile::Hosted(s) => s,
        _ => return Err(ConfigError::new(
            file,
            "kind",
            "a Pacer needs a hosted experiment file (kind = \"hosted\"): its client is the policy",
        )),
    };
    let names: Vec<&str> = suite.experiments.iter().map(|e| e.name.as_str()).collect();
    let e = match name {
        Some(n) => suite
            .experiments
            .iter()
            .find(|e| e.name == n)
            .ok_or_else(|| {
                ConfigError::new(
                    "experiment",
                    "",
                    format!(
                        "no experiment named {n:?}; the file has {}",
                        names.join(", ")
                    ),
                )
            })?,
        None if suite.experiments.len() == 1 => &suite.experiments[0],
        None => {
            return Err(ConfigError::new(
                "experiment",
                "",
                format!(
                    "{file} has {} experiments: name one ({})",
                    names.len(),
                    names.join(", ")
                ),
            ))
        }
    };
    Ok(Policy {
        name: e.name.clone(),
        client: e.client.clone(),
        scope: 1 + e.index,
        rows: e.rows,
        max_tokens: e.max_tokens,
    })
}

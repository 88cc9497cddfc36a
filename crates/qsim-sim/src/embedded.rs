//! Files embedded in the binary so that the main jobs run with no files at
//! hand: `qsim run` with no file runs `builtin:experiments/fmapi-pacing.toml`.
//! A path `builtin:NAME` names one of these; relative paths inside an
//! embedded file resolve to other embedded files.

pub const PREFIX: &str = "builtin:";

/// (repository path, contents) of every embedded file.
pub const FILES: &[(&str, &str)] = &[
    (
        "experiments/fmapi-pacing.toml",
        include_str!("../../../experiments/fmapi-pacing.toml"),
    ),
    (
        "models/databricks-claude-haiku-4-5.toml",
        include_str!("../../../models/databricks-claude-haiku-4-5.toml"),
    ),
    (
        "experiments/shared-deployment.toml",
        include_str!("../../../experiments/shared-deployment.toml"),
    ),
    (
        "experiments/team-goes-wild.toml",
        include_str!("../../../experiments/team-goes-wild.toml"),
    ),
    (
        "models/gpt-oss-20b-h100-nim.toml",
        include_str!("../../../models/gpt-oss-20b-h100-nim.toml"),
    ),
];

/// The contents of `builtin:NAME`, if embedded.
pub fn get(name: &str) -> Option<&'static str> {
    FILES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c)
}

/// Join a relative path onto an embedded file's directory, resolving `..`.
pub fn join(base: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = base.split('/').collect();
    parts.pop(); // the file name
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn embedded_paths_resolve() {
        assert_eq!(
            join(
                "experiments/fmapi-pacing.toml",
                "../models/databricks-claude-haiku-4-5.toml"
            ),
            "models/databricks-claude-haiku-4-5.toml"
        );
        for (name, _) in FILES {
            assert!(get(name).is_some());
        }
    }
}

//! Files embedded in the binary so that every shipped experiment runs with
//! no files at hand: `qsim run` with no file runs
//! `builtin:experiments/fmapi-pacing.toml`. A path `builtin:NAME` names one
//! of these; relative paths inside an embedded file resolve to other
//! embedded files. `qsim examples` lists them; a missing path that names
//! one of them is answered with its `builtin:` name. Every file shipped in
//! experiments/ (its TOML files, the measured data and the traces under
//! data/) and models/ is here (a test checks the directories against this
//! list).

pub const PREFIX: &str = "builtin:";

macro_rules! embed {
    ($p:literal) => {
        ($p, include_str!(concat!("../../../", $p)))
    };
}

/// (repository path, contents) of every embedded file, in path order.
pub const FILES: &[(&str, &str)] = &[
    embed!("experiments/azure-traces.toml"),
    embed!("experiments/daily-autoscale.toml"),
    embed!("experiments/data/llama-8b-fidelity-measured.toml"),
    embed!("experiments/data/llama-8b-vllm-blis-measured.toml"),
    embed!("experiments/data/llama-8b-vllm-guidellm-measured.toml"),
    embed!("experiments/data/traces/AzureLLMInferenceTrace_code.csv"),
    embed!("experiments/data/traces/AzureLLMInferenceTrace_conv.csv"),
    embed!("experiments/fmapi-pacing.toml"),
    embed!("experiments/fmapi-policies.toml"),
    embed!("experiments/llama-8b-clients.toml"),
    embed!("experiments/llama-8b-fidelity.toml"),
    embed!("experiments/llama-8b-vllm-blis.toml"),
    embed!("experiments/llama-8b-vllm-guidellm-sat.toml"),
    embed!("experiments/nim-load.toml"),
    embed!("experiments/options-fmapi.toml"),
    embed!("experiments/shared-deployment.toml"),
    embed!("models/anthropic-claude-haiku-example-tier.toml"),
    embed!("models/azure-openai-gpt-4o-30k-tpm.toml"),
    embed!("models/azure-openai-gpt-4o-ptu.toml"),
    embed!("models/databricks-claude-haiku-4-5.toml"),
    embed!("models/gpt-oss-20b-h100-nim.toml"),
    embed!("models/llama-3.1-8b-fp8-h100-nim.toml"),
    embed!("models/llama-3.1-8b-h100-vllm-blis.toml"),
    embed!("models/llama-3.1-8b-h100-vllm-v072.toml"),
    embed!("models/llama-3.1-8b-h100-vllm.toml"),
    embed!("models/llama-cpp-tiny-cpu.toml"),
];

/// The embedded file a path names, if any: the path as given, or its end
/// from `experiments/` or `models/` on (`../qsim/experiments/x.toml`,
/// `/home/me/models/m.toml`), for a "did you mean `builtin:…`" hint.
pub fn suggest(path: &str) -> Option<&'static str> {
    let path = path.replace('\\', "/");
    FILES
        .iter()
        .map(|(n, _)| *n)
        .find(|n| path == *n || path.ends_with(&format!("/{n}")))
}

/// One embedded file, as `qsim examples` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Example {
    /// `builtin:` + the repository path.
    pub path: String,
    /// `hosted`, `server`, `shared`, `options`, … (the file's `kind`), or
    /// `trace` / `data`.
    pub kind: String,
    /// The file's `title` or `description`, else its first comment line.
    pub about: String,
    pub bytes: usize,
}

/// Every embedded file with its kind and what it is about, in path order.
pub fn catalogue() -> Vec<Example> {
    FILES
        .iter()
        .map(|(name, text)| {
            let (kind, about) = if name.ends_with(".csv") {
                let rows = text.lines().count().saturating_sub(1);
                (
                    "trace".to_string(),
                    format!("request trace, {rows} requests"),
                )
            } else {
                let v: Option<toml::Table> = toml::from_str(text).ok();
                let get = |k: &str| {
                    v.as_ref()
                        .and_then(|t| t.get(k))
                        .and_then(|x| x.as_str())
                        .map(str::to_string)
                };
                let comment = || {
                    text.lines()
                        .find_map(|l| l.strip_prefix('#').map(str::trim))
                        .filter(|l| !l.is_empty())
                        .map(str::to_string)
                };
                let kind = get("kind").unwrap_or_else(|| "data".into());
                let about = get("title")
                    .or_else(|| get("description"))
                    .or_else(comment)
                    .unwrap_or_default();
                (kind, about)
            };
            Example {
                path: format!("{PREFIX}{name}"),
                kind,
                about,
                bytes: text.len(),
            }
        })
        .collect()
}

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

    /// Every shipped experiment, measured data file, trace and model is
    /// embedded (a new file must be added to FILES).
    #[test]
    fn every_shipped_file_is_embedded() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut want = Vec::new();
        for (dir, ext) in [
            ("experiments", "toml"),
            ("experiments/data", "toml"),
            ("experiments/data/traces", "csv"),
            ("models", "toml"),
        ] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let p = e.unwrap().path();
                if p.is_file() && p.extension().is_some_and(|x| x == ext) {
                    want.push(format!(
                        "{dir}/{}",
                        p.file_name().unwrap().to_string_lossy()
                    ));
                }
            }
        }
        want.sort();
        let have: Vec<String> = FILES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(have, want);
    }
}

//! Issue 37's paths and discoverability, checked against the binary:
//! every subcommand is listed by `qsim --help` and has a synopsis in
//! docs/guide/reference.md naming exactly the flags its `--help` names; a
//! README path run outside the checkout is answered with its `builtin:`
//! name; `qsim examples` lists every embedded file and prints one; every
//! shipped experiment runs from an empty directory by its `builtin:` path;
//! a missing required flag is one readable line.

use crate::common::qsim;
use std::collections::{BTreeMap, BTreeSet};

fn out(args: &[&str]) -> (Option<i32>, String, String) {
    let o = qsim().args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The names under a help text's `Commands:` heading (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect()
}

/// The `--long` flags a help text's options name (not --help/--version):
/// the first word of an option line (`  -s, --long <V>  …` or `      --long`).
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Options:"))
        .filter_map(|l| {
            let l = l.trim_start();
            let l = match l.as_bytes() {
                [b'-', c, b',', b' ', ..] if *c != b'-' => &l[4..],
                _ => l,
            };
            let f: String = l
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '-')
                .collect();
            (!f.is_empty()).then(|| format!("--{f}"))
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

/// Every leaf command: ["run"], ["trace", "stats"], ….
fn leaves() -> Vec<Vec<String>> {
    let (_, top, _) = out(&["--help"]);
    let mut v = Vec::new();
    for c in subcommands(&top) {
        let (_, h, _) = out(&[&c, "--help"]);
        let subs = subcommands(&h);
        if subs.is_empty() {
            v.push(vec![c]);
        } else {
            v.extend(subs.into_iter().map(|s| vec![c.clone(), s]));
        }
    }
    v
}

/// reference.md's synopsis bullets (`- \`qsim CMD …\``, joined over their
/// lines), per command path: the flags they name.
fn synopses() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/guide/reference.md"),
    )
    .unwrap();
    let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let bullets = text.split("\n- ").skip(1);
    for b in bullets {
        let Some(code) = b.strip_prefix("`qsim ") else {
            continue;
        };
        let code = &code[..code.find('`').unwrap_or(code.len())];
        let words: Vec<&str> = code.split_whitespace().collect();
        let path: Vec<&str> = words
            .iter()
            .take_while(|w| {
                w.chars()
                    .all(|c| c.is_ascii_lowercase() || c == '2' || c == '-')
                    && !w.starts_with('-')
            })
            .copied()
            .take(2)
            .collect();
        let flags = m.entry(path.join(" ")).or_default();
        for w in &words {
            for part in w.split(['[', ']', '|', '(', ')', '…', '"']) {
                if let Some(f) = part.strip_prefix("--") {
                    let f: String = f
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '-')
                        .collect();
                    if !f.is_empty() {
                        flags.insert(format!("--{f}"));
                    }
                }
            }
        }
    }
    m
}

#[test]
fn every_subcommand_is_listed_and_its_synopsis_matches_its_help() {
    let syn = synopses();
    let mut bad = Vec::new();
    let leaves = leaves();
    assert!(leaves.len() >= 19, "{leaves:?}");
    for path in &leaves {
        let name = path.join(" ");
        // a two-word synopsis ("trace stats") or the command alone
        let Some(doc) = syn.get(&name).or_else(|| syn.get(&path[0])) else {
            bad.push(format!("{name}: no synopsis in reference.md"));
            continue;
        };
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let (code, help, err) = out(&args);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        let clap = help_flags(&help);
        let missing: Vec<_> = clap.difference(doc).collect();
        let unknown: Vec<_> = doc.difference(&clap).collect();
        if !missing.is_empty() {
            bad.push(format!("{name}: reference.md omits {missing:?}"));
        }
        if !unknown.is_empty() {
            bad.push(format!(
                "{name}: reference.md names {unknown:?}, which --help does not"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "synopses drift from --help:\n{}",
        bad.join("\n")
    );
}

#[test]
fn top_level_help_names_every_nested_command() {
    let (_, top, _) = out(&["--help"]);
    for l in leaves().iter().filter(|l| l.len() == 2) {
        assert!(
            top.contains(&format!("{} {}", l[0], l[1])),
            "qsim --help hides `{} {}`",
            l[0],
            l[1]
        );
    }
}

/// README's paths outside the checkout: "No such file" names the
/// `builtin:` copy; the builtin path runs.
#[test]
fn missing_shipped_paths_suggest_builtin() {
    let d = tempfile::tempdir().unwrap();
    for args in [
        vec!["run", "experiments/fmapi-pacing.toml", "--seeds", "1"],
        vec![
            "trace",
            "stats",
            "experiments/data/traces/AzureLLMInferenceTrace_code.csv",
        ],
        vec![
            "serve",
            "models/databricks-claude-haiku-4-5.toml",
            "--listen",
            "127.0.0.1:0",
        ],
        vec!["plan", "--scenarios", "experiments/shared-deployment.toml"],
    ] {
        let o = qsim().current_dir(d.path()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("use builtin:"), "{args:?}: {err}");
        assert!(o.stdout.is_empty());
    }
}

/// Every shipped experiment file runs from an empty directory as
/// `builtin:…` (the smallest run each: one seed, one scenario, 1 minute
/// where a scenario is long).
#[test]
fn every_shipped_experiment_loads_as_builtin_from_an_empty_directory() {
    let d = tempfile::tempdir().unwrap();
    let (code, json, err) = out(&["examples", "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let list: serde_json::Value = serde_json::from_str(&json).unwrap();
    let list = list.as_array().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = std::fs::read_dir(repo.join("experiments")).unwrap().count()
        + std::fs::read_dir(repo.join("models")).unwrap().count();
    assert!(list.len() + 3 >= shipped, "{} listed", list.len());
    let mut checked = 0;
    for e in list {
        let p = e["path"].as_str().unwrap();
        let kind = e["kind"].as_str().unwrap();
        assert!(!e["about"].as_str().unwrap().is_empty(), "{e}");
        if !p.starts_with("builtin:experiments/") || p.contains("/data/") {
            continue;
        }
        // loading (and validating every referenced file) is what a path
        // decides: a budget of 1 request refuses the run after the load
        let args: Vec<&str> = match kind {
            "options" => vec!["options", p, "--max-requests", "1"],
            _ => vec!["run", p, "--seeds", "1", "--max-requests", "1"],
        };
        let o = qsim().current_dir(d.path()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("work budget") || o.status.success(),
            "{args:?} from an empty directory: {err}"
        );
        checked += 1;
    }
    assert!(checked >= 10, "{checked} experiments");
    // and one is printed whole, to copy
    let (code, text, _) = out(&["examples", "models/databricks-claude-haiku-4-5.toml"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        text,
        std::fs::read_to_string(repo.join("models/databricks-claude-haiku-4-5.toml")).unwrap()
    );
    let (code, _, err) = out(&["examples", "models/nope.toml"]);
    assert_eq!(code, Some(2), "{err}");
}

/// `serve` without `--listen` printed "…not provided:; --listen <LISTEN>".
#[test]
fn a_missing_required_flag_is_one_readable_line() {
    let (code, _, err) = out(&["serve", "builtin:models/databricks-claude-haiku-4-5.toml"]);
    assert_eq!(code, Some(2));
    assert_eq!(
        err.trim(),
        "qsim: the following required arguments were not provided: --listen <LISTEN>; try --help"
    );
}

/// Issue 37: the README stays short (at most 300 lines); its console
/// blocks are checked by docs_output, its Python block by python/tests.
#[test]
fn the_readme_is_at_most_300_lines() {
    let text =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
            .unwrap();
    let n = text.lines().count();
    assert!(n <= 300, "README.md has {n} lines");
}

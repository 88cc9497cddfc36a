//! The documentation's command outputs are real: every ```console block in
//! README.md, docs/*.md and docs/guide/*.md is run with the built `qsim` binary and
//! compared with the block's text, so the docs cannot go stale.
//!
//! A block holds one or more commands, each a line `$ qsim …` (a line ending
//! in ` \` continues on the next, as in a shell), followed by what it prints:
//! its stdout, then its stderr. A first output line `? N` says the command
//! exits with code N (else it must exit 0). Arguments are split on blanks,
//! with '…' and "…" quoting as in a shell; there are no pipes, redirections
//! or variables. Every command runs with the repository root as its working
//! directory, so a guide's commands use the same paths as the README's.
//! Comparison is snapbox's: `[..]` inside a line and `...` alone on a line
//! are wildcards (qsim's output is byte-identical for the same inputs and
//! seed, so the docs use neither for a deterministic command). Outputs that
//! no local command reproduces (live runs) are shown in ```text blocks,
//! which this test does not run.
//!
//! A failing block is reported with its file, line and a diff; all blocks
//! are run before the test fails. Self-contained on purpose (no shared test
//! module): it is moved into a single test binary later.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One `$ qsim …` command of a console block and the output the docs show.
struct DocCommand {
    /// the file, relative to the repository root
    file: String,
    /// 1-based line of the `$` line
    line: usize,
    /// as written in the docs (continuations joined), for messages
    text: String,
    argv: Vec<String>,
    code: i32,
    expected: String,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documentation files whose console blocks are checked: README.md,
/// every docs/*.md and every docs/guide/*.md, in name order.
fn doc_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/guide"] {
        let mut md: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir} is readable: {e}"))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "md"))
            .collect();
        md.sort();
        files.extend(md);
    }
    files
}

/// Splits a command line on blanks, honouring '…' and "…" quotes and `\`
/// escapes outside single quotes.
fn split_words(s: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err("unterminated '".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err("trailing \\".into()),
                        },
                        Some(c) => cur.push(c),
                        None => return Err("unterminated \"".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => cur.push(c),
                    None => return Err("trailing \\".into()),
                }
            }
            '|' | '>' | '<' | '&' | ';' | '$' | '`' => {
                return Err(format!(
                    "shell syntax {c:?} is not supported in a console block"
                ))
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// The commands of every ```console block of one file.
fn parse_file(root: &Path, path: &Path) -> Result<Vec<DocCommand>, String> {
    let rel = path
        .strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{rel}: {e}"))?;
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        // a fence may be indented (a block inside a list item): its
        // indentation is taken off the block's lines
        let fence = lines[i].trim_end();
        let indent = fence.len() - fence.trim_start().len();
        if fence.trim_start() != "```console" {
            i += 1;
            continue;
        }
        let block_line = i + 1;
        i += 1;
        // the block's lines up to its closing fence
        let start = i;
        while i < lines.len() && !lines[i].trim_start().starts_with("```") {
            i += 1;
        }
        if i == lines.len() {
            return Err(format!("{rel}:{block_line}: console block not closed"));
        }
        let body: Vec<&str> = lines[start..i]
            .iter()
            .map(|l| {
                l.get(indent..)
                    .filter(|_| l[..indent].trim().is_empty())
                    .unwrap_or(l.trim_start())
            })
            .collect();
        i += 1;
        let mut j = 0;
        if body.first().is_none_or(|l| !l.starts_with("$ ")) {
            return Err(format!(
                "{rel}:{block_line}: a console block must start with a `$ qsim …` line"
            ));
        }
        while j < body.len() {
            let line = start + j + 1;
            let mut cmd = body[j].strip_prefix("$ ").expect("a $ line").to_string();
            while cmd.ends_with('\\') {
                cmd.pop();
                j += 1;
                let next = body.get(j).ok_or_else(|| {
                    format!("{rel}:{line}: the command's last line ends in a continuation")
                })?;
                cmd.push(' ');
                cmd.push_str(next.trim_start());
            }
            j += 1;
            let argv = split_words(&cmd).map_err(|e| format!("{rel}:{line}: {e}"))?;
            if argv.first().map(String::as_str) != Some("qsim") {
                return Err(format!(
                    "{rel}:{line}: only qsim commands can be checked; show `{cmd}` in a ```text or ```sh block"
                ));
            }
            let mut code = 0;
            if let Some(rest) = body.get(j).and_then(|l| l.strip_prefix("? ")) {
                code = rest
                    .trim()
                    .parse()
                    .map_err(|_| format!("{rel}:{}: `? N` wants an exit code", start + j + 1))?;
                j += 1;
            }
            let mut expected = String::new();
            while j < body.len() && !body[j].starts_with("$ ") {
                expected.push_str(body[j]);
                expected.push('\n');
                j += 1;
            }
            out.push(DocCommand {
                file: rel.clone(),
                line,
                text: cmd.clone(),
                argv,
                code,
                expected,
            });
        }
    }
    Ok(out)
}

/// Runs one command; None if it printed and exited as shown, else the report.
fn check(root: &Path, cmd: &DocCommand) -> Option<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(&cmd.argv[1..])
        .current_dir(root)
        .env_remove("QSIM_LOG")
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            return Some(format!(
                "{}:{}: `{}` did not start: {e}",
                cmd.file, cmd.line, cmd.text
            ))
        }
    };
    let mut actual = String::from_utf8_lossy(&output.stdout).into_owned();
    actual.push_str(&String::from_utf8_lossy(&output.stderr));
    let mut problems = Vec::new();
    match output.status.code() {
        Some(c) if c == cmd.code => {}
        other => problems.push(format!("exit code {other:?}, the docs say {}", cmd.code)),
    }
    let assert = snapbox::Assert::new().normalize_paths(false);
    if let Err(e) = assert.try_eq(
        Some(&"qsim's output"),
        snapbox::Data::text(actual),
        snapbox::Data::text(cmd.expected.clone()),
    ) {
        problems.push(format!("the output differs from the docs:\n{e}"));
    }
    if problems.is_empty() {
        None
    } else {
        Some(format!(
            "{}:{}: `{}`\n{}",
            cmd.file,
            cmd.line,
            cmd.text,
            problems.join("\n")
        ))
    }
}

#[test]
fn every_console_block_prints_what_the_docs_show() {
    let root = repo_root();
    let mut commands = Vec::new();
    for file in doc_files(&root) {
        match parse_file(&root, &file) {
            Ok(c) => commands.extend(c),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        commands.iter().any(|c| c.file == "README.md"),
        "README.md has no ```console block"
    );
    // the commands are independent: run them on every core, report in order
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(cmd) = commands.get(i) else { break };
                if let Some(report) = check(&root, cmd) {
                    failures.lock().unwrap().push((i, report));
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort();
    eprintln!("{} documented qsim commands run", commands.len());
    if !failures.is_empty() {
        let n = failures.len();
        let reports: Vec<String> = failures.into_iter().map(|(_, r)| r).collect();
        panic!(
            "{n} of {} documented commands print something else than the docs show:\n\n{}",
            commands.len(),
            reports.join("\n\n")
        );
    }
}

#[test]
fn the_block_parser_reads_commands_codes_and_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("x.md");
    std::fs::write(
        &md,
        "intro\n```console\n$ qsim plan --reserve 60,50\n? 2\nqsim: bad\n$ qsim run \\\n    --only 'a b' \"c\"\nout\n\n```\n```text\n$ qsim not run\n```\n- item\n\n  ```console\n  $ qsim merge\n    indented\n  ```\n",
    )
    .unwrap();
    let cmds = parse_file(dir.path(), &md).unwrap();
    assert_eq!(cmds.len(), 3);
    assert_eq!((cmds[0].line, cmds[0].code), (3, 2));
    assert_eq!(cmds[0].argv, ["qsim", "plan", "--reserve", "60,50"]);
    assert_eq!(cmds[0].expected, "qsim: bad\n");
    assert_eq!(cmds[1].line, 6);
    assert_eq!(cmds[1].argv, ["qsim", "run", "--only", "a b", "c"]);
    assert_eq!(cmds[1].expected, "out\n\n");
    assert_eq!((cmds[2].line, cmds[2].argv.len()), (17, 2));
    assert_eq!(cmds[2].expected, "  indented\n");
    assert!(split_words("qsim run | head").is_err());
}

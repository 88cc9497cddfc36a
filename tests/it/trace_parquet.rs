//! `qsim proxy`'s Parquet decision log as a trace (issue 22): written by
//! the proxy's own encoder, replayed exactly as its JSON Lines twin (the
//! same requests, times, token counts and consumers, totals equal to the
//! token); a corrupt or foreign Parquet file is a one-line error, exit 2,
//! nothing on stdout.

use qsim_live::record::Record;
use qsim_sim::trace::{RawTrace, TraceSource, TraceSpec};
use std::path::Path;

fn rec(consumer: &str, ms: u64, ns: u64, decision: &'static str) -> Record {
    Record {
        id: ns,
        run_unix_ms: ms,
        time_scale: 1.0,
        consumer: consumer.into(),
        arrival_ns: ns,
        input_tokens: Some(50 + ns % 97),
        max_tokens: Some(200),
        decision: decision.into(),
        status: 200,
        generation: 1,
        ..Default::default()
    }
}

/// A log of 40,000 records over two consumers and two proxy runs (more
/// than two of the reader's batches), some not demand (invalid, retries),
/// a few logged out of arrival order, lengths from usage, the settled
/// output or max_tokens.
fn records() -> Vec<Record> {
    let mut v = Vec::new();
    for k in 0..40_000u64 {
        let ms = if k < 30_000 { 1_000 } else { 9_000_000 };
        // every 7th logged 3 µs late (settled after the next arrival)
        let ns = k * 10_000 + if k % 7 == 0 { 13_000 } else { 0 };
        let who = if k % 3 == 0 { "beta" } else { "alpha" };
        let mut r = rec(
            who,
            ms,
            ns,
            if k % 101 == 0 { "invalid" } else { "admitted" },
        );
        match k % 4 {
            0 => {
                r.usage_input = Some(10 + k % 500);
                r.usage_output = Some(1 + k % 300);
            }
            1 => r.settled_output = Some(1 + k % 50),
            2 if k % 11 == 0 => r.retry_count = Some(1),
            _ => {}
        }
        v.push(r);
    }
    v
}

fn spec(p: &Path) -> TraceSpec {
    let raw = RawTrace {
        file: p.display().to_string(),
        ..Default::default()
    };
    TraceSpec::from_raw("t.toml", "trace.", Path::new(""), &raw, true).unwrap()
}

fn replay(s: &TraceSpec) -> Vec<(u64, u32, u32, u32)> {
    let mut src = TraceSource::open(s, 1, 0).unwrap();
    std::iter::from_fn(|| src.next().unwrap())
        .map(|a| (a.at, a.input, a.output, a.consumer))
        .collect()
}

#[test]
fn a_parquet_decision_log_replays_exactly() {
    qsim::commands::trace_parquet::register();
    let rs = records();
    let d = tempfile::tempdir().unwrap();
    let pq = d.path().join("decisions.parquet");
    std::fs::write(&pq, (qsim::commands::whatif::encoder())(&rs).unwrap()).unwrap();
    let jl = d.path().join("decisions.jsonl");
    let text: String = rs
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(&jl, text).unwrap();
    // the expected demand, computed here from the records
    let demand: Vec<&Record> = rs
        .iter()
        .filter(|r| r.decision != "invalid" && r.retry_count.is_none_or(|c| c == 0))
        .collect();
    let abs = |r: &Record| r.run_unix_ms as i128 * 1_000_000 + r.arrival_ns as i128;
    // times from the earliest request replayed
    let t0 = demand.iter().map(|r| abs(r)).min().unwrap();
    let mut want: Vec<(u64, u32, u32, u32)> = demand
        .iter()
        .map(|r| {
            let t = abs(r) - t0;
            let i = r.usage_input.or(r.input_tokens).unwrap() as u32;
            let o = r
                .usage_output
                .or(r.settled_output)
                .or(r.max_tokens)
                .unwrap() as u32;
            (t as u64, i, o, (r.consumer == "beta") as u32)
        })
        .collect();
    // in time order, equal times in file order
    want.sort_by_key(|w| w.0);
    let s = spec(&pq);
    assert_eq!(s.format, Some(qsim_sim::trace::read::Format::Proxy));
    let got = replay(&s);
    assert_eq!(got.len(), demand.len());
    assert!(got == want, "the Parquet log replays its demand exactly");
    let sum = s.summary.as_ref().unwrap();
    let (i, o) = want
        .iter()
        .fold((0u64, 0u64), |a, w| (a.0 + w.1 as u64, a.1 + w.2 as u64));
    assert_eq!(
        (sum.input_total, sum.output_total),
        (i, o),
        "totals to the token"
    );
    assert_eq!(sum.rows, want.len() as u64);
    assert_eq!(sum.skipped, (rs.len() - want.len()) as u64);
    assert!(sum.reordered > 0);
    assert_eq!(sum.consumers, vec!["alpha".to_string(), "beta".into()]);
    // its JSON Lines twin gives the same replay and summary
    let sj = spec(&jl);
    assert_eq!(replay(&sj), got);
    assert_eq!(sj.summary, s.summary);
    // and the binary reads it: `qsim trace stats`
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["trace", "stats", "--format", "json"])
        .arg(&pq)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["requests"].as_u64(), Some(want.len() as u64));
}

/// exit 2, one stderr line naming the file and containing `want`, nothing
/// on stdout.
fn refused(file: &Path, want: &str) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["trace", "stats"])
        .arg(file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(out.stdout.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&file.display().to_string()) && err.contains(want),
        "{err}"
    );
}

#[test]
fn bad_parquet_traces_are_one_line_errors_with_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let good = (qsim::commands::whatif::encoder())(&records()[..100]).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        // the magic bytes and garbage
        (
            "garbage.parquet",
            b"PAR1 not really parquet at all".to_vec(),
            "Parquet",
        ),
        // a real log cut short: no footer
        ("cut.parquet", good[..good.len() / 2].to_vec(), "Parquet"),
        // the footer intact, the data pages overwritten
        (
            "scrambled.parquet",
            {
                let mut b = good.clone();
                for x in &mut b[4..good.len() / 2] {
                    *x = 0x5a;
                }
                b
            },
            "Parquet",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = d.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        refused(&p, want);
    }
    // a Parquet table that is not a decision log (no arrival_ns)
    let p = d.path().join("other.parquet");
    let cols = vec![qsim_results::NamedColumn::new(
        "x",
        qsim_results::Values::U64(vec![Some(1), Some(2)]),
    )];
    let enc = qsim_results::encode_table(&cols).unwrap();
    std::fs::write(&p, enc.parquet).unwrap();
    refused(&p, "not a qsim proxy decision log");
    // a Parquet log named as another format
    let p = d.path().join("log.parquet");
    std::fs::write(&p, &good).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["trace", "stats", "--trace-format", "azure"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only its proxy's decision log"));
}

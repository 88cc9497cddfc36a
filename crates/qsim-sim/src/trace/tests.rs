use super::*;

/// A file in a fresh temp dir (kept alive by the returned guard).
fn write(name: &str, text: &str) -> (tempdir::Dir, PathBuf) {
    let d = tempdir::Dir::new();
    let p = d.0.join(name);
    std::fs::write(&p, text).unwrap();
    (d, p)
}

mod tempdir {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};
    pub struct Dir(pub PathBuf);
    static N: AtomicU64 = AtomicU64::new(0);
    impl Dir {
        pub fn new() -> Dir {
            let p = std::env::temp_dir().join(format!(
                "qsim-trace-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn spec(p: &Path, raw: RawTrace) -> Result<TraceSpec, ConfigError> {
    let raw = RawTrace {
        file: p.display().to_string(),
        ..raw
    };
    TraceSpec::from_raw("test.toml", "trace.", Path::new("test.toml"), &raw, true)
}

fn all(s: &TraceSpec) -> Vec<Arrival> {
    let mut src = TraceSource::open(s, 1, 0).unwrap();
    std::iter::from_fn(|| src.next().unwrap()).collect()
}

fn at_tokens(v: &[Arrival]) -> Vec<(Nanos, u32, u32)> {
    v.iter().map(|a| (a.at, a.input, a.output)).collect()
}

const MS: u64 = 1_000_000;

#[test]
fn each_format_replays_its_rows_exactly() {
    let expect = vec![(0, 4808, 10), (52 * MS, 3180, 8), (1_098 * MS, 110, 27)];
    let cases = [
        (
            "azure.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:17:03.9799600,4808,10\r\n2023-11-16 18:17:04.0319600,3180,8\r\n2023-11-16 18:17:05.0779600,110,27",
            RawTrace::default(),
        ),
        (
            "burst.csv",
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,4808,10,4818,Conversation log\n5.052,GPT-4,3180,8,3188,Conversation log\n6.098,ChatGPT,110,27,137,API log\n",
            RawTrace::default(),
        ),
        (
            "moon.jsonl",
            "{\"timestamp\": 27482, \"input_length\": 4808, \"output_length\": 10, \"hash_ids\": [1, 2, 3]}\n{\"timestamp\": 27534, \"input_length\": 3180, \"output_length\": 8, \"hash_ids\": []}\n\n{\"timestamp\": 28580, \"input_length\": 110, \"output_length\": 27}\n",
            RawTrace::default(),
        ),
        (
            "plain.csv",
            "t_ms,team,prompt,completion\n100,a,4808,10\n152,b,3180,8\n1198,a,110,27\n",
            RawTrace {
                format: Some("csv".into()),
                time_column: Some("t_ms".into()),
                time_unit: Some("ms".into()),
                input_column: Some("prompt".into()),
                output_column: Some("completion".into()),
                ..Default::default()
            },
        ),
    ];
    for (name, text, raw) in cases {
        let (_d, p) = write(name, text);
        let s = spec(&p, raw).unwrap();
        assert_eq!(at_tokens(&all(&s)), expect, "{name}");
        assert_eq!(s.summary.as_ref().unwrap().rows, 3);
    }
}

fn proxy_line(consumer: &str, ms: u64, ns: u64, extra: &str) -> String {
    format!(
        "{{\"id\":1,\"run_unix_ms\":{ms},\"time_scale\":1.0,\"consumer\":\"{consumer}\",\"arrival_ns\":{ns},\"arrival_unix_ms\":0,\"decided_ns\":null,\"input_tokens\":50,\"max_tokens\":200,\"stream\":false,\"decision\":\"admitted\",\"status\":200{extra},\"generation\":1}}\n"
    )
}

#[test]
fn a_proxy_log_replays_its_demand_per_consumer() {
    let text = [
        proxy_line(
            "alpha",
            1000,
            5_000,
            ",\"usage_input\":40,\"usage_output\":30",
        ),
        // settled after the next one: logged later, arrived earlier
        proxy_line("beta", 1000, 2_000, ",\"settled_output\":7"),
        proxy_line("alpha", 1000, 9_000, ",\"retry_count\":1"),
        proxy_line("", 1000, 9_500, "").replace("\"admitted\"", "\"invalid\""),
        proxy_line("beta", 1001, 0, ""),
    ]
    .concat();
    let (_d, p) = write("decisions.jsonl", &text);
    let s = spec(&p, RawTrace::default()).unwrap();
    assert_eq!(s.format, Some(read::Format::Proxy));
    assert_eq!(s.consumers, Consumers::Column);
    let v = all(&s);
    // beta's at 2 µs first, alpha's 3 µs later, beta's second 1 ms − 2 µs after
    assert_eq!(
        v.iter()
            .map(|a| (a.at, a.input, a.output, a.consumer))
            .collect::<Vec<_>>(),
        vec![(0, 50, 7, 1), (3_000, 40, 30, 0), (998_000, 50, 200, 1)]
    );
    let sum = s.summary.unwrap();
    assert_eq!(sum.consumers, vec!["alpha".to_string(), "beta".into()]);
    assert_eq!((sum.reordered, sum.skipped), (1, 2));
}

#[test]
fn window_scale_compress_and_loops() {
    let text = "t,i,o\n0,1,1\n1,2,2\n2,3,3\n3,4,4\n";
    let (_d, p) = write("t.csv", text);
    let base = RawTrace {
        format: Some("csv".into()),
        time_column: Some("t".into()),
        input_column: Some("i".into()),
        output_column: Some("o".into()),
        ..Default::default()
    };
    let s = spec(
        &p,
        RawTrace {
            from_s: Some(1.0),
            to_s: Some(3.0),
            ..base.clone()
        },
    )
    .unwrap();
    let sec = 1_000_000_000;
    assert_eq!(at_tokens(&all(&s)), vec![(0, 2, 2), (sec, 3, 3)]);
    let s = spec(
        &p,
        RawTrace {
            compress: Some(2.0),
            scale: Some(2.0),
            ..base.clone()
        },
    )
    .unwrap();
    let v = at_tokens(&all(&s));
    assert_eq!(v.len(), 8);
    assert_eq!(v[2], (sec / 2, 2, 2));
    assert_eq!(v[3], (sec / 2, 2, 2));
    // loops: period = span (3 s) + one mean gap (1 s)
    let s = spec(
        &p,
        RawTrace {
            loops: Some(3),
            ..base.clone()
        },
    )
    .unwrap();
    assert_eq!(s.period, 4 * sec);
    let v = all(&s);
    assert_eq!(v.len(), 12);
    assert_eq!(v[4].at, 4 * sec);
    assert_eq!(v[11].at, 11 * sec);
    // a fractional scale: about 1.5 requests per row, the same every run
    let mut many = String::from("t,i,o\n");
    for k in 0..10_000 {
        many.push_str(&format!("{k},1,1\n"));
    }
    let (_d2, p2) = write("m.csv", &many);
    let s = spec(
        &p2,
        RawTrace {
            scale: Some(1.5),
            ..base.clone()
        },
    )
    .unwrap();
    let n = all(&s).len();
    assert!((14_700..15_300).contains(&n), "{n}");
    assert_eq!(all(&s).len(), n);
    // split by shares: 70/30
    let s = spec(
        &p2,
        RawTrace {
            shares: Some([("a".to_string(), 7.0), ("b".to_string(), 3.0)].into()),
            ..base
        },
    )
    .unwrap();
    let a = all(&s).iter().filter(|x| x.consumer == 0).count();
    assert!((6_800..7_200).contains(&a), "{a}");
}

#[test]
fn unsorted_rows_are_sorted_within_the_window_and_refused_beyond() {
    let (_d, p) = write("u.csv", "t,i,o\n5,1,1\n2,2,2\n9,3,3\n");
    let raw = RawTrace {
        format: Some("csv".into()),
        time_column: Some("t".into()),
        input_column: Some("i".into()),
        output_column: Some("o".into()),
        ..Default::default()
    };
    let s = spec(&p, raw.clone()).unwrap();
    let sec = 1_000_000_000;
    assert_eq!(
        at_tokens(&all(&s)),
        vec![(0, 2, 2), (3 * sec, 1, 1), (7 * sec, 3, 3)]
    );
    assert_eq!(s.summary.unwrap().reordered, 1);
    let mut text = String::from("t,i,o\n");
    for k in 0..(read::REORDER_WINDOW + 10) {
        text.push_str(&format!("{},1,1\n", k + 10));
    }
    text.push_str("1,1,1\n");
    let (_d2, p2) = write("far.csv", &text);
    let e = spec(&p2, raw).unwrap_err().to_string();
    let line = read::REORDER_WINDOW + 12;
    assert!(
        e.contains(&format!("line {line}: a timestamp earlier")),
        "{e}"
    );
}

#[test]
fn a_trace_scanned_in_order_replays_as_through_the_window() {
    // the replay of a scanned file found in order reads without the
    // reordering window: the same arrivals as an unscanned spec's replay
    // (which keeps the window), with a window and loops
    let mut text = String::from("t,i,o\n");
    for k in 0..(read::REORDER_WINDOW as u64 + 500) {
        text.push_str(&format!("{},{},{}\n", k / 3, k % 97 + 1, k % 13 + 1));
    }
    let (_d, p) = write("sorted.csv", &text);
    for (from_s, to_s, loops) in [(None, None, 1), (Some(5.0), Some(20_000.0), 2)] {
        let raw = RawTrace {
            file: p.display().to_string(),
            format: Some("csv".into()),
            time_column: Some("t".into()),
            input_column: Some("i".into()),
            output_column: Some("o".into()),
            from_s,
            to_s,
            loops: Some(loops),
            ..Default::default()
        };
        let scanned = spec(&p, raw.clone()).unwrap();
        assert_eq!(scanned.summary.as_ref().unwrap().reordered, 0);
        let mut r = scanned.reader().unwrap();
        assert_eq!(r.window_len(), 0);
        assert!(r.next().unwrap().is_some());
        let mut plain = scanned.clone();
        plain.summary = None;
        assert_eq!(plain.reader().unwrap().window_len(), read::REORDER_WINDOW);
        let (a, b) = (all(&scanned), all(&plain));
        assert!(a.len() > 10_000, "{}", a.len());
        assert_eq!(a, b);
    }
    // out of order: the window stays
    let (_d2, p2) = write("unsorted.csv", "t,i,o\n3,1,1\n1,2,2\n7,3,3\n");
    let raw = RawTrace {
        format: Some("csv".into()),
        time_column: Some("t".into()),
        input_column: Some("i".into()),
        output_column: Some("o".into()),
        ..Default::default()
    };
    let s = spec(&p2, raw).unwrap();
    assert_eq!(s.reader().unwrap().window_len(), read::REORDER_WINDOW);
}

#[test]
fn malformed_rows_name_the_file_line_and_column() {
    let cases = [
        ("", "empty: no header and no requests"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests (a header only?)"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n2023-11-16 18:17:04.0,-3,5\n",
            "line 3, column 2 (ContextTokens): a negative token count: \"-3\"",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,many\n",
            "line 2, column 3 (GeneratedTokens): not a token count (a whole number): \"many\"",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16,10,5\n",
            "line 2, column 1 (TIMESTAMP): not a datetime",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10\n",
            "line 2, column 3 (GeneratedTokens): missing (the row has 2 fields)",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 2}\n{\"timestamp\": 2, \"input_length\": -5, \"output_length\": 2}\n",
            "line 2: field input_length: invalid value: integer `-5`",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 5}\n",
            "line 1: missing field `output_length`",
        ),
        ("a,b,c\n1,2,3\n", "line 1: not a header qsim recognises"),
    ];
    for (text, want) in cases {
        let (_d, p) = write("bad.txt", text);
        let e = spec(&p, RawTrace::default()).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: ", p.display())) && e.contains(want),
            "{text:?}: {e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn options_are_checked() {
    let (_d, p) = write("t.csv", "t,i,o\n0,1,1\n");
    let bad = [
        (
            RawTrace {
                scale: Some(0.0),
                ..Default::default()
            },
            "trace.scale",
        ),
        (
            RawTrace {
                loops: Some(0),
                ..Default::default()
            },
            "trace.loops",
        ),
        (
            RawTrace {
                format: Some("xml".into()),
                ..Default::default()
            },
            "trace.format",
        ),
        (
            RawTrace {
                time_column: Some("t".into()),
                ..Default::default()
            },
            "trace.format",
        ),
        (
            RawTrace {
                from_s: Some(5.0),
                to_s: Some(2.0),
                ..Default::default()
            },
            "trace.to_s",
        ),
    ];
    for (raw, field) in bad {
        let e = spec(&p, raw).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
}

#[test]
fn a_long_line_is_refused_without_reading_it_whole() {
    let d = tempdir::Dir::new();
    let p = d.0.join("long.csv");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(1 << 30).unwrap(); // sparse: a 1 GiB line of NUL bytes
    let e = spec(&p, RawTrace::default()).unwrap_err().to_string();
    assert!(e.contains("line 1: longer than 1 MiB"), "{e}");
    let e = spec(Path::new("/dev/zero"), RawTrace::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("a character device, not a regular file"), "{e}");
}

#[test]
fn stats_measure_a_small_trace() {
    // arrivals at 0, 0.5, 1, 1, 3 s (a tie), lengths 1..5 and 10..50
    let (_d, p) = write("t.csv", "t,i,o\n0,1,10\n0.5,2,20\n1,3,30\n1,4,40\n3,5,50\n");
    let s = spec(
        &p,
        RawTrace {
            format: Some("csv".into()),
            time_column: Some("t".into()),
            input_column: Some("i".into()),
            output_column: Some("o".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let st = stats::compute(&s, 1).unwrap();
    assert_eq!(st.requests, 5);
    assert_eq!(st.duration_s, 3.0);
    assert!((st.mean_rate - 5.0 / 3.0).abs() < 1e-12);
    // gaps 0.5, 0.5, 0, 2: mean 0.75, population sd sqrt(2.25 / 4) = 0.75
    assert!((st.gap_mean_s - 0.75).abs() < 1e-12);
    assert!((st.gap_cv - 1.0).abs() < 1e-9, "{}", st.gap_cv);
    // 1 s bins [0,1): 2, [1,2): 2, [2,3): 0, [3,4): 1; the dispersion
    // over the 3 whole windows before the last (partial) one
    assert_eq!(st.peaks[0].requests, 2);
    assert_eq!(st.peaks[0].start_s, 0);
    let (m, v) = (4.0 / 3.0, (4.0 + 4.0 + 0.0) / 3.0 - 16.0 / 9.0);
    assert!((st.dispersion[0].1 - v / m).abs() < 1e-12);
    // fewer than two whole 10 s windows: no index
    assert!(st.dispersion[1].1.is_nan());
    assert_eq!(st.input.p50(), 3.0);
    assert_eq!(st.output.max(), 50.0);
    assert_eq!((st.input_total, st.output_total), (15, 150));
    let fitted = st.fitted_fields().unwrap();
    assert!(
        fitted.starts_with("rpm = 100.0\narrivals = { process = \"gamma\", cv = "),
        "{fitted}"
    );
}

/// Everything a replay gives: its arrivals (draws from seed 3), then the
/// consumer names, rows reordered and records skipped.
fn replay(s: &TraceSpec) -> (Vec<Arrival>, Vec<String>, u64, u64) {
    let mut src = TraceSource::open(s, 3, 0).unwrap();
    let v: Vec<Arrival> = std::iter::from_fn(|| src.next().unwrap()).collect();
    (v, src.consumer_names(), src.reordered(), src.skipped())
}

/// A replay from the scan's copy of the rows (`cache`) gives exactly what
/// a replay parsing the file gives: rows put in order, consumers by column
/// and by share, windows, fractional scale, compression, loops, a proxy
/// log's skipped records.
#[test]
fn a_replay_from_the_scans_copy_equals_one_from_the_file() {
    // 3,000 rows: consumers by column, some rows out of order, equal times,
    // times from a negative start
    let mut text = String::from("t,i,o,who\n");
    for k in 0..3000i64 {
        let t = -50_000 + k * 997 + if k % 17 == 5 { -2_500 } else { 0 } - (k % 3 == 0) as i64;
        let who = ["a", "b", "c"][(k * k % 7 % 3) as usize];
        let sign = if t < 0 { "-" } else { "" };
        let (i, o) = (1 + k * 37 % 4000, 1 + k % 90);
        text += &format!(
            "{sign}{}.{:03},{i},{o}, {who}\n",
            t.abs() / 1000,
            t.abs() % 1000
        );
    }
    let (_d, p) = write("rows.csv", &text);
    let csv = |f: &dyn Fn(&mut RawTrace)| {
        let mut r = RawTrace {
            format: Some("csv".into()),
            time_column: Some("t".into()),
            input_column: Some("i".into()),
            output_column: Some("o".into()),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let mut shares = BTreeMap::new();
    shares.insert("x".to_string(), 1.0);
    shares.insert("y".to_string(), 2.5);
    let raws = vec![
        csv(&|_| {}),
        csv(&|r| r.consumer_column = Some("who".into())),
        csv(&|r| {
            r.shares = Some(shares.clone());
            r.scale = Some(2.4);
        }),
        csv(&|r| {
            r.from_s = Some(400.0);
            r.to_s = Some(1900.0);
            r.loops = Some(3);
            r.compress = Some(1.7);
        }),
        csv(&|r| {
            r.loops = Some(2);
            r.scale = Some(0.6);
            r.consumer_column = Some("who".into());
        }),
    ];
    let mut reordered = false;
    for raw in raws {
        let s = spec(&p, raw.clone()).unwrap();
        assert!(s.copy.0.is_some(), "{raw:?}: copied");
        let mut plain = s.clone();
        plain.copy = Copied::default();
        let (a, b) = (replay(&s), replay(&plain));
        assert!(a.0.len() > 1000, "{raw:?}: {}", a.0.len());
        assert!(a == b, "{raw:?}: the copy's replay differs");
        reordered |= a.2 > 0;
    }
    assert!(reordered, "rows were put in order");
    // a proxy log: consumers by name, records skipped, rows reordered
    let mut text = String::new();
    for k in 0..500u64 {
        let extra = if k % 7 == 3 {
            ",\"retry_count\":1"
        } else {
            ",\"usage_input\":40,\"usage_output\":30"
        };
        text += &proxy_line(
            ["p", "q"][k as usize % 2],
            1000 + k,
            (k % 5) * 1_000_000,
            extra,
        );
    }
    let (_d2, p2) = write("log.jsonl", &text);
    let s = spec(&p2, RawTrace::default()).unwrap();
    let mut plain = s.clone();
    plain.copy = Copied::default();
    let (a, b) = (replay(&s), replay(&plain));
    assert!(
        a.0.len() > 400 && a.3 > 50,
        "{} rows, {} skipped",
        a.0.len(),
        a.3
    );
    assert!(a == b, "the proxy log's copy differs");
}

/// Issue 41, case 7: the last, partial window was counted as a whole one
/// (a constant 1 req/s trace over 600 s showed 5.27 at 60 s windows and
/// 99.2 at 300 s; here 1,200 s, so that 300 s windows are whole three
/// times: fewer than two whole windows give no index). The answers are known: 0 for a constant rate; 1 for a
/// Poisson process, within the estimate's sampling error (the variance of
/// `K` window counts has a relative standard error of about `√(2/(K−1))`;
/// allowed: five of them).
#[test]
fn the_index_of_dispersion_is_0_for_a_constant_rate_and_1_for_poisson() {
    let spec_of = |text: &str| {
        let (d, p) = write("t.csv", text);
        let s = spec(
            &p,
            RawTrace {
                format: Some("csv".into()),
                time_column: Some("t".into()),
                input_column: Some("i".into()),
                output_column: Some("o".into()),
                ..Default::default()
            },
        )
        .unwrap();
        (d, s)
    };
    let mut text = String::from("t,i,o\n");
    for k in 0..1200 {
        text.push_str(&format!("{k},10,10\n"));
    }
    let (_d, s) = spec_of(&text);
    let st = stats::compute(&s, 1).unwrap();
    for &(w, d) in &st.dispersion {
        assert!(d.abs() < 1e-12, "constant rate, window {w} s: {d}");
    }
    // Poisson at 5 req/s over 40,000 s (exponential gaps, SplitMix64 draws)
    let mut x = 0x41_0007u64;
    let mut unit = || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64)
    };
    let (mut t, mut text) = (0.0f64, String::from("t,i,o\n"));
    while t < 40_000.0 {
        text.push_str(&format!("{t:.6},10,10\n"));
        t += -unit().ln() / 5.0;
    }
    let (_d, s) = spec_of(&text);
    let st = stats::compute(&s, 1).unwrap();
    for &(w, d) in &st.dispersion {
        let k = (st.duration_s / w as f64).floor();
        let bound = 5.0 * (2.0 / (k - 1.0)).sqrt();
        assert!(
            (d - 1.0).abs() < bound,
            "Poisson, window {w} s: {d} (±{bound})"
        );
    }
}

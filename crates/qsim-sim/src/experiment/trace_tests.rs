//! Trace scenarios through the server driver, and planning against a trace.

use crate::engine::rng::{component, stream, unit};
use crate::experiment::server::{run_scenario, Load, ServerSuite};
use crate::time::Nanos;
use crate::trace::{Arrival, TraceSource, TraceSpec};
use std::path::Path;

fn all(s: &TraceSpec) -> Vec<Arrival> {
    let mut src = TraceSource::open(s, 1, 0).unwrap();
    std::iter::from_fn(|| src.next().unwrap()).collect()
}

fn at_tokens(v: &[Arrival]) -> Vec<(Nanos, u32, u32)> {
    v.iter().map(|a| (a.at, a.input, a.output)).collect()
}

fn proxy_line(consumer: &str, ms: u64, ns: u64, extra: &str) -> String {
    format!(
        "{{\"id\":1,\"run_unix_ms\":{ms},\"time_scale\":1.0,\"consumer\":\"{consumer}\",\"arrival_ns\":{ns},\"arrival_unix_ms\":0,\"decided_ns\":null,\"input_tokens\":50,\"max_tokens\":200,\"stream\":false,\"decision\":\"admitted\",\"status\":200{extra},\"generation\":1}}\n"
    )
}

/// Rows (time ns, input, output) with ties, gaps and varied lengths.
fn rows(n: usize) -> Vec<(u64, u32, u32)> {
    let mut rng = stream(7, 0, component::WORKLOAD);
    let mut t = 0u64;
    (0..n)
        .map(|k| {
            // a tie now and then, else up to 0.4 s
            if k % 7 != 3 {
                t += (unit(&mut rng) * 4e8) as u64 / 1000 * 1000;
            }
            let i = 1 + (unit(&mut rng) * 3000.0) as u32;
            let o = 1 + (unit(&mut rng) * 300.0) as u32;
            (t, i, o)
        })
        .collect::<Vec<_>>()
        .into_iter()
        // the replay's clock starts at the first row
        .scan(None, |first: &mut Option<u64>, (t, i, o)| {
            let f = *first.get_or_insert(t);
            Some((t - f, i, o))
        })
        .collect()
}

/// The same rows in each format (times in µs, which every format can hold).
fn in_format(format: &str, rows: &[(u64, u32, u32)]) -> (String, &'static str) {
    let base = 1_700_000_000_000_000u64; // µs since the epoch
    let mut s = String::new();
    match format {
        "azure" => {
            s.push_str("TIMESTAMP,ContextTokens,GeneratedTokens\n");
            for &(t, i, o) in rows {
                let us = base + t / 1000;
                let (secs, frac) = ((us / 1_000_000) as i64, us % 1_000_000);
                let days = secs.div_euclid(86_400);
                let sod = secs.rem_euclid(86_400);
                // civil from days (Hinnant), independent of the reader's direction
                let z = days + 719_468;
                let era = z.div_euclid(146_097);
                let doe = z - era * 146_097;
                let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
                let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
                let mp = (5 * doy + 2) / 153;
                let d = doy - (153 * mp + 2) / 5 + 1;
                let m = if mp < 10 { mp + 3 } else { mp - 9 };
                let y = yoe + era * 400 + (m <= 2) as i64;
                s.push_str(&format!(
                    "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{frac:06}0,{i},{o}\n",
                    sod / 3600,
                    sod / 60 % 60,
                    sod % 60
                ));
            }
            (s, "trace.csv")
        }
        "burstgpt" => {
            s.push_str("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n");
            for &(t, i, o) in rows {
                s.push_str(&format!(
                    "{}.{:06},ChatGPT,{i},{o},{},Conversation log\n",
                    t / 1_000_000_000,
                    t / 1000 % 1_000_000,
                    i + o
                ));
            }
            (s, "trace.csv")
        }
        "mooncake" => {
            for &(t, i, o) in rows {
                s.push_str(&format!(
                    "{{\"timestamp\": {}.{:03}, \"input_length\": {i}, \"output_length\": {o}, \"hash_ids\": [1]}}\n",
                    t / 1_000_000,
                    t / 1000 % 1000
                ));
            }
            (s, "trace.jsonl")
        }
        "proxy" => {
            for &(t, i, o) in rows {
                s.push_str(&proxy_line(
                    "team",
                    1_700_000_000_000,
                    t,
                    &format!(",\"usage_input\":{i},\"usage_output\":{o}"),
                ));
            }
            (s, "decisions.jsonl")
        }
        _ => {
            s.push_str("when_us,prompt,completion\n");
            for &(t, i, o) in rows {
                s.push_str(&format!("{},{i},{o}\n", t / 1000 + 12_345));
            }
            (s, "plain.csv")
        }
    }
}

#[test]
fn a_server_scenario_admits_exactly_the_traces_requests_in_every_format() {
    let want = rows(400);
    let (n, tin, tout): (u64, u64, u64) = (
        want.len() as u64,
        want.iter().map(|r| r.1 as u64).sum(),
        want.iter().map(|r| r.2 as u64).sum(),
    );
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-3.1-8b-h100-vllm.toml");
    for format in ["azure", "burstgpt", "mooncake", "proxy", "csv"] {
        let d = tempfile_dir();
        let (text, name) = in_format(format, &want);
        std::fs::write(d.join(name), text).unwrap();
        let columns = if format == "csv" {
            ", format = \"csv\", time_column = \"when_us\", time_unit = \"us\", input_column = \"prompt\", output_column = \"completion\""
        } else {
            ""
        };
        let exp = format!(
            "kind = \"server\"\nserver = {model:?}\nreplicas = 4\nduration_s = 1\ndrain = true\n\
             input_tokens = {{ dist = \"const\", value = 1 }}\noutput_tokens = {{ dist = \"const\", value = 1 }}\n\
             [[scenario]]\nname = \"replay\"\ntrace = {{ file = \"{name}\"{columns} }}\n"
        );
        let ef = d.join("exp.toml");
        std::fs::write(&ef, &exp).unwrap();
        let v: toml::Value = toml::from_str(&exp).unwrap();
        let suite = ServerSuite::from_value(&ef, v).unwrap();
        let s = &suite.scenarios[0];
        // the source yields the rows themselves
        let Load::Trace(spec) = &s.load else {
            panic!("{format}: not a trace")
        };
        let got = at_tokens(&all(spec));
        assert_eq!(got.len(), want.len(), "{format}");
        if let Some(k) = (0..got.len()).find(|&k| got[k] != want[k]) {
            panic!("{format}: row {k}: {:?} != {:?}", got[k], want[k]);
        }
        assert_eq!(s.duration, want.last().unwrap().0 + 1, "{format}");
        // and the server admits and completes exactly them
        let r = run_scenario(suite.profile.clone(), s, 1, 0);
        let m = r.metrics.total(r.until);
        assert_eq!(
            (m.submitted, m.completed, m.rejected),
            (n, n, 0),
            "{format}"
        );
        assert_eq!((m.input_tokens, m.output_tokens), (tin, tout), "{format}");
        assert_eq!(r.unfinished, 0);
    }
}

/// A fresh directory under the system's temp dir, removed when the test ends
/// (by the guard's drop).
struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
impl std::ops::Deref for Dir {
    type Target = std::path::PathBuf;
    fn deref(&self) -> &std::path::PathBuf {
        &self.0
    }
}
fn tempfile_dir() -> Dir {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let p = std::env::temp_dir().join(format!(
        "qsim-trace-plan-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&p).unwrap();
    Dir(p)
}

#[test]
fn planning_against_a_bursty_trace_needs_more_replicas_than_its_poisson_fit() {
    use crate::experiment::trace_plan::{compare, run, Targets};
    // ten minutes at 1 request / 2 s, and 900 requests in 10 s of minute 5
    let mut text = String::from("t,i,o\n");
    let mut rows = Vec::new();
    for k in 0..300 {
        rows.push((k as f64 * 2.0, 500, 200));
    }
    for k in 0..900 {
        rows.push((330.0 + k as f64 / 90.0, 500, 200));
    }
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (t, i, o) in rows {
        text.push_str(&format!("{t:.4},{i},{o}\n"));
    }
    let d = tempfile_dir();
    std::fs::write(d.join("burst.csv"), text).unwrap();
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/llama-3.1-8b-h100-vllm.toml");
    let exp = format!(
        "kind = \"server\"\nserver = {model:?}\nduration_s = 1\n\
         input_tokens = {{ dist = \"const\", value = 1 }}\noutput_tokens = {{ dist = \"const\", value = 1 }}\n\
         [[scenario]]\nname = \"burst\"\ntrace = {{ file = \"burst.csv\", format = \"csv\", time_column = \"t\", input_column = \"i\", output_column = \"o\" }}\n"
    );
    let ef = d.join("exp.toml");
    std::fs::write(&ef, &exp).unwrap();
    let suite = ServerSuite::from_value(&ef, toml::from_str(&exp).unwrap()).unwrap();
    let s = &suite.scenarios[0];
    let t = Targets {
        e2e_p95_s: Some(5.0),
        ttft_p95_s: None,
    };
    let c = compare(&suite.profile, s, &t, 1, 32).unwrap();
    assert_eq!(c.stats.requests, 1200);
    assert_eq!((c.busiest.minute, c.busiest.requests), (5, 930));
    let trace = &c.answers[0];
    let r = trace.replicas.expect("a replica count meets 5 s");
    // the answer meets the target in every minute, one fewer does not, and
    // the burst's minute is among the minutes that set it
    assert!(trace.run.over(&t).is_empty());
    assert!(r > 1, "one replica takes the burst");
    let below = run(&suite.profile, s, r - 1, 1);
    assert_eq!(below.over(&t), trace.setting);
    assert_eq!(trace.setting[0].minute, 5);
    // a Poisson process at the mean rate has no such burst
    let poisson = c.answers[2].replicas.expect("Poisson is met");
    assert!(poisson < r, "Poisson {poisson}, trace {r}");
    // and the trace at Poisson's count misses the target in its busiest minute
    let at = c.trace_at[2].as_ref().unwrap();
    assert!(at.e2e_p95_s > 5.0, "{at:?}");
}

//! Issue 26, item 6: `qsim whatif` over a decision log that spans a proxy
//! restart. Each proxy run held a fresh in-memory limiter; the replay
//! must start its limiter afresh at each later run's start (and say so),
//! not treat the log as one limiter. Runs on a shared-state clock (Redis)
//! kept their state and are replayed as one limiter.

use qsim_api::whatif::{replay, runs_note};
use qsim_core::limiter::admission::{
    ConsumerPolicy, ConsumerSpec, LimiterConfig, Params, Semantics, Unit,
};
use qsim_core::time::Nanos;
use qsim_live::record::Record;
use qsim_live::OnLimit;

const S: Nanos = 1_000_000_000;

/// One consumer limited to 1 request per minute.
fn policy() -> Params {
    let cfg = LimiterConfig {
        capacity: 6000,
        unit: Unit::Rpm,
        threshold: 1.0,
        burst: Some(0),
        semantics: Semantics::RateLimitOnly,
        accounting: Default::default(),
        consumers: vec![ConsumerSpec {
            name: "A".into(),
            reserved_bp: 0,
            policy: ConsumerPolicy {
                rpm: Some(1),
                ..Default::default()
            },
        }],
    };
    Params::new(cfg).expect("valid policy")
}

/// A request of consumer A admitted at `t` (run clock) in the run started
/// at `run_ms` (wall clock).
fn admitted(id: u64, run_ms: u64, t: Nanos) -> Record {
    Record {
        id,
        run_unix_ms: run_ms,
        time_scale: 1.0,
        consumer: "A".into(),
        arrival_ns: t,
        decided_ns: Some(t),
        input_tokens: Some(10),
        max_tokens: Some(10),
        decision: "admitted".into(),
        status: 200,
        end_ns: Some(t + S / 10),
        settled_output: Some(1),
        ..Default::default()
    }
}

#[test]
fn a_restart_starts_a_fresh_limiter_and_is_said() {
    let p = policy();
    let on_limit = [OnLimit::Reject];
    let run1 = 1_700_000_000_000;
    let run2 = run1 + 10_000; // restarted 10 s later: its clock starts at 0 again
    let recs = vec![
        admitted(0, run1, S),
        admitted(1, run2, S),
        admitted(2, run2 + 20_000, S),
    ];
    let o = replay(&recs, &p, &on_limit, (None, None));
    assert_eq!(o.runs, 3);
    assert_eq!(o.restarts, vec![9 * S, 29 * S], "from the first request");
    assert!(!o.shared_state);
    let decided: Vec<&str> = o.decisions.iter().map(|d| d.decision).collect();
    assert_eq!(
        decided, ["admitted"; 3],
        "each run's first request meets a fresh limiter, as in the log"
    );
    let note = runs_note(&o).unwrap();
    assert!(
        note.contains("spans 3 proxy runs")
            && note.contains("starts afresh at each restart")
            && note.contains("at 9.0 s, 29.0 s"),
        "{note}"
    );

    // control: the same requests as one run (one limiter, 1 per minute)
    // are denied after the first, so the restarts above made the difference
    let one: Vec<Record> = [S, 11 * S, 31 * S]
        .iter()
        .enumerate()
        .map(|(i, &t)| admitted(i as u64, run1, t))
        .collect();
    let o = replay(&one, &p, &on_limit, (None, None));
    assert_eq!(o.runs, 1);
    assert!(runs_note(&o).is_none());
    let n = o
        .decisions
        .iter()
        .filter(|d| d.decision == "admitted")
        .count();
    assert_eq!(
        n,
        1,
        "{:?}",
        o.decisions.iter().map(|d| d.decision).collect::<Vec<_>>()
    );

    // runs on a shared-state clock (ns since 2025: > 10^15) kept their
    // state: one limiter, and said so
    let base = 2_000_000_000_000_000;
    let shared: Vec<Record> = [(run1, S), (run2, 11 * S), (run2 + 20_000, 31 * S)]
        .iter()
        .enumerate()
        .map(|(i, &(run, t))| admitted(i as u64, run, base + t))
        .collect();
    let o = replay(&shared, &p, &on_limit, (None, None));
    assert_eq!((o.runs, o.shared_state), (3, true));
    assert!(o.restarts.is_empty());
    let n = o
        .decisions
        .iter()
        .filter(|d| d.decision == "admitted")
        .count();
    assert_eq!(n, 1);
    assert!(runs_note(&o).unwrap().contains("replayed as one limiter"));
}

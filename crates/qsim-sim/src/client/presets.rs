//! Named client policies: the `policy` knob of hosted experiment files
//! (`policy = "article"`, `--set policy=full-jitter`,
//! `--vary policy=article,full-jitter,aimd`) and the policies `qsim
//! recommend` starts its search from.
//!
//! A preset is the caller's own retry and pacing layers of a worker pool
//! (the SDK's hidden retries stay as the file sets them), or, for `aimd`,
//! the managed executor's adaptive window in place of the fixed pool.
//! Every retrying preset retries 429 and 5xx and lets a retry hint
//! (`Retry-After`, `retry-after-ms`, body `retry_after`), when the endpoint
//! sends one, replace its computed wait, as the article's client does.

use super::managed::AimdParams;
use super::policy::{Backoff, RetryPolicy, StatusSet};
use super::throttle::{AdaptiveThrottle, RetryQuota};
use super::PoolShared;
use crate::time::secs;

/// A client policy: the own layers of a worker pool, or the AIMD executor.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientPolicy {
    /// A fixed pool of workers with this retry policy and shared layers.
    Pool {
        retry: RetryPolicy,
        shared: PoolShared,
    },
    /// The managed executor: an AIMD concurrency window whose ceiling is the
    /// pool's `workers`, with the executor's own retries (no SDK layer).
    Aimd,
}

/// A named preset: its name, a one-line description and its policy.
pub struct Preset {
    pub name: &'static str,
    pub summary: &'static str,
}

/// Every preset, in the order they are listed in errors and docs.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "none",
        summary: "no own retry (the article's experiment 1); SDK hidden retries as the file sets them",
    },
    Preset {
        name: "article",
        summary: "the article's backoff (experiment 2): sleep min(2^n, 32) + U[0,1) s, at most 8 attempts",
    },
    Preset {
        name: "full-jitter",
        summary: "AWS full jitter: sleep U(0, min(32, 2^n)) s, at most 8 attempts",
    },
    Preset {
        name: "equal-jitter",
        summary: "AWS equal jitter: v/2 + U(0, v/2) s with v = min(32, 2^n), at most 8 attempts",
    },
    Preset {
        name: "decorrelated",
        summary: "AWS decorrelated jitter: sleep min(32, U(1, 3 x previous)) s, at most 8 attempts",
    },
    Preset {
        name: "constant",
        summary: "a constant 2 s between attempts, at most 30 attempts",
    },
    Preset {
        name: "retry-after",
        summary: "wait exactly what the 429's retry hint says; with no hint 1 s; at most 30 attempts",
    },
    Preset {
        name: "aws-standard",
        summary: "AWS SDK standard mode: full jitter capped at 20 s, 3 attempts, retry quota 500 (5 per retry, +1 per success)",
    },
    Preset {
        name: "sre-throttle",
        summary: "the article's backoff plus Google SRE client-side adaptive throttling (K = 2, 120 s window)",
    },
    Preset {
        name: "aimd",
        summary: "the managed executor's pacing (ai_query): AIMD window from 8 up to `workers`, +1 per success, x0.5 per 429, own retries",
    },
];

/// The retry quota of `aws-standard`: (capacity, cost per retry, refund per success).
pub const AWS_QUOTA: (u32, u32, u32) = (500, 5, 1);
/// The adaptive throttle of `sre-throttle`: (K, window in seconds).
pub const SRE_THROTTLE: (f64, f64) = (2.0, 120.0);

/// The preset names, comma-separated (for error messages).
pub fn names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn retrying(backoff: Backoff, max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        backoff,
        max_attempts,
        retry_on: StatusSet::parse(&["429".into(), "5xx".into()])
            .expect("429 and 5xx are valid statuses"),
        honor_hint: true,
    }
}

fn pool(retry: RetryPolicy) -> ClientPolicy {
    ClientPolicy::Pool {
        retry,
        shared: PoolShared::default(),
    }
}

/// The policy of the preset `name`, or an error listing the valid names.
pub fn preset(name: &str) -> Result<ClientPolicy, String> {
    let exp = Backoff::Exponential {
        base: 1.0,
        cap: 32.0,
        jitter: 1.0,
    };
    Ok(match name {
        "none" => pool(RetryPolicy::none()),
        "article" => pool(retrying(exp, 8)),
        "full-jitter" => pool(retrying(
            Backoff::FullJitter {
                base: 1.0,
                cap: 32.0,
            },
            8,
        )),
        "equal-jitter" => pool(retrying(
            Backoff::EqualJitter {
                base: 1.0,
                cap: 32.0,
            },
            8,
        )),
        "decorrelated" => pool(retrying(
            Backoff::Decorrelated {
                base: 1.0,
                cap: 32.0,
            },
            8,
        )),
        "constant" => pool(retrying(Backoff::Constant { delay: 2.0 }, 30)),
        "retry-after" => pool(retrying(Backoff::Constant { delay: 1.0 }, 30)),
        "aws-standard" => ClientPolicy::Pool {
            retry: retrying(
                Backoff::FullJitter {
                    base: 1.0,
                    cap: 20.0,
                },
                3,
            ),
            shared: PoolShared {
                quota: Some(RetryQuota::new(AWS_QUOTA.0, AWS_QUOTA.1, AWS_QUOTA.2)),
                throttle: None,
            },
        },
        "sre-throttle" => ClientPolicy::Pool {
            retry: retrying(exp, 8),
            shared: PoolShared {
                quota: None,
                throttle: Some(AdaptiveThrottle::new(SRE_THROTTLE.0, secs(SRE_THROTTLE.1))),
            },
        },
        "aimd" => ClientPolicy::Aimd,
        other => {
            return Err(format!(
                "unknown policy {other:?}; expected one of {}",
                names()
            ))
        }
    })
}

/// The AIMD window of the `aimd` policy on a pool of `workers`: the file's
/// executor parameters with the window's ceiling at `workers` (and its
/// start and floor no higher).
pub fn aimd_window(base: &AimdParams, workers: u32) -> AimdParams {
    let w = workers as f64;
    AimdParams {
        initial: base.initial.min(w),
        min: base.min.min(w),
        max: w,
        ..base.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_preset_builds_and_unknown_names_list_them() {
        for p in PRESETS {
            assert!(preset(p.name).is_ok(), "{}", p.name);
        }
        let e = preset("jitter").unwrap_err();
        assert!(e.contains("\"jitter\""), "{e}");
        for p in PRESETS {
            assert!(e.contains(p.name), "{e}");
        }
        assert_eq!(preset("none").unwrap(), pool(RetryPolicy::none()));
        let w = aimd_window(&AimdParams::default(), 4);
        assert_eq!((w.initial, w.min, w.max), (4.0, 1.0, 4.0));
    }
}

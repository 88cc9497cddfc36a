//! One client configuration the search evaluates, its single-knob
//! neighbours and its rendering as an experiment.

use super::constraint::fmt_num;
use crate::client::managed::AimdParams;
use crate::client::policy::{Backoff, RetryPolicy, SdkRetry};
use crate::client::presets::{self, ClientPolicy};
use crate::experiment::config::{client_with, ClientKind, Experiment};
use crate::experiment::HostedSuite;
use crate::report::round;

// ------------------------------------------------------------ configurations

/// The factors (numerator, denominator) by which the refinement widens
/// max_tokens while truncation binds.
pub const WIDEN_MAX_TOKENS: [(u64, u64); 3] = [(5, 4), (3, 2), (2, 1)];
/// The factors (numerator, denominator) of the file's max_tokens the
/// search probes when truncation binds after the grid.
pub const WIDEN_PROBES: [(u64, u64); 6] = [(9, 8), (5, 4), (3, 2), (2, 1), (3, 1), (4, 1)];
/// The largest max_tokens the search tries (an experiment file's ceiling).
pub const MAX_TOKENS_CEILING: u64 = 10_000_000;

/// One client configuration the search evaluates.
#[derive(Debug, Clone)]
pub struct Config {
    pub policy: &'static str,
    pub workers: u32,
    pub max_tokens: u64,
    /// The client policy with its (possibly refined) parameters.
    pub(crate) client: ClientPolicy,
    /// The AIMD window of `aimd` (None for pool policies).
    pub(crate) window: Option<AimdParams>,
}

impl Config {
    /// The policy's parameters, (name, value), as TOML keys.
    pub fn params(&self) -> Vec<(&'static str, f64)> {
        if let Some(w) = &self.window {
            return vec![
                ("initial_concurrency", w.initial),
                ("max_concurrency", w.max),
                ("increase", w.increase),
                ("decrease", w.decrease),
            ];
        }
        let ClientPolicy::Pool { retry, .. } = &self.client else {
            return vec![];
        };
        let mut v = match retry.backoff {
            Backoff::None => return vec![],
            Backoff::Constant { delay } => vec![("delay_s", delay)],
            Backoff::Exponential { base, cap, jitter } => {
                vec![("base_s", base), ("cap_s", cap), ("jitter_s", jitter)]
            }
            Backoff::FullJitter { base, cap }
            | Backoff::EqualJitter { base, cap }
            | Backoff::Decorrelated { base, cap } => vec![("base_s", base), ("cap_s", cap)],
        };
        v.push(("max_attempts", retry.max_attempts as f64));
        v
    }

    pub(crate) fn params_text(&self) -> String {
        self.params()
            .iter()
            .map(|(k, v)| format!("{k}={}", fmt_num(*v, 3)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A unique, readable label.
    pub fn label(&self) -> String {
        let p = self.params_text();
        let mut s = format!(
            "{} workers={} max_tokens={}",
            self.policy, self.workers, self.max_tokens
        );
        if !p.is_empty() {
            s.push_str(&format!(" ({p})"));
        }
        s
    }

    pub(crate) fn experiment(&self, suite: &HostedSuite) -> Experiment {
        let client = match &self.window {
            Some(w) => ClientKind::Managed(w.clone()),
            None => client_with(
                &self.client,
                self.workers,
                suite.base.sdk.clone(),
                &suite.base.managed,
            ),
        };
        Experiment {
            index: 0,
            name: self.label(),
            description: String::new(),
            rows: suite.base.rows,
            max_tokens: self.max_tokens,
            client,
        }
    }

    /// The configuration as an `[[experiment]]` of a hosted file.
    pub fn toml(&self, sdk_retries: bool) -> String {
        let mut s = format!(
            "[[experiment]]\nname = \"recommended\"\ndescription = \"qsim recommend: {}\"\n",
            self.label()
        );
        if let Some(w) = &self.window {
            s.push_str(&format!(
                "client = \"managed\"\nmax_tokens = {}\nmanaged = {{ initial_concurrency = {}, max_concurrency = {}, increase = {}, decrease = {} }}\n",
                self.max_tokens,
                fmt_num(w.initial, 3),
                fmt_num(w.max, 3),
                fmt_num(w.increase, 3),
                fmt_num(w.decrease, 3)
            ));
            return s;
        }
        s.push_str(&format!(
            "client = \"pool\"\nworkers = {}\nmax_tokens = {}\nsdk_retries = {sdk_retries}\n",
            self.workers, self.max_tokens
        ));
        let ClientPolicy::Pool { retry, shared } = &self.client else {
            return s;
        };
        let backoff = match retry.backoff {
            Backoff::None => "none",
            Backoff::Constant { .. } => "constant",
            Backoff::Exponential { .. } => "exponential",
            Backoff::FullJitter { .. } => "full_jitter",
            Backoff::EqualJitter { .. } => "equal_jitter",
            Backoff::Decorrelated { .. } => "decorrelated",
        };
        let mut fields = vec![format!("backoff = \"{backoff}\"")];
        for (k, v) in self.params() {
            fields.push(format!("{k} = {}", fmt_num(v, 3)));
        }
        if retry.backoff != Backoff::None {
            fields.push("retry_on = [\"429\", \"5xx\"]".into());
            fields.push(format!("honor_hint = {}", retry.honor_hint));
        }
        s.push_str(&format!("retry = {{ {} }}\n", fields.join(", ")));
        if shared.quota.is_some() {
            let (c, k, i) = presets::AWS_QUOTA;
            s.push_str(&format!(
                "retry_quota = {{ capacity = {c}, cost = {k}, success_increment = {i} }}\n"
            ));
        }
        if shared.throttle.is_some() {
            let (k, w) = presets::SRE_THROTTLE;
            s.push_str(&format!("throttle = {{ k = {k}, window_s = {w} }}\n"));
        }
        s
    }

    pub(crate) fn new(
        policy: &'static str,
        workers: u32,
        max_tokens: u64,
        base: &AimdParams,
    ) -> Config {
        let client = presets::preset(policy).expect("a listed preset");
        let window = (client == ClientPolicy::Aimd).then(|| presets::aimd_window(base, workers));
        Config {
            policy,
            workers,
            max_tokens,
            client,
            window,
        }
    }

    /// Is this the managed executor's adaptive window (`aimd`)?
    pub fn is_managed(&self) -> bool {
        self.window.is_some()
    }

    /// The settings a thread pool needs to run this configuration, as
    /// (setting, value) lines: workers, max_tokens, the retry policy with
    /// its parameters, the shared layers and the SDK's hidden retries (`sdk`
    /// as the file sets it). None for the managed executor (`aimd`), which
    /// has no fixed pool.
    pub fn pool_settings(&self, sdk: Option<&SdkRetry>) -> Option<Vec<(String, String)>> {
        let ClientPolicy::Pool { retry, shared } = &self.client else {
            return None;
        };
        if self.window.is_some() {
            return None;
        }
        let n = |x: f64| fmt_num(x, 3);
        let mut v = vec![
            ("workers".to_string(), self.workers.to_string()),
            (
                "max_tokens".to_string(),
                format!("{} (per request)", self.max_tokens),
            ),
        ];
        let after = "after failed attempt k = 1, 2, …";
        let how = match retry.backoff {
            Backoff::None => "none: a row whose call fails is failed".to_string(),
            Backoff::Constant { delay } => format!("constant: sleep {} s between attempts", n(delay)),
            Backoff::Exponential { base, cap, jitter } => format!(
                "exponential: {after}, sleep min({}·2^(k−1), {}) + U[0, {}) s",
                n(base),
                n(cap),
                n(jitter)
            ),
            Backoff::FullJitter { base, cap } => format!(
                "full jitter: {after}, sleep U(0, min({}·2^(k−1), {})) s",
                n(base),
                n(cap)
            ),
            Backoff::EqualJitter { base, cap } => format!(
                "equal jitter: {after}, sleep v/2 + U(0, v/2) s with v = min({}·2^(k−1), {})",
                n(base),
                n(cap)
            ),
            Backoff::Decorrelated { base, cap } => format!(
                "decorrelated jitter: sleep min({}, U({}, 3 × the previous sleep)) s, the first from {}",
                n(cap),
                n(base),
                n(base)
            ),
        };
        v.push(("retry".into(), how));
        if retry.backoff != Backoff::None {
            v.push((
                "retry on".into(),
                format!(
                    "HTTP 429 and 5xx, at most {} attempts per row (the first included); {}",
                    retry.max_attempts,
                    if retry.honor_hint {
                        "a retry hint (Retry-After, retry-after-ms, body retry_after) replaces the sleep"
                    } else {
                        "retry hints ignored"
                    }
                ),
            ));
        }
        if shared.quota.is_some() {
            let (c, k, i) = presets::AWS_QUOTA;
            v.push((
                "retry quota".into(),
                format!("shared by the workers: {c} tokens, {k} per retry, +{i} per success; no retry when empty"),
            ));
        }
        if shared.throttle.is_some() {
            let (k, w) = presets::SRE_THROTTLE;
            v.push((
                "throttle".into(),
                format!("client-side adaptive throttling, shared: reject locally with probability max(0, (requests − {k}·accepts)/(requests + 1)) over {w} s"),
            ));
        }
        v.push((
            "SDK retries".into(),
            match sdk {
                Some(s) => format!(
                    "on, as in the file (the OpenAI SDK's max_retries={}, hidden inside each attempt)",
                    s.max_retries
                ),
                None => "off, as in the file (max_retries=0)".into(),
            },
        ));
        Some(v)
    }

    /// Every configuration one knob away (see the module docs); with
    /// `widen_max_tokens` (truncation binds) also max_tokens × 5/4, 3/2
    /// and 2.
    pub(crate) fn neighbours(&self, widen_max_tokens: bool) -> Vec<Config> {
        let mut out = Vec::new();
        let w = self.workers as i64;
        for d in [-4i64, -2, -1, 1, 2, 4] {
            if w + d >= 1 {
                let mut c = self.clone();
                c.workers = (w + d) as u32;
                if let Some(win) = &mut c.window {
                    *win = presets::aimd_window(win, c.workers);
                }
                out.push(c);
            }
        }
        for d in [-16i64, 16] {
            let mt = self.max_tokens as i64 + d;
            if mt >= 16 {
                let mut c = self.clone();
                c.max_tokens = mt as u64;
                out.push(c);
            }
        }
        if widen_max_tokens {
            for (num, den) in WIDEN_MAX_TOKENS {
                let mt = (self.max_tokens * num / den).min(MAX_TOKENS_CEILING);
                if mt > self.max_tokens + 16 {
                    let mut c = self.clone();
                    c.max_tokens = mt;
                    out.push(c);
                }
            }
        }
        if self.window.is_some() {
            let mut push = |f: &dyn Fn(&mut AimdParams)| {
                let mut c = self.clone();
                let w = c.window.as_mut().expect("aimd");
                f(w);
                w.initial = w.initial.clamp(w.min, w.max);
                w.decrease = w.decrease.clamp(0.1, 0.9);
                if c.window != self.window {
                    out.push(c);
                }
            };
            push(&|w| w.initial *= 2.0);
            push(&|w| w.initial = (w.initial / 2.0).max(1.0).round());
            push(&|w| w.increase *= 2.0);
            push(&|w| w.increase /= 2.0);
            push(&|w| w.decrease = round(w.decrease + 0.1, 3));
            push(&|w| w.decrease = round(w.decrease - 0.1, 3));
            return out;
        }
        let ClientPolicy::Pool { retry, .. } = &self.client else {
            return out;
        };
        if retry.backoff == Backoff::None {
            return out;
        }
        let mut push = |f: &dyn Fn(&mut RetryPolicy)| {
            let mut c = self.clone();
            if let ClientPolicy::Pool { retry, .. } = &mut c.client {
                f(retry);
            }
            if c.client != self.client {
                out.push(c);
            }
        };
        let scale = |r: &mut RetryPolicy, which: usize, k: f64| {
            let r3 = |x: &mut f64| *x = round((*x * k).clamp(0.001, 3600.0), 3);
            match &mut r.backoff {
                Backoff::Constant { delay } if which == 0 => r3(delay),
                Backoff::Exponential { base, cap, jitter } => match which {
                    0 => r3(base),
                    1 => r3(cap),
                    _ => r3(jitter),
                },
                Backoff::FullJitter { base, cap }
                | Backoff::EqualJitter { base, cap }
                | Backoff::Decorrelated { base, cap } => match which {
                    0 => r3(base),
                    1 => r3(cap),
                    _ => {}
                },
                _ => {}
            }
        };
        let constant = matches!(retry.backoff, Backoff::Constant { .. });
        for which in 0..3 {
            let (up, down) = if constant {
                (1.5, 1.0 / 1.5)
            } else {
                (2.0, 0.5)
            };
            push(&|r| scale(r, which, up));
            push(&|r| scale(r, which, down));
        }
        push(&|r| r.max_attempts += 2);
        push(&|r| r.max_attempts = r.max_attempts.saturating_sub(2).max(2));
        out
    }
}

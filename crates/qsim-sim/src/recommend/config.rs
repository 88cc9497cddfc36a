//! One client configuration the search evaluates, its single-knob
//! neighbours and its rendering as an experiment.

use super::constraint::fmt_num;
use crate::client::managed::AimdParams;
use crate::client::policy::{Backoff, RetryPolicy};
use crate::client::presets::{self, ClientPolicy};
use crate::experiment::config::{client_with, ClientKind, Experiment};
use crate::experiment::HostedSuite;
use crate::report::round;

// ------------------------------------------------------------ configurations

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

    /// Every configuration one knob away (see the module docs).
    pub(crate) fn neighbours(&self) -> Vec<Config> {
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

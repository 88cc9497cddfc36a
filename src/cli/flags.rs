//! Flags that several commands share, as clap parses them, and their
//! conversion into `qsim-sim`'s plain specs (nothing below this crate names
//! clap).

use qsim_sim::budget::{Budget, DEFAULT_MAX_MEMORY_MB, DEFAULT_MAX_REQUESTS};
use qsim_sim::plan::PlanSpec;
use std::path::PathBuf;

/// The budget flags of `run`, `sweep` and `plan`.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetFlags {
    /// Refuse a run that simulates more than N requests (first tries and
    /// retries; a hosted-API attempt counts 1/4) plus server engine
    /// iterations, over all seeds, points and scenarios: refused at once if
    /// the estimate is over, else stopped when the count crosses N.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_REQUESTS)]
    pub max_requests: u64,
    /// Refuse a run whose estimated peak memory exceeds MB megabytes.
    #[arg(long, value_name = "MB", default_value_t = DEFAULT_MAX_MEMORY_MB)]
    pub max_memory_mb: u64,
}

impl BudgetFlags {
    pub fn budget(&self) -> Budget {
        Budget {
            max_requests: self.max_requests,
            max_memory_mb: self.max_memory_mb,
        }
    }
}

/// The plan's inputs (CLI flags; `None` = from the scenario file).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PlanFlags {
    /// Deployment capacity per minute (requests, or tokens with --unit tpm).
    #[arg(long, allow_negative_numbers = true)]
    pub capacity: Option<String>,
    /// Reservations in percent of capacity, one per reserved consumer: 30,20,30.
    #[arg(long, allow_hyphen_values = true)]
    pub reserve: Option<String>,
    /// Utilization threshold in (0, 1] (enforcement point; burst headroom = (1 - threshold) x capacity).
    #[arg(long, allow_negative_numbers = true)]
    pub threshold: Option<String>,
    /// Names of the reserved consumers (then the unreserved ones): A,B,C[,dev].
    #[arg(long)]
    pub names: Option<String>,
    /// Reservation semantics (default: the file's; the embedded file's is
    /// strict-floors):
    /// rate-limit-only (one ceiling, first come first served; reservations
    /// not enforced);
    /// strict-floors (each floor guaranteed, idle floors and the pool lent
    /// out first come first served);
    /// litellm-priority (LiteLLM's priority_reservation: borrowing only below
    /// the saturation threshold);
    /// partitioned (floors lent only to reserved consumers; the unreserved
    /// pool only for unreserved consumers).
    #[arg(long, value_name = "SEMANTICS")]
    pub semantics: Option<String>,
    /// Capacity unit: rpm or tpm.
    #[arg(long)]
    pub unit: Option<String>,
    /// Burst headroom in capacity units (default (1 - threshold) x capacity).
    #[arg(long, allow_negative_numbers = true)]
    pub burst: Option<String>,
    /// Server profile (TOML) or "ideal"; default: the embedded gpt-oss-20b NIM profile.
    #[arg(long)]
    pub model: Option<String>,
    /// Server replicas behind the limiter.
    #[arg(long, allow_negative_numbers = true)]
    pub replicas: Option<u32>,
    /// Scenario file (kind = "shared"); default: the embedded scenarios of the
    /// shared-deployment article.
    #[arg(long)]
    pub scenarios: Option<PathBuf>,
    /// Inverse planning: the minimum each consumer needs, NAME=RPM,...
    #[arg(long, allow_hyphen_values = true)]
    pub need: Option<String>,
    /// Inverse planning: E2E p95 target (e.g. 2s, 1500ms; units s or ms).
    #[arg(long = "e2e-p95", allow_hyphen_values = true, value_parser = crate::cli::common::duration_arg)]
    pub e2e_p95: Option<qsim_sim::time::Nanos>,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub seed: u64,
    /// Number of seeds (seed, seed+1, …): the report adds medians and 90 %
    /// intervals over seeds of each scenario's and consumer's figures.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub seeds: u64,
    /// Run only these scenarios of the file (comma-separated names; each
    /// keeps its random streams, so its figures equal the full run's).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub only: Vec<String>,
}

impl PlanFlags {
    /// The plan's spec (no `--set` overrides; the scenarios of `--only`).
    pub fn spec(&self) -> PlanSpec {
        PlanSpec {
            capacity: self.capacity.clone(),
            reserve: self.reserve.clone(),
            threshold: self.threshold.clone(),
            names: self.names.clone(),
            semantics: self.semantics.clone(),
            unit: self.unit.clone(),
            burst: self.burst.clone(),
            model: self.model.clone(),
            replicas: self.replicas,
            scenarios: self.scenarios.clone(),
            need: self.need.clone(),
            e2e_p95: self.e2e_p95,
            seed: self.seed,
            seeds: self.seeds,
            sets: Vec::new(),
            only: self.only.clone(),
        }
    }
}

//! qsim's integration tests, one binary (one link of polars, tokio and
//! plotters instead of one per file): a module per former test file, the
//! shared helpers in [`common`]. `cargo test --test it MODULE::` runs one
//! file's tests.

mod calibrate_hosted;
mod calibrate_server;
mod common;
mod compare_cli;
mod docs_output;
mod fuzz_inputs;
mod golden;
mod hardening_budget;
mod hist_props;
mod hosted_swarm;
mod input_bounds;
mod limiter_props;
mod limiter_shared_state;
mod live_end_to_end;
mod load_cli;
mod one_interface;
mod output_safety;
mod plan_acceptance;
mod plan_callers;
mod plan_cli;
mod plan_edges;
mod plan_enforce;
mod plan_proxy_agree;
mod plot_figures;
mod plot_unit;
mod plots_cli;
mod plots_html;
mod proxy_drift;
mod proxy_live;
mod proxy_ops;
mod proxy_redis;
mod proxy_redis_wait;
mod proxy_trust;
mod recommend;
mod replay_errors;
mod replay_llmock;
mod replay_serve;
mod results_dir;
mod results_unit;
mod run_cli;
mod serve_hosted;
mod serve_server;
mod serve_virtual;
mod server_cli;
mod server_fidelity;
mod server_nim;
mod server_queueing;
mod server_swarm;
mod sweep_scale;
mod whatif_live;
mod whatif_restart;
mod whatif_wait;
mod work_budget;

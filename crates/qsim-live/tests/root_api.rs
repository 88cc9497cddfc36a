//! The paths the root crate (`qsim`) reads this crate by: they must keep
//! compiling whatever moves inside (re-exports keep the old paths).

#![allow(unused_imports)]

use qsim_live::bench::{run as bench_run, BenchConfig};
use qsim_live::load::{Arrival, Draws, Identity, LoadConfig, LoadReport, Units, Worker};
use qsim_live::record::{files, Encoder, LogConfig, Record};
use qsim_live::replay::{
    self as live, Attempt, Client, Options, Plan, Row, RowResult, Run, Target, Wire,
};
use qsim_live::serve::{
    input_tokens, prompt_hash, Backend, Event, Failure, Finish, GenRequest, Invalid, RetryHint,
    ServeConfig,
};
use qsim_live::tls::read_ca_file;
use qsim_live::{
    DriftConfig, FailMode, LimitShape, OnLimit, Proxy, ProxyConfig, ShadowFactory, StateBackend,
    Uri,
};

#[test]
fn the_root_crates_paths_compile() {
    let _ = qsim_live::Proxy::new;
    let _ = Proxy::with_reload;
    let _ = Proxy::with_log_encoder;
    let _ = Proxy::run;
    let _ = qsim_live::load::run;
    let _ = live::run;
    let _ = bench_run;
    let _ = read_ca_file;
    let _ = input_tokens;
    let _ = prompt_hash;
    let _: fn(ServeConfig, NoModel) -> Result<(), String> = qsim_live::serve::run::<NoModel>;
    // the model interface is qsim-core's, under its old path too
    let _: Box<dyn qsim_core::model::Backend> = Box::new(NoModel);
    let g = GenRequest {
        input_tokens: 1,
        max_tokens: None,
        prompt_hash: 0,
        output_tokens: None,
    };
    let _: qsim_core::model::GenRequest = g;
}

struct NoModel;

impl Backend for NoModel {
    fn name(&self) -> &str {
        "none"
    }
    fn submit(
        &mut self,
        _now: u64,
        _id: u64,
        _req: &GenRequest,
        _out: &mut Vec<Event>,
    ) -> Result<(), Invalid> {
        Err(Invalid {
            code: "none",
            message: String::new(),
        })
    }
    fn poll_timeout(&self) -> Option<u64> {
        None
    }
    fn handle_timeout(&mut self, _now: u64, _out: &mut Vec<Event>) {}
}

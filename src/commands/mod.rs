//! One module per subcommand: each turns its arguments into plain specs for
//! `qsim-sim` or `qsim-api` and renders what they return.

pub mod calibrate;
pub mod compare;
pub mod examples;
pub mod fleet;
pub mod load;
pub mod options;
pub mod proxy;
pub mod recommend;
pub mod replay;
pub mod serve;
pub mod sim2real;
pub mod trace;
pub mod trace_parquet;
pub mod whatif;

//! The `qsim` binary's library: the command line and one module per
//! subcommand (see docs/ARCHITECTURE.md). Everything that simulates is in
//! `qsim-sim`, the live drivers in `qsim-live`, the rules in `qsim-core`;
//! this crate parses arguments into their plain specs and writes output.
//!
//! - [`cli`]: the clap definitions and the dispatch; [`cli::common`] the
//!   shared plumbing every command uses (errors and exit codes, formats,
//!   durations, emit);
//! - [`commands`]: one module per subcommand;
//! - [`output`], [`plot`], [`results`]: files, plots and result tables.

pub mod cli;
pub mod commands;
pub mod output;
pub mod plot;
pub mod results;

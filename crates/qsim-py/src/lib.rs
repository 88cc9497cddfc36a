//! `qsim._qsim`: the native module of the `qsim` Python package.
//!
//! A door like the CLI: Python arguments → qsim-sim's specs → one library
//! call → results (records, the CLI's text report, the tables' columns).
//! [`pacer`] is the third driver of the caller's state machine
//! (`qsim_core::client::{Call, PoolShared, Managed}`) after the simulation
//! and `qsim replay`: every decision (send now or reject locally, retry
//! when, give up) comes from the core; the Python side (`python/qsim`)
//! only sleeps, sends and reports what came back.
//!
//! Errors: a bad input raises `qsim.ConfigError` (a `qsim.QsimError`) with
//! the CLI's one-line message (`source: field: reason`) and the parts as
//! attributes.

use pyo3::prelude::*;

mod errors;
mod pacer;
mod policy;
mod sim;

#[pymodule]
fn _qsim(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("QsimError", py.get_type::<errors::QsimError>())?;
    m.add("ConfigError", py.get_type::<errors::ConfigError>())?;
    m.add("UnmetError", py.get_type::<errors::UnmetError>())?;
    m.add("ClosedError", py.get_type::<errors::ClosedError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<pacer::PacerCore>()?;
    m.add_class::<sim::RunResult>()?;
    m.add_function(wrap_pyfunction!(sim::run, m)?)?;
    m.add_function(wrap_pyfunction!(sim::sweep, m)?)?;
    m.add_function(wrap_pyfunction!(sim::plan, m)?)?;
    m.add_function(wrap_pyfunction!(sim::simulate_attempts, m)?)?;
    Ok(())
}

//! The `qsim.QsimError` hierarchy: Rust errors as Python exceptions with
//! the CLI's one-line text.

use pyo3::create_exception;
use pyo3::prelude::*;
use qsim_sim::config::ConfigError as Cfg;

create_exception!(
    _qsim,
    QsimError,
    pyo3::exceptions::PyException,
    "Every error qsim raises."
);
create_exception!(
    _qsim,
    ConfigError,
    QsimError,
    "Bad input (a file, field, override or argument): the CLI's exit-2 one-line message; \
     attributes source, field, reason."
);
create_exception!(
    _qsim,
    UnmetError,
    QsimError,
    "A target that cannot be met (the CLI's exit 1)."
);
create_exception!(
    _qsim,
    ClosedError,
    QsimError,
    "The Pacer was closed (its waits are cancelled; new calls refused)."
);

/// A configuration error as `qsim.ConfigError` (message = the CLI's line
/// after `qsim: `).
pub fn config(e: Cfg) -> PyErr {
    Python::attach(|py| {
        let err = ConfigError::new_err(e.to_string());
        let v = err.value(py);
        let _ = v.setattr("source", e.source.clone());
        let _ = v.setattr("field", e.field.clone());
        let _ = v.setattr("reason", e.reason.clone());
        err
    })
}

/// A generic error with the CLI's text.
pub fn qsim(msg: impl Into<String>) -> PyErr {
    QsimError::new_err(msg.into())
}

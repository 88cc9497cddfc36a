//! The crate's one error type (a leaf module: every other module uses it).

/// An error: what it is about (a file, a column, `results`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultsError {
    pub what: String,
    pub reason: String,
}

impl ResultsError {
    pub fn new(what: impl Into<String>, reason: impl Into<String>) -> Self {
        ResultsError {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for ResultsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.reason)
    }
}

impl std::error::Error for ResultsError {}

//! TLS to an `https://` base (e.g. a Databricks workspace): the connector
//! and its CA file are in the HTTP plumbing (`http.rs`, the one client
//! builder); this module keeps the path the root crate reads a CA file by.

pub use crate::http::parse_ca_pem;

//! Named columns of plain values: the one table type of qsim's tables
//! (polars-free, so that a caller without polars, the Python package, builds
//! the same columns; `table` encodes them).

/// The values of one column; `None` is a missing value (null in Parquet,
/// an empty field in CSV).
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    Str(Vec<Option<String>>),
    F64(Vec<Option<f64>>),
    I64(Vec<Option<i64>>),
    U64(Vec<Option<u64>>),
    U32(Vec<Option<u32>>),
    Bool(Vec<Option<bool>>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::Str(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::I64(v) => v.len(),
            Values::U64(v) => v.len(),
            Values::U32(v) => v.len(),
            Values::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A column: its name and values.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedColumn {
    pub name: String,
    pub values: Values,
}

impl NamedColumn {
    pub fn new(name: impl Into<String>, values: Values) -> Self {
        NamedColumn {
            name: name.into(),
            values,
        }
    }
}

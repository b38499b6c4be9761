//! A tuning table that cannot be read or is not one `check` covers.

use std::path::PathBuf;

/// Why a tuning table was refused: unreadable, or naming what `check` has not vetted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuningError {
    /// The table's file could not be read.
    #[error("cannot read tuning table {path}")]
    Read {
        /// The table's path.
        path: PathBuf,
        /// Why reading it failed.
        source: std::io::Error,
    },
    /// The file is not a tuning table in JSON.
    #[error("tuning table {path} is not valid JSON for a table")]
    Parse {
        /// The table's path.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// A forward configuration that `check` does not cover, so its results are unvetted.
    #[error(
        "tuning table {path} picks {config} for head_dim {head_dim}, which is not a candidate \
         `check` covers; rerun `bench --tune`"
    )]
    Unchecked {
        /// The table's path.
        path: PathBuf,
        /// The head_dim it is picked for.
        head_dim: u32,
        /// The configuration's label.
        config: String,
    },
    /// A LayerNorm + Linear entry naming no row-sum schedule.
    #[error(
        "tuning table {path} names row-sum schedule `{name}` for LayerNorm + Linear {key}; \
         the schedules are `atomic` and `two-pass`"
    )]
    RowSums {
        /// The table's path.
        path: PathBuf,
        /// The entry's shape, `{hidden}x{out}`.
        key: String,
        /// The name it gives.
        name: String,
    },
}

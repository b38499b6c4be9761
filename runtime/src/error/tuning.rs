//! A tuning table that cannot be read or is not one `check` covers.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TuningError {
    #[error("cannot read tuning table {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tuning table {path} is not valid JSON for a table")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error(
        "tuning table {path} picks {config} for head_dim {head_dim}, which is not a candidate \
         `check` covers; rerun `bench --tune`"
    )]
    Unchecked {
        path: PathBuf,
        head_dim: u32,
        config: String,
    },
    #[error(
        "tuning table {path} names row-sum schedule `{name}` for LayerNorm + Linear {key}; \
         the schedules are `atomic` and `two-pass`"
    )]
    RowSums {
        path: PathBuf,
        key: String,
        name: String,
    },
}

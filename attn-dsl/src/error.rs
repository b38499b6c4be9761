use std::fmt;

/// The part of a description an error is about, so that a front end can point at it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// The kernel's name.
    Name,
    /// `op:`.
    Op,
    /// `grid:` and its arguments.
    Grid,
    /// `head_dim:`.
    HeadDim,
    /// The width of attention's V and O rows, where it is not head_dim's.
    HeadDimV,
    /// The Linear's output width of a row-wise layer.
    OutDim,
    /// `gqa:`.
    Gqa,
    /// The `masks` list as a whole.
    Masks,
    /// One word of the `masks` list.
    Mask(String),
    /// `target:`.
    Target,
    /// `workgroup_size:`.
    WorkgroupSize,
    /// `source:` (where a key-major backward gets P and dS).
    Source,
    /// `dtype:`.
    Dtype,
    /// The KV cache layout of a decode (`cache: paged`).
    Cache,
    /// The flash grid's `matrix` argument (cooperative-matrix products).
    Matrix,
    /// The `writes` entry of the named output (or the `writes` block when it is missing).
    Write(String),
    /// The user-written modifiers: `score_mod`, `mask_mod` or `tensors`.
    Flex(&'static str),
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Name => f.write_str("name"),
            Field::Op => f.write_str("op"),
            Field::Grid => f.write_str("grid"),
            Field::HeadDim => f.write_str("head_dim"),
            Field::HeadDimV => f.write_str("head_dim_v"),
            Field::OutDim => f.write_str("out"),
            Field::Gqa => f.write_str("gqa"),
            Field::Masks => f.write_str("masks"),
            Field::Mask(word) => write!(f, "masks.{word}"),
            Field::Target => f.write_str("target"),
            Field::WorkgroupSize => f.write_str("workgroup_size"),
            Field::Source => f.write_str("source"),
            Field::Dtype => f.write_str("dtype"),
            Field::Cache => f.write_str("cache"),
            Field::Matrix => f.write_str("grid.matrix"),
            Field::Write(name) => write!(f, "writes.{name}"),
            Field::Flex(key) => f.write_str(key),
        }
    }
}

/// A kernel description that cannot be turned into a correct kernel.
#[derive(Debug, thiserror::Error)]
pub enum DslError {
    /// The description itself is wrong: a value out of range, a race, a limit overrun.
    #[error("{problem}")]
    Spec {
        /// The part of the description at fault.
        field: Field,
        /// What is wrong and what to change.
        problem: String,
    },
    /// naga rejected the WGSL the emitter produced: a bug in the emitter for this spec.
    #[error(transparent)]
    Wgsl(#[from] ValidateError),
}

impl DslError {
    pub(crate) fn spec(field: Field, problem: impl Into<String>) -> DslError {
        DslError::Spec {
            field,
            problem: problem.into(),
        }
    }

    /// The field at fault, if the error is about the description.
    pub fn field(&self) -> Option<&Field> {
        match self {
            DslError::Spec { field, .. } => Some(field),
            DslError::Wgsl(_) => None,
        }
    }
}

/// Why naga refused the emitted WGSL, or why it does not declare the plan's bindings.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// naga's parser refused the text.
    #[error("naga could not parse the emitted WGSL:\n{rendered}")]
    Parse {
        /// naga's report, with the WGSL around the fault.
        rendered: String,
    },
    /// naga's validator refused the module.
    #[error("naga rejected the emitted WGSL:\n{rendered}")]
    Invalid {
        /// naga's report, with the WGSL around the fault.
        rendered: String,
    },
    /// The binding plan and the WGSL's declarations differ: a bug in the emitter.
    #[error("the emitted WGSL does not match the binding plan: {0}")]
    PlanMismatch(String),
    /// A helper function the emitter declared and no fragment calls: a bug in the emitter.
    #[error(
        "the emitted WGSL defines the helper `{0}` but nothing calls it: an emitter declares \
         a helper its fragment does not use"
    )]
    UnusedHelper(String),
}

//! The shape of an attention problem (heads, documents) and the checks every entry point
//! makes on it, recording op or host call alike: dims, heads against a kernel, the scale,
//! document starts, binding sizes.

use attn_dsl::{Gqa, KernelAbi, Op};

use crate::error::InputError;

/// Head counts and head sizes: `head_dim` of Q and K rows, `head_dim_v` of V and O rows
/// (equal but in MLA-style attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    /// Query heads.
    pub n_heads: u32,
    /// K and V heads; each serves `n_heads / n_kv_heads` query heads.
    pub n_kv_heads: u32,
    /// The width of Q and K rows.
    pub head_dim: u32,
    /// The width of V and O rows.
    pub head_dim_v: u32,
}

impl Heads {
    /// Heads whose V and O rows are as wide as Q and K's.
    pub fn new(n_heads: u32, n_kv_heads: u32, head_dim: u32) -> Heads {
        Heads {
            n_heads,
            n_kv_heads,
            head_dim,
            head_dim_v: head_dim,
        }
    }

    /// Softmax scale over Q·K, whose rows are `head_dim` wide.
    pub fn default_scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Q and K's width, V and O's.
    pub fn dims(&self) -> (u32, u32) {
        (self.head_dim, self.head_dim_v)
    }

    /// The width a kernel holds rows at: the wider of `head_dim` and `head_dim_v`.
    pub fn width(&self) -> u32 {
        self.head_dim.max(self.head_dim_v)
    }
}

/// The `seg` of sequences packed along one axis, FlashAttention's `cu_seqlens`: row `s` of
/// sequence `i` (rows `cu[i]..cu[i + 1]`) starts its document at `cu[i]`. `None` unless
/// `cu` starts at 0 and never decreases.
pub fn seg_from_cu_seqlens(cu_seqlens: &[u32]) -> Option<Vec<u32>> {
    if cu_seqlens.first() != Some(&0) || cu_seqlens.windows(2).any(|w| w[1] < w[0]) {
        return None;
    }
    Some(
        cu_seqlens
            .windows(2)
            .flat_map(|w| std::iter::repeat_n(w[0], (w[1] - w[0]) as usize))
            .collect(),
    )
}

/// The `seg` of sequences of these lengths packed along one axis; `None` where they add
/// up to more rows than a `u32` counts.
pub fn seg_from_lengths(lengths: &[u32]) -> Option<Vec<u32>> {
    let mut cu = vec![0u32];
    for l in lengths {
        cu.push(cu.last()?.checked_add(*l)?);
    }
    seg_from_cu_seqlens(&cu)
}

/// The dims of a dispatch over `batch` sequences of `seq_len` rows (field names of the
/// kernels' `dims` block; fields a kernel lacks are ignored, fields not given are 0).
pub(crate) fn sequence_dims(batch: u32, seq_len: u32, h: Heads) -> [(&'static str, u32); 5] {
    [
        ("seq_len", seq_len),
        ("n_heads", h.n_heads),
        ("n_kv_heads", h.n_kv_heads),
        ("head_dim", h.head_dim),
        ("batch", batch),
    ]
}

/// Starts and ends of every row's document, as the `seg` binding holds them; `None` where
/// `seg` does not hold `batch * seq_len` rows.
pub fn seg_with_ends(seg: Option<&[u32]>, batch: u32, seq_len: u32) -> Option<Vec<u32>> {
    let (batch, seq) = (batch as usize, seq_len as usize);
    let rows = batch.checked_mul(seq)?;
    let starts = match seg {
        Some(seg) if seg.len() == rows => seg.to_vec(),
        Some(_) => return None,
        None => vec![0; rows],
    };
    let mut ends = vec![0u32; batch * seq];
    for b in 0..batch {
        let rows = &starts[b * seq..][..seq];
        let mut end = seq_len;
        for s in (0..seq).rev() {
            ends[b * seq + s] = end;
            if rows[s] as usize == s {
                end = s as u32;
            }
        }
    }
    Some(starts.into_iter().chain(ends).collect())
}

pub(crate) fn expect_op(abi: &KernelAbi, wanted: Op) -> Result<(), InputError> {
    if abi.op == wanted {
        Ok(())
    } else {
        Err(InputError::WrongOp {
            kernel: abi.name.to_string(),
            actual: abi.op.name(),
            wanted: wanted.name(),
        })
    }
}

pub(crate) fn nonzero(name: &'static str, value: u32) -> Result<(), InputError> {
    if value == 0 {
        Err(InputError::ZeroDim { name })
    } else {
        Ok(())
    }
}

pub(crate) fn validate_heads(abi: &KernelAbi, h: Heads) -> Result<(), InputError> {
    nonzero("n_heads", h.n_heads)?;
    nonzero("n_kv_heads", h.n_kv_heads)?;
    nonzero("head_dim", h.head_dim)?;
    if h.head_dim != abi.head_dim {
        return Err(InputError::HeadDim {
            kernel: abi.name.to_string(),
            kernel_head_dim: abi.head_dim,
            given: h.head_dim,
        });
    }
    if h.head_dim_v != abi.head_dim_v() {
        return Err(InputError::HeadDimV {
            kernel: abi.name.to_string(),
            kernel_head_dim_v: abi.head_dim_v(),
            given: h.head_dim_v,
        });
    }
    if !h.n_heads.is_multiple_of(h.n_kv_heads) {
        return Err(InputError::HeadsNotDivisible {
            n_heads: h.n_heads,
            n_kv_heads: h.n_kv_heads,
        });
    }
    match abi.gqa {
        Gqa::Ratio(ratio) if ratio != h.n_heads / h.n_kv_heads => Err(InputError::GqaRatio {
            kernel: abi.name.to_string(),
            ratio,
            given: h.n_heads / h.n_kv_heads,
        }),
        _ => Ok(()),
    }
}

pub(crate) fn length(
    name: &'static str,
    got: usize,
    expected: u64,
    layout: &str,
) -> Result<(), InputError> {
    if got as u64 == expected {
        Ok(())
    } else {
        Err(InputError::Length {
            name,
            expected,
            got: got as u64,
            layout: layout.into(),
        })
    }
}

pub(crate) fn validate_scale(scale: Option<f32>) -> Result<(), InputError> {
    match scale {
        Some(s) if !s.is_finite() => Err(InputError::Scale(s)),
        _ => Ok(()),
    }
}

/// `seg[s]` is the start of query `s`'s document: at most `s`, never decreasing, and a
/// document start itself (`seg[seg[s]] == seg[s]`).
pub fn validate_seg(seg: &[u32]) -> Result<(), InputError> {
    for (s, &value) in seg.iter().enumerate() {
        let reason = if value as usize > s {
            "a document cannot start after its own query (need seg[s] <= s)"
        } else if s > 0 && value < seg[s - 1] {
            "document starts must not decrease"
        } else if seg[value as usize] != value {
            "seg[s] must be a document start, i.e. seg[seg[s]] == seg[s]"
        } else {
            continue;
        };
        return Err(InputError::Seg {
            index: s,
            value,
            reason,
        });
    }
    Ok(())
}

pub(crate) fn binding_size(limits: &wgpu::Limits, bytes: u64) -> Result<(), InputError> {
    let limit = limits.max_storage_buffer_binding_size;
    if bytes > limit {
        return Err(InputError::OverLimit {
            what: "the largest buffer (bytes)",
            value: bytes,
            limit,
        });
    }
    Ok(())
}

/// Bytes per element of binding `name` as the kernel stores it (2 for f16 and bf16).
pub(crate) fn element_bytes(abi: &attn_dsl::KernelAbi, name: &str) -> u64 {
    match abi.scalar(name) {
        attn_dsl::Scalar::F16 | attn_dsl::Scalar::Bf16 => 2,
        attn_dsl::Scalar::F32 | attn_dsl::Scalar::U32 => 4,
        attn_dsl::Scalar::E4m3 | attn_dsl::Scalar::E5m2 => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_lengths_past_u32_and_a_seg_of_other_rows_are_none() {
        assert_eq!(seg_from_lengths(&[2, 1]), Some(vec![0, 0, 2]));
        assert_eq!(seg_from_lengths(&[u32::MAX, 1]), None);
        assert_eq!(
            seg_with_ends(Some(&[0, 0, 2]), 1, 3),
            Some(vec![0, 0, 2, 2, 2, 3])
        );
        assert_eq!(seg_with_ends(Some(&[0]), 2, 2), None);
    }
}

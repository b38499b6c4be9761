//! The checks of modifier values against the kernel they are given to: the words it was
//! built with, the scalars' ranges, the tensors' names, shapes and element types, the
//! block mask's fit.

use attn_dsl::flex::{Flex, Ty};
use attn_dsl::{BiasHeads, KernelAbi, Modifier, Scalar};

use super::{DeviceModifiers, FlexOf, Modifiers, ModifiersOf, Values};
use crate::error::InputError;
use crate::tensor::{Tensor, TensorError};

impl<'a, T: ?Sized + Values> FlexOf<'a, T> {
    /// Each declared tensor given once, nothing undeclared.
    fn check_names(&self, kernel: &str, flex: &Flex) -> Result<(), InputError> {
        let refuse = |message: String| {
            Err(InputError::Flex {
                kernel: kernel.to_string(),
                message,
            })
        };
        for (n, (name, _)) in self.tensors.iter().enumerate() {
            if flex.tensor(name).is_none() {
                return refuse(format!(
                    "tensor `{name}` is not declared by the kernel's `tensors`"
                ));
            }
            if self.tensors[..n].iter().any(|(m, _)| m == name) {
                return refuse(format!("tensor `{name}` is given twice"));
            }
        }
        if let Some(t) = flex.tensors.iter().find(|t| self.tensor(&t.name).is_none()) {
            return refuse(format!(
                "tensor `{}` ({}) is declared but not given",
                t.name,
                t.describe()
            ));
        }
        Ok(())
    }
}

impl FlexOf<'_, Tensor> {
    /// A block mask given where `abi` reads one, made for its modifiers and this shape.
    fn check_block_mask(
        &self,
        abi: &KernelAbi,
        batch: u32,
        n_heads: u32,
        positions: u32,
    ) -> Result<(), InputError> {
        // (The kernel that makes a block mask writes it.)
        if abi.binding("block_mask").is_none_or(|b| b.write.is_some()) {
            return Ok(());
        }
        let refuse = |message: &str| {
            Err(InputError::Flex {
                kernel: abi.name.to_string(),
                message: message.to_string(),
            })
        };
        match self.block_mask {
            None => refuse(
                "it reads a block mask: make one with `BlockMask::new` for its modifiers and \
                 this shape, record it, and give it in `mods.flex.block_mask`",
            ),
            Some(m) if !m.fits(self.modifiers, batch, n_heads, positions) => refuse(
                "the block mask given was made for other modifiers or another shape \
                 (sequences, heads or positions); make one for this call's",
            ),
            Some(_) => Ok(()),
        }
    }
}

impl<'a> DeviceModifiers<'a> {
    /// The shapes of the slopes (`[n_heads]`) and the bias (`[batch, n_heads or 1, q_rows,
    /// q_rows]`), f32, besides what every modifier set checks; the modifiers' tensors'
    /// `seq` dimensions and a block mask over `positions` (a forward's q_rows, a decode's
    /// capacity).
    pub(crate) fn validate(
        &self,
        abi: &KernelAbi,
        batch: u32,
        (q_rows, positions): (u32, u32),
        n_heads: u32,
    ) -> Result<(), InputError> {
        self.check_words(abi)?;
        self.check_scalars()?;
        if let Some(f) = self.flex {
            let flex = f.modifiers.get();
            f.check_names(&abi.name, &flex)?;
            f.check_block_mask(abi, batch, n_heads, positions)?;
            for t in &flex.tensors {
                let given = f
                    .tensor(&t.name)
                    .expect("checked: every declared tensor is given");
                let scalar = match t.ty {
                    Ty::F32 => Scalar::F32,
                    _ => Scalar::U32,
                };
                let shape = t.shape(batch, n_heads, positions);
                expect(
                    given,
                    &t.name,
                    &shape,
                    scalar,
                    "as the kernel's `tensors` declare it",
                )?;
            }
        }
        for (name, t) in [("alibi", self.alibi), ("sinks", self.sinks)] {
            if let Some(t) = t {
                expect(t, name, &[n_heads], Scalar::F32, "[n_heads]")?;
            }
        }
        if let Some(b) = self.bias {
            let heads = match b.heads {
                BiasHeads::PerHead => n_heads,
                BiasHeads::Shared => 1,
            };
            expect(
                b.values,
                "bias",
                &[batch, heads, q_rows, q_rows],
                Scalar::F32,
                "[batch, n_heads or 1, seq_len, seq_len]",
            )?;
        }
        Ok(())
    }
}

/// `tensor`'s shape and element type as an op needs them.
pub(crate) fn expect(
    tensor: &Tensor,
    name: &str,
    shape: &[u32],
    scalar: Scalar,
    layout: &'static str,
) -> Result<(), TensorError> {
    if tensor.scalar() != scalar {
        return Err(TensorError::Dtype {
            name: name.into(),
            got: scalar_name(tensor.scalar()),
            want: scalar_name(scalar),
        });
    }
    if tensor.shape() != shape {
        return Err(TensorError::Shape {
            name: name.into(),
            got: tensor.shape().to_vec(),
            want: shape.to_vec(),
            layout,
        });
    }
    Ok(())
}

pub(crate) fn scalar_name(s: Scalar) -> &'static str {
    match s {
        Scalar::F32 => "f32",
        Scalar::U32 => "u32",
        Scalar::F16 => "f16",
        Scalar::Bf16 => "bf16",
        Scalar::E4m3 => "e4m3",
        Scalar::E5m2 => "e5m2",
    }
}

impl<T: ?Sized + Values> ModifiersOf<'_, T> {
    /// Every value given for a word `abi` was built with, and none for a word it was not.
    fn check_words(&self, abi: &KernelAbi) -> Result<(), InputError> {
        if let (Some(built), Some(given)) = (abi.masks.bias, self.bias)
            && built != given.heads
        {
            return Err(InputError::BiasHeads {
                kernel: abi.name.to_string(),
            });
        }
        // A kernel that reports its reads takes the values of the same modifiers.
        let given = self.flex.map(|f| f.modifiers.plain());
        if abi.masks.flex.map(|f| f.plain()) != given {
            let message = match (abi.masks.flex, given) {
                (Some(_), None) => "it was built with score_mod / mask_mod; give their tensors in \
                                    `mods.flex`"
                    .to_string(),
                (None, Some(_)) => "it was built without score_mod / mask_mod; leave `mods.flex` \
                                    empty or build the kernel with them"
                    .to_string(),
                _ => "`mods.flex` names other modifiers than the kernel was built with".to_string(),
            };
            return Err(InputError::Flex {
                kernel: abi.name.to_string(),
                message,
            });
        }
        for m in Modifier::ALL.into_iter().filter(|m| m.takes_value()) {
            let built = abi.masks.has(m);
            if built != self.gives(m) {
                return Err(InputError::Modifier {
                    kernel: abi.name.to_string(),
                    word: m.word(),
                    built,
                });
            }
        }
        Ok(())
    }

    /// The window, the soft cap and dropout's p.
    fn check_scalars(&self) -> Result<(), InputError> {
        let bad = |what: &'static str, value: f64, needs: &'static str| InputError::BadValue {
            what,
            value,
            needs,
        };
        if self.window == Some(0) {
            return Err(bad(
                "window",
                0.0,
                "at least 1 (a query always sees itself)",
            ));
        }
        if let Some(cap) = self.softcap
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(bad("softcap", f64::from(cap), "a finite number over 0"));
        }
        if let Some(d) = self.dropout
            && !(0.0..1.0).contains(&d.p)
        {
            return Err(bad("dropout p", f64::from(d.p), "0 <= p < 1"));
        }
        Ok(())
    }
}

impl Modifiers<'_> {
    /// These values against the masks `abi` was built with, and their shapes against the
    /// dims: `q_rows` query rows per sequence (the bias is `[batch, heads, q_rows, q_rows]`),
    /// the modifiers' tensors' `seq` dimensions over `positions` (a forward's rows, a
    /// decode's capacity).
    pub(crate) fn validate(
        &self,
        abi: &KernelAbi,
        batch: u32,
        (q_rows, positions): (u32, u32),
        n_heads: u32,
    ) -> Result<(), InputError> {
        self.check_words(abi)?;
        self.check_scalars()?;
        if let Some(f) = self.flex {
            validate_flex(&abi.name, f, batch, positions, n_heads)?;
        }
        self.validate_values(batch, q_rows, n_heads)
    }

    fn validate_values(&self, batch: u32, q_rows: u32, n_heads: u32) -> Result<(), InputError> {
        let per_head = [
            (self.alibi, "alibi", "an ALiBi slope"),
            (self.sinks, "sinks", "a sink logit"),
        ];
        for (values, name, what) in per_head {
            let Some(values) = values else { continue };
            crate::shape::length(name, values.len(), u64::from(n_heads), "n_heads")?;
            if let Some(x) = values.iter().find(|x| !x.is_finite()) {
                return Err(InputError::BadValue {
                    what,
                    value: f64::from(*x),
                    needs: "a finite number",
                });
            }
        }
        if let Some(b) = self.bias {
            let heads = match b.heads {
                BiasHeads::PerHead => u64::from(n_heads),
                BiasHeads::Shared => 1,
            };
            let rows = u64::from(q_rows);
            let layout = match b.heads {
                BiasHeads::PerHead => "batch × n_heads × seq_len × seq_len",
                BiasHeads::Shared => "batch × 1 × seq_len × seq_len",
            };
            let want = u64::from(batch) * heads * rows * rows;
            crate::shape::length("bias", b.values.len(), want, layout)?;
        }
        Ok(())
    }
}

/// Host values of the user-written modifiers' tensors: each declared one given, of its
/// declared length; a `u32` tensor's values whole numbers in u32's range.
fn validate_flex(
    kernel: &str,
    f: FlexOf<'_, [f32]>,
    batch: u32,
    positions: u32,
    n_heads: u32,
) -> Result<(), InputError> {
    let flex = f.modifiers.get();
    f.check_names(kernel, &flex)?;
    for t in &flex.tensors {
        let values = f
            .tensor(&t.name)
            .expect("checked: every declared tensor is given");
        let want = t.len(batch, n_heads, positions);
        if values.len() as u64 != want {
            return Err(InputError::Flex {
                kernel: kernel.to_string(),
                message: format!(
                    "tensor `{}` has {} values; its declared shape {} holds {want} here",
                    t.name,
                    values.len(),
                    t.describe()
                ),
            });
        }
        if t.ty == Ty::U32
            && let Some(x) = values
                .iter()
                .find(|x| !(x.fract() == 0.0 && (0.0..4294967296.0).contains(*x)))
        {
            return Err(InputError::BadValue {
                what: "a u32 tensor's value",
                value: f64::from(*x),
                needs: "a whole number from 0 to 2^32 - 1",
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modifiers::{Bias, Dropout};
    use attn_dsl::Masks;

    /// Each word a kernel was built with needs its value, each value its word, and the
    /// bias its layout: one row per word of `Modifier::ALL` that takes a value.
    #[test]
    fn values_must_match_the_kernel_words() {
        let slopes = [0.5f32; 2];
        let bias = [0.0f32; 4];
        let none = Modifiers::default();
        let given = |m: Modifier| match m {
            Modifier::Window => Modifiers {
                window: Some(3),
                ..none
            },
            Modifier::Alibi => Modifiers {
                alibi: Some(&slopes[..]),
                ..none
            },
            Modifier::Bias | Modifier::SharedBias => {
                let heads = match m {
                    Modifier::Bias => BiasHeads::PerHead,
                    _ => BiasHeads::Shared,
                };
                Modifiers {
                    bias: Some(Bias {
                        values: &bias[..],
                        heads,
                    }),
                    ..none
                }
            }
            Modifier::Softcap => Modifiers {
                softcap: Some(2.0),
                ..none
            },
            Modifier::Dropout => Modifiers {
                dropout: Some(Dropout {
                    p: 0.1,
                    seed: 1,
                    offset: 0,
                }),
                ..none
            },
            Modifier::Sinks => Modifiers {
                sinks: Some(&slopes[..]),
                ..none
            },
            Modifier::Causal | Modifier::Document => none,
        };
        let abi = |masks: Masks| {
            let spec = attn_dsl::KernelSpec::standard("fwd", attn_dsl::Op::Forward, 64, masks);
            attn_dsl::compile(&spec).expect("compiles")
        };
        let plain = abi(Masks::new(true, true));
        for m in Modifier::ALL.into_iter().filter(|m| m.takes_value()) {
            let built = abi(Masks::new(true, true).with(m));
            assert_eq!(given(m).masks(true, true), built.masks, "{m:?}");
            given(m)
                .check_words(&built)
                .expect("the value its word needs");
            match none.check_words(&built) {
                Err(InputError::Modifier {
                    word, built: true, ..
                }) => assert_eq!(word, m.word()),
                other => panic!("{m:?} built, no value: {other:?}"),
            }
            match given(m).check_words(&plain) {
                Err(InputError::Modifier {
                    word, built: false, ..
                }) => {
                    assert_eq!(word, m.word())
                }
                other => panic!("{m:?} given to a kernel without it: {other:?}"),
            }
            if let Some(other) = m.excludes() {
                assert!(matches!(
                    given(other).check_words(&built),
                    Err(InputError::BiasHeads { .. })
                ));
            }
        }
    }
}

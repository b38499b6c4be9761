//! The run-time values of the masks and score modifiers a kernel was built with (its
//! `masks` words): the sliding window, ALiBi slopes, an additive bias, the soft cap and
//! dropout. One struct for the forward, the decode, the backward and the references.

use attn_dsl::flex::{Flex, FlexRef, Ty};
use attn_dsl::{BiasHeads, KernelAbi, Masks, Modifier, Scalar};

use crate::device::Gpu;
use crate::error::InputError;
use crate::tensor::{Tensor, TensorError};

/// An additive bias, `[batch, n_heads, seq, seq]` (per head) or `[batch, 1, seq, seq]`
/// (shared by the heads); batch 1 for a 3-D tensor. Its values are a host slice
/// ([`Bias`]) or a device [`Tensor`] of that shape ([`DeviceBias`]).
#[derive(Debug)]
pub struct BiasOf<'a, T: ?Sized> {
    /// The bias, added to each score before the softmax.
    pub values: &'a T,
    /// Whether it has a slice per head or one the heads share; the kernel's `bias` or
    /// `shared_bias` word must match.
    pub heads: BiasHeads,
}

impl<T: ?Sized> Clone for BiasOf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized> Copy for BiasOf<'_, T> {}

/// A bias given as a host slice.
pub type Bias<'a> = BiasOf<'a, [f32]>;
/// A bias given as a device tensor.
pub type DeviceBias<'a> = BiasOf<'a, Tensor>;

/// A kernel's user-written modifiers (`score_mod`, `mask_mod`; a description's, or
/// [`attn_dsl::flex::Flex::intern`]ed) and the tensors they read, by declared name: host
/// slices of f32 values (a `u32` tensor's values whole numbers) or device tensors of the
/// declared element type and shape.
pub struct FlexOf<'a, T: ?Sized + Values> {
    /// The modifiers, which must be the ones the kernel was built with.
    pub modifiers: FlexRef,
    /// A value for each declared tensor, by its declared name.
    pub tensors: &'a [(&'a str, &'a T)],
    /// The block mask of these modifiers over the call's shape, for kernels built to read
    /// one ([`attn_dsl::flex::Flex::block_mask`]); others ignore it.
    pub block_mask: Option<&'a T::BlockMask>,
}

/// What modifier values are held as, host slices (`[f32]`) or device tensors, and what a
/// block mask is beside them: its states on the device, nothing on the host (the host-slice
/// calls make their own), so that host values stay `Sync` where device handles are not.
pub trait Values {
    /// The block mask a kernel reading one takes with these values.
    type BlockMask: ?Sized;
}

impl Values for [f32] {
    type BlockMask = std::convert::Infallible;
}

impl Values for Tensor {
    type BlockMask = BlockMaskStates;
}

impl<T: ?Sized + Values> Clone for FlexOf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized + Values> Copy for FlexOf<'_, T> {}

impl<T: ?Sized + Values + std::fmt::Debug> std::fmt::Debug for FlexOf<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlexOf")
            .field("modifiers", &self.modifiers)
            .field("tensors", &self.tensors)
            .field("block_mask", &self.block_mask.is_some())
            .finish()
    }
}

impl<'a, T: ?Sized + Values> FlexOf<'a, T> {
    /// The values given for tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&'a T> {
        self.tensors
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
    }

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

/// A block mask's states on the device with what they were made for
/// (`runtime::ops::block_mask::BlockMask` makes them): the kernels built to read a block
/// mask take them in `mods.flex.block_mask`.
pub struct BlockMaskStates {
    pub(crate) flex: FlexRef,
    pub(crate) batch: u32,
    pub(crate) n_heads: u32,
    pub(crate) positions: u32,
    pub(crate) states: Tensor,
}

impl BlockMaskStates {
    /// `[batch or 1, heads or 1, blocks, blocks + 4]`: a sequence (head) axis only where
    /// the mask reads `b` (`h`) ([`attn_dsl::flex::Flex::block_mask_shape`]).
    pub fn shape(&self) -> [u32; 4] {
        let s = self.states.shape();
        [s[0], s[1], s[2], s[3]]
    }

    /// Each query block's row of states ([`attn_dsl::flex::BLOCK_EMPTY`], `_PARTIAL`,
    /// `_FULL`) and its ranges, row-major in [`BlockMaskStates::shape`]: what the kernels
    /// read.
    pub fn tensor(&self) -> &Tensor {
        &self.states
    }

    /// The modifiers it was made from, with the block mask asked for: what the kernels
    /// that read it are built with.
    pub fn modifiers(&self) -> FlexRef {
        self.flex
    }

    /// Whether a kernel with `flex` over `positions` positions of `batch` sequences of
    /// `n_heads` heads reads these states: the same mask_mod and tensors, the same shape.
    fn fits(&self, flex: FlexRef, batch: u32, n_heads: u32, positions: u32) -> bool {
        let (mine, theirs) = (self.flex.parsed(), flex.parsed());
        mine.mask_mod == theirs.mask_mod
            && mine.tensors == theirs.tensors
            && theirs.block_mask_shape(batch, n_heads, positions) == Some(self.shape())
            && positions == self.positions
    }
}

/// Dropout on P with probability `p`, its mask drawn by Philox-4x32-10 under key `seed`
/// at counter word `offset` (advance it between calls that need fresh masks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of dropping an element, in [0, 1).
    pub p: f32,
    /// The Philox key: the same seed draws the same mask.
    pub seed: u64,
    /// The Philox counter word, which picks another mask under the same seed.
    pub offset: u32,
}

impl Dropout {
    /// A Philox word under this drops its element: p·2^32, rounded.
    pub fn threshold(&self) -> u32 {
        (f64::from(self.p) * 4294967296.0)
            .round()
            .min(f64::from(u32::MAX)) as u32
    }

    /// What a kept element is multiplied by, 1 / (1 - p), in f32 as the kernels hold it.
    pub fn keep_scale(&self) -> f32 {
        (1.0 / (1.0 - f64::from(self.p))) as f32
    }

    /// Whether query `s` keeps key `j` in head `h` of sequence `b` (of `n_heads` heads):
    /// the first word of Philox at counter (j, s, b·n_heads + h, offset) at or over the
    /// threshold, as every kernel decides it.
    pub fn keeps(&self, b: usize, n_heads: usize, h: usize, s: usize, j: usize) -> bool {
        let counter = [j as u32, s as u32, (b * n_heads + h) as u32, self.offset];
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        philox4x32_10(counter, key)[0] >= self.threshold()
    }
}

/// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011),
/// the generator of `attn_dsl::PHILOX_WGSL`.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mul = |a: u32, b: u32| {
        let p = u64::from(a) * u64::from(b);
        ((p >> 32) as u32, p as u32)
    };
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        let (hi0, lo0) = mul(0xD251_1F53, c[0]);
        let (hi1, lo1) = mul(0xCD9E_8D57, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [
            k[0].wrapping_add(0x9E37_79B9),
            k[1].wrapping_add(0xBB67_AE85),
        ];
    }
    c
}

/// The values of the modifiers a kernel was built with; `None` for those it was not. The
/// ALiBi slopes and the bias are host slices ([`Modifiers`], the host-slice API) or device
/// tensors ([`DeviceModifiers`], the recording API).
#[derive(Debug)]
pub struct ModifiersOf<'a, T: ?Sized + Values> {
    /// Keys within this many positions of the query (`masks: [window]`).
    pub window: Option<u32>,
    /// ALiBi slopes, one per query head (`alibi`).
    pub alibi: Option<&'a T>,
    /// `bias` or `shared_bias`.
    pub bias: Option<BiasOf<'a, T>>,
    /// The soft cap (`softcap`), positive.
    pub softcap: Option<f32>,
    /// `dropout`.
    pub dropout: Option<Dropout>,
    /// Attention sinks (`sinks`): one logit per query head, joined to every row's softmax
    /// denominator.
    pub sinks: Option<&'a T>,
    /// User-written modifiers (`score_mod`, `mask_mod`) and their tensors.
    pub flex: Option<FlexOf<'a, T>>,
}

impl<T: ?Sized + Values> Clone for ModifiersOf<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: ?Sized + Values> Copy for ModifiersOf<'_, T> {}

/// Modifier values for the host-slice API.
pub type Modifiers<'a> = ModifiersOf<'a, [f32]>;
/// Modifier values for the recording API: slopes and bias on the device.
pub type DeviceModifiers<'a> = ModifiersOf<'a, Tensor>;

impl<T: ?Sized + Values> Default for ModifiersOf<'_, T> {
    fn default() -> Self {
        ModifiersOf {
            window: None,
            alibi: None,
            bias: None,
            softcap: None,
            dropout: None,
            sinks: None,
            flex: None,
        }
    }
}

/// The device tensors of a host [`Modifiers`], uploaded once.
pub struct Uploaded {
    alibi: Option<Tensor>,
    bias: Option<Tensor>,
    sinks: Option<Tensor>,
    flex: Vec<(String, Tensor)>,
    /// The modifiers' block mask, where they ask for one.
    block_mask: Option<BlockMaskStates>,
    /// The modifiers and the sequences uploaded for, which a block mask is made for.
    made_for: (Option<FlexRef>, u32),
}

impl Uploaded {
    /// The user-written modifiers' tensors by name, for [`Uploaded::view`].
    pub fn flex_tensors(&self) -> Vec<(&str, &Tensor)> {
        self.flex.iter().map(|(n, t)| (n.as_str(), t)).collect()
    }

    /// The modifiers that ask for a block mask ([`attn_dsl::flex::Flex::block_mask`]),
    /// and the sequences uploaded for: what a block mask for them is made of.
    pub fn block_mask_wanted(&self) -> Option<(FlexRef, u32)> {
        let (flex, batch) = self.made_for;
        flex.filter(|f| f.parsed().block_mask).map(|f| (f, batch))
    }

    /// Gives [`Uploaded::view`] the block mask of these modifiers.
    pub fn set_block_mask(&mut self, states: BlockMaskStates) {
        self.block_mask = Some(states);
    }

    /// `mods` with its slices replaced by these tensors (`flex`: [`Uploaded::flex_tensors`]).
    pub fn view<'a>(
        &'a self,
        mods: &Modifiers<'_>,
        flex: &'a [(&'a str, &'a Tensor)],
    ) -> DeviceModifiers<'a> {
        ModifiersOf {
            window: mods.window,
            alibi: self.alibi.as_ref(),
            bias: mods.bias.zip(self.bias.as_ref()).map(|(b, values)| BiasOf {
                values,
                heads: b.heads,
            }),
            softcap: mods.softcap,
            dropout: mods.dropout,
            sinks: self.sinks.as_ref(),
            flex: mods.flex.map(|f| FlexOf {
                modifiers: f.modifiers,
                tensors: flex,
                block_mask: self.block_mask.as_ref(),
            }),
        }
    }
}

impl<'a> Modifiers<'a> {
    /// The slopes, the sinks and the bias as device tensors (`[n_heads]`, and the bias's
    /// 4-D layout for `q_rows` query rows of `batch` sequences).
    pub fn upload(
        &self,
        gpu: &Gpu,
        batch: u32,
        q_rows: u32,
    ) -> Result<Uploaded, crate::error::Error> {
        let per_head = |a: Option<&[f32]>| {
            a.map(|a| Tensor::from_f32(gpu, &[a.len() as u32], Scalar::F32, a))
                .transpose()
        };
        let (alibi, sinks) = (per_head(self.alibi)?, per_head(self.sinks)?);
        let bias = self
            .bias
            .map(|b| {
                let heads = (b.values.len() as u64
                    / (u64::from(batch) * u64::from(q_rows).pow(2)).max(1))
                    as u32;
                Tensor::from_f32(gpu, &[batch, heads, q_rows, q_rows], Scalar::F32, b.values)
            })
            .transpose()?;
        let flex = match self.flex {
            Some(f) => upload_flex(gpu, f, batch, q_rows)?,
            None => Vec::new(),
        };
        Ok(Uploaded {
            alibi,
            bias,
            sinks,
            flex,
            block_mask: None,
            made_for: (self.flex.map(|f| f.modifiers), batch),
        })
    }
}

/// Each declared tensor of `f` on the device, in its element type and shape (heads from
/// the values' length: the host slices are checked against the dims before any upload).
fn upload_flex(
    gpu: &Gpu,
    f: FlexOf<'_, [f32]>,
    batch: u32,
    q_rows: u32,
) -> Result<Vec<(String, Tensor)>, crate::error::Error> {
    let flex = f.modifiers.get();
    let mut out = Vec::new();
    for t in &flex.tensors {
        let Some(values) = f.tensor(&t.name) else {
            continue;
        };
        let shape = flat_shape(t, values.len() as u64, batch, q_rows);
        let tensor = match t.ty {
            Ty::F32 => Tensor::from_f32(gpu, &shape, Scalar::F32, values)?,
            _ => Tensor::from_u32(gpu, &shape, &u32_words(values))?,
        };
        out.push((t.name.clone(), tensor));
    }
    Ok(out)
}

/// A `u32` tensor's host values (whole numbers, checked by `validate`) as its words.
pub(crate) fn u32_words(values: &[f32]) -> Vec<u32> {
    values.iter().map(|&x| x as u32).collect()
}

/// The declared shape of `t`, its head count read off `len` (the host API takes no
/// n_heads here; the length was checked against it).
fn flat_shape(t: &attn_dsl::flex::TensorDecl, len: u64, batch: u32, seq: u32) -> Vec<u32> {
    let others = t.len(batch, 1, seq).max(1);
    let heads = (len / others) as u32;
    t.shape(batch, heads, seq)
}

impl<'a> DeviceModifiers<'a> {
    /// The shapes of the slopes (`[n_heads]`) and the bias (`[batch, n_heads or 1, q_rows,
    /// q_rows]`), f32, besides what every modifier set checks; a block mask over
    /// `positions` (a forward's q_rows, a decode's capacity).
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
                let shape = t.shape(batch, n_heads, q_rows);
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

    /// The modifiers' tensors by binding name.
    pub(crate) fn tensors(&self) -> impl Iterator<Item = (&'a str, &'a Tensor)> + use<'a> {
        let flex = self.flex.map_or(&[][..], |f| f.tensors);
        let blocks = self.flex.and_then(|f| f.block_mask).map(|m| m.tensor());
        [
            ("alibi", self.alibi),
            ("bias", self.bias.map(|b| b.values)),
            ("sinks", self.sinks),
            ("block_mask", blocks),
        ]
        .into_iter()
        .filter_map(|(n, t)| t.map(|t| (n, t)))
        .chain(flex.iter().copied())
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

impl<'a, T: ?Sized + Values> ModifiersOf<'a, T> {
    /// The values of a kernel built with user-written modifiers (`masks`: its
    /// `ABI.masks`, or the masks it was compiled from): the tensors they read by name.
    pub fn with_flex(masks: Masks, tensors: &'a [(&'a str, &'a T)]) -> Self {
        ModifiersOf {
            flex: masks.flex.map(|modifiers| FlexOf {
                modifiers,
                tensors,
                block_mask: None,
            }),
            ..ModifiersOf::default()
        }
    }
}

impl<T: ?Sized + Values> ModifiersOf<'_, T> {
    /// The kernels' masks for these modifiers, with the causal and document masks.
    pub fn masks(&self, causal: bool, document: bool) -> Masks {
        let masks = Modifier::ALL
            .into_iter()
            .filter(|m| self.gives(*m))
            .fold(Masks::new(causal, document), Masks::with);
        Masks {
            flex: self.flex.map(|f| f.modifiers),
            ..masks
        }
    }

    /// Whether these values include one for `m` (never for the words that take none).
    fn gives(&self, m: Modifier) -> bool {
        let bias = |heads| self.bias.is_some_and(|b| b.heads == heads);
        match m {
            Modifier::Causal | Modifier::Document => false,
            Modifier::Window => self.window.is_some(),
            Modifier::Alibi => self.alibi.is_some(),
            Modifier::Bias => bias(BiasHeads::PerHead),
            Modifier::SharedBias => bias(BiasHeads::Shared),
            Modifier::Softcap => self.softcap.is_some(),
            Modifier::Dropout => self.dropout.is_some(),
            Modifier::Sinks => self.sinks.is_some(),
        }
    }

    /// The `dims` fields these modifiers set.
    pub(crate) fn dims(&self) -> [(&'static str, u32); 5] {
        let d = self.dropout;
        [
            ("window", self.window.unwrap_or(0)),
            ("seed_lo", d.map_or(0, |d| d.seed as u32)),
            ("seed_hi", d.map_or(0, |d| (d.seed >> 32) as u32)),
            ("rng_offset", d.map_or(0, |d| d.offset)),
            ("drop_threshold", d.map_or(0, |d| d.threshold())),
        ]
    }

    /// The `params` fields these modifiers set.
    pub(crate) fn params(&self) -> [(&'static str, f32); 2] {
        [
            ("softcap", self.softcap.unwrap_or(0.0)),
            (
                "dropout_scale",
                self.dropout.map_or(1.0, |d| d.keep_scale()),
            ),
        ]
    }

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
    /// dims: `q_rows` query rows per sequence (the bias is `[batch, heads, q_rows, q_rows]`).
    pub(crate) fn validate(
        &self,
        abi: &KernelAbi,
        batch: u32,
        q_rows: u32,
        n_heads: u32,
    ) -> Result<(), InputError> {
        self.check_words(abi)?;
        self.check_scalars()?;
        if let Some(f) = self.flex {
            validate_flex(&abi.name, f, batch, q_rows, n_heads)?;
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
    q_rows: u32,
    n_heads: u32,
) -> Result<(), InputError> {
    let flex = f.modifiers.get();
    f.check_names(kernel, &flex)?;
    for t in &flex.tensors {
        let values = f
            .tensor(&t.name)
            .expect("checked: every declared tensor is given");
        let want = t.len(batch, n_heads, q_rows);
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

    /// Random123's known-answer vectors for Philox-4x32-10.
    #[test]
    fn philox_matches_the_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    /// The kept fraction of a large mask is 1 - p within 5 standard deviations.
    #[test]
    fn dropout_keeps_one_minus_p() {
        for p in [0.1f32, 0.5, 0.9] {
            let d = Dropout {
                p,
                seed: 0x1234_5678_9abc,
                offset: 7,
            };
            let n = 200_000usize;
            let kept = (0..n)
                .filter(|i| d.keeps(1, 4, i % 4, i / 400, i % 400))
                .count();
            let (mean, sd) = (
                n as f64 * (1.0 - f64::from(p)),
                (n as f64 * f64::from(p * (1.0 - p))).sqrt(),
            );
            assert!(
                (kept as f64 - mean).abs() < 5.0 * sd,
                "p {p}: kept {kept} of {n}"
            );
        }
    }
}

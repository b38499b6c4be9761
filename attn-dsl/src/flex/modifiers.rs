//! A kernel's user-written modifiers as one value: the score modifier, the mask and the
//! tensors they read ([`Flex`]), and that value by reference ([`FlexRef`]), which is what
//! rides in [`crate::Masks`] so that every schedule, planner rule and runtime path that
//! already carries a kernel's masks carries its modifiers too.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{Dim, Expr, TensorDecl, Ty};

/// Positions a side of a block mask's block ([`Flex::block_mask`]).
pub const MASK_BLOCK: u32 = 64;
/// A block in which `mask_mod` hides every pair.
pub const BLOCK_EMPTY: u32 = 0;
/// A block in which `mask_mod` shows some pairs and hides others.
pub const BLOCK_PARTIAL: u32 = 1;
/// A block in which `mask_mod` shows every pair.
pub const BLOCK_FULL: u32 = 2;

/// `score_mod`, `mask_mod` and the tensors they read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Flex {
    /// The modified score from `score` (f32), `b`, `h`, `q`, `k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_mod: Option<Expr>,
    /// Whether key `k` is visible to query `q` (of head `h`, sequence `b`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_mod: Option<Expr>,
    /// The tensors the modifiers read, each bound to the kernel by its name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tensors: Vec<TensorDecl>,
    /// Kernels report their first read outside a tensor's shape (kernel, tensor, index)
    /// into the `flex_reads` binding: a debugging build of the same modifiers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub report_reads: bool,
    /// The kernels that skip tiles by `mask_mod` also read a block mask made on the device
    /// (`op: block_mask`, from this `mask_mod` and its tensors): whatever interval
    /// arithmetic cannot bound (a tensor read, `b`) still skips empty blocks and drops the
    /// per-pair test in full ones. A mask whose key ranges are exact (a window, prefix-LM's
    /// `k <= q || k < prefix[b]`: [`crate::flex::bounds`]) tests no tiles, so its kernels
    /// read none and making one is wasted work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub block_mask: bool,
}

impl Flex {
    /// This value by reference: its canonical JSON, kept for the life of the process
    /// (each distinct value once), so that the reference is `Copy` like the masks.
    pub fn intern(&self) -> FlexRef {
        static HELD: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
        let json = serde_json::to_string(self).expect("a modifier set serializes");
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let held = held.get_or_insert_with(HashSet::new);
        if let Some(s) = held.get(json.as_str()) {
            return FlexRef(s);
        }
        let s: &'static str = Box::leak(json.into_boxed_str());
        held.insert(s);
        FlexRef(s)
    }

    /// The shape of this `mask_mod`'s block mask over `positions` positions of `batch`
    /// sequences of `heads` heads: `[batch or 1, heads or 1, blocks, blocks + 4]`, a
    /// sequence (head) axis only where the mask reads `b` (`h`); a row holds a query
    /// block's states, then the keys it sees and the queries that see the key block of the
    /// row's index (each as `blocks - first, last + 1`); `None` without a mask_mod.
    pub fn block_mask_shape(&self, batch: u32, heads: u32, positions: u32) -> Option<[u32; 4]> {
        let mask = self.mask_mod.as_ref()?.inlined();
        let blocks = positions.div_ceil(MASK_BLOCK);
        let pick = |var: &str, n: u32| if mask.mentions(var) { n } else { 1 };
        Some([pick("b", batch), pick("h", heads), blocks, blocks + 4])
    }

    /// The declared tensor `name`, `None` where no tensor has that name.
    pub fn tensor(&self, name: &str) -> Option<&TensorDecl> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// A [`Flex`] by its canonical JSON: `Copy` and const-constructible (the macro embeds it
/// in a kernel's `ABI` constant), equal when the modifiers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlexRef(&'static str);

impl FlexRef {
    /// For generated code: `json` is [`FlexRef::json`] of a reference the macro made.
    pub const fn from_json(json: &'static str) -> FlexRef {
        FlexRef(json)
    }

    /// The canonical JSON of the modifiers, which the macro embeds in generated code.
    pub const fn json(self) -> &'static str {
        self.0
    }

    /// The modifiers themselves.
    pub fn get(self) -> Flex {
        self.parsed().clone()
    }

    /// The modifiers, parsed once per process.
    pub fn parsed(self) -> &'static Flex {
        // The CPU references evaluate modifiers per (query, key) pair on every core: a
        // per-thread map keyed by the JSON's address answers them without the lock, which
        // sixteen threads contending for spent most of their time in the kernel.
        thread_local! {
            static NEAR: RefCell<HashMap<(usize, usize), &'static Flex>> =
                RefCell::new(HashMap::new());
        }
        let key = (self.0.as_ptr() as usize, self.0.len());
        if let Some(flex) = NEAR.with(|near| near.borrow().get(&key).copied()) {
            return flex;
        }
        let flex = self.parsed_shared();
        NEAR.with(|near| near.borrow_mut().insert(key, flex));
        flex
    }

    /// [`FlexRef::parsed`] through the process's map, keyed by the JSON's text.
    fn parsed_shared(self) -> &'static Flex {
        type Parsed = HashMap<&'static str, &'static Flex>;
        static PARSED: Mutex<Option<Parsed>> = Mutex::new(None);
        let mut held = PARSED.lock().unwrap_or_else(|e| e.into_inner());
        let held = held.get_or_insert_with(HashMap::new);
        held.entry(self.0).or_insert_with(|| {
            let flex = serde_json::from_str(self.0).expect("a FlexRef holds the JSON of a Flex");
            Box::leak(Box::new(flex))
        })
    }

    /// The same modifiers in kernels that report their first out-of-range read
    /// ([`Flex::report_reads`]).
    pub fn reporting(self) -> FlexRef {
        match self.parsed().report_reads {
            true => self,
            false => Flex {
                report_reads: true,
                ..self.get()
            }
            .intern(),
        }
    }

    /// The same modifiers without the reports: what a caller's values are matched against.
    pub fn plain(self) -> FlexRef {
        match self.parsed().report_reads {
            false => self,
            true => Flex {
                report_reads: false,
                ..self.get()
            }
            .intern(),
        }
    }

    /// The same modifiers in kernels that read a block mask made on the device
    /// ([`Flex::block_mask`]).
    pub fn with_block_mask(self) -> FlexRef {
        match self.parsed().block_mask {
            true => self,
            false => Flex {
                block_mask: true,
                ..self.get()
            }
            .intern(),
        }
    }

    /// Whether two references name the same modifiers, at compile time.
    pub const fn same(a: Option<FlexRef>, b: Option<FlexRef>) -> bool {
        match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => same_str(a.0, b.0),
            _ => false,
        }
    }
}

impl Serialize for FlexRef {
    fn serialize<Ser: serde::Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        self.get().serialize(s)
    }
}

impl TensorDecl {
    /// The element count for a problem of `batch` sequences of `seq` rows and `heads`
    /// query heads.
    pub fn len(&self, batch: u32, heads: u32, seq: u32) -> u64 {
        self.shape(batch, heads, seq)
            .iter()
            .map(|&d| u64::from(d))
            .product()
    }

    /// The shape for a problem of `batch` sequences of `seq` rows and `heads` query heads:
    /// each dimension resolved to its size.
    pub fn shape(&self, batch: u32, heads: u32, seq: u32) -> Vec<u32> {
        self.dims
            .iter()
            .map(|d| match *d {
                Dim::Const(n) => n,
                Dim::Heads => heads,
                Dim::Batch => batch,
                Dim::Seq => seq,
            })
            .collect()
    }

    /// `[heads, 255] f32`, as a description writes it.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self
            .dims
            .iter()
            .map(|d| match d {
                Dim::Const(n) => n.to_string(),
                Dim::Heads => "heads".into(),
                Dim::Batch => "batch".into(),
                Dim::Seq => "seq".into(),
            })
            .collect();
        let grad = if self.grad { " grad" } else { "" };
        format!("[{}] {}{grad}", dims.join(", "), self.ty.name())
    }

    /// The name of its gradient, a backward's output, where declared `grad`.
    pub fn grad_name(&self) -> Option<String> {
        self.grad.then(|| format!("d{}", self.name))
    }

    /// The same tensor declared `grad`.
    pub fn learnable(self) -> TensorDecl {
        TensorDecl { grad: true, ..self }
    }

    /// The tensor element types a description may declare: WGSL storage of f32 or u32
    /// words (an i32 is read as u32 and cast).
    pub fn declarable(ty: Ty) -> bool {
        matches!(ty, Ty::F32 | Ty::U32)
    }
}

impl<S> Expr<S> {
    /// The same tree without its spans.
    pub fn erased(&self) -> Expr {
        use super::Kind;
        let b = |e: &Expr<S>| Box::new(e.erased());
        let all = |v: &[Expr<S>]| v.iter().map(|e| e.erased()).collect();
        let kind = match &self.kind {
            Kind::Lit(l) => Kind::Lit(*l),
            Kind::Var(v) => Kind::Var(v.clone()),
            Kind::Neg(a) => Kind::Neg(b(a)),
            Kind::Not(a) => Kind::Not(b(a)),
            Kind::Bin(op, l, r) => Kind::Bin(*op, b(l), b(r)),
            Kind::Call(f, args) => Kind::Call(*f, all(args)),
            Kind::Cast(a, ty) => Kind::Cast(b(a), *ty),
            Kind::Index(t, idx) => Kind::Index(t.clone(), all(idx)),
            Kind::Let(n, v, body) => Kind::Let(n.clone(), b(v), b(body)),
        };
        Expr { kind, at: () }
    }
}

/// Whether two strings are equal, in a `const` context.
pub const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

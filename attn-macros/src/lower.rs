//! From the parsed description to the IR, keeping the span of every value so that an IR
//! error points at the token that caused it.

use attn_dsl::{
    Cache, DslError, Dtype, Field, Flash, Fp8, Gqa, Grid, KernelSpec, Limits, Major, Masks, Matrix,
    Modifier, Op, Scatter, Source, Target, WriteMode,
};
use proc_macro2::Span;
use syn::Ident;

use crate::parse::{ArgValue, Call, Description, Value};

pub struct Lowered {
    pub spec: KernelSpec,
    /// For a scratch consumer: the producer kernel's module, as written.
    pub producer: Option<syn::Path>,
    spans: Vec<(Field, Span)>,
    name_span: Span,
}

impl Lowered {
    /// An IR error as a compile error at the value it is about.
    /// `err` of a kernel the description implies (`implied`), at the description's target
    /// (else its name): what to change to keep the description and its companions.
    pub fn implied_error(&self, implied: &attn_dsl::KernelSpec, err: DslError) -> syn::Error {
        let span = self
            .spans
            .iter()
            .find(|(f, _)| *f == Field::Target)
            .map_or(self.name_span, |(_, s)| *s);
        let message = format!(
            "a {} implies its {} kernel `{}`, which this target cannot hold: {err}",
            self.spec.op.name(),
            implied.op.name(),
            implied.name,
        );
        syn::Error::new(span, message)
    }

    pub fn error(&self, err: DslError) -> syn::Error {
        let span = err
            .field()
            .and_then(|f| self.spans.iter().find(|(g, _)| g == f).map(|(_, s)| *s))
            .unwrap_or(self.name_span);
        let message = match &err {
            DslError::Spec { .. } => err.to_string(),
            DslError::Wgsl(_) => format!(
                "kernel `{}`: the emitter produced WGSL that naga rejects (a bug in attn-dsl \
                 for this description; please report it with the description):\n{err}",
                self.spec.name
            ),
        };
        syn::Error::new(span, message)
    }
}

pub fn lower(d: &Description) -> syn::Result<Lowered> {
    let mut spans = Vec::new();
    let mut get = |key: &str, field: Field| -> Option<&Value> {
        let entry = d.entries.iter().find(|e| e.key == key)?;
        spans.push((field, entry.value.span()));
        Some(&entry.value)
    };
    let op = op(require(d, get("op", Field::Op), "op")?)?;
    let grid_value = require(d, get("grid", Field::Grid), "grid")?;
    let (mut grid, auto_flash, matrix_span) = grid(grid_value, op.is_row_layer())?;
    // A row-wise layer's row width is `hidden` (carried where attention carries head_dim).
    let (width_key, out_dim) = if op.is_row_layer() {
        if let Some(v) = d.entries.iter().find(|e| e.key == "head_dim_v") {
            return Err(syn::Error::new(
                v.value.span(),
                "head_dim_v is the width of attention's V rows; a row-wise layer's output \
                 width is `out`",
            ));
        }
        let out = require(d, get("out", Field::OutDim), "out")?;
        ("hidden", number(out, "out")?)
    } else {
        // V and O rows `head_dim_v` wide (MLA); 0: as wide as Q and K's.
        let v = get("head_dim_v", Field::HeadDimV).map(|v| number(v, "head_dim_v"));
        ("head_dim", v.transpose()?.unwrap_or(0))
    };
    let head_dim = number(
        require(d, get(width_key, Field::HeadDim), width_key)?,
        width_key,
    )?;
    let out_dim = match op.is_row_layer() || out_dim != head_dim {
        true => out_dim,
        false => 0,
    };
    // The flash configurations are laid out for the wider of the two rows.
    let width = if out_dim != 0 && !op.is_row_layer() {
        head_dim.max(out_dim)
    } else {
        head_dim
    };
    let gqa = get("gqa", Field::Gqa)
        .map(gqa)
        .transpose()?
        .unwrap_or(Gqa::Any);
    let mut mask_spans = Vec::new();
    let masks = get("masks", Field::Masks)
        .map(|v| masks(v, &mut mask_spans))
        .transpose()?
        .unwrap_or_default();
    let masks = with_modifiers(masks, &mut get)?;
    let target = get("target", Field::Target)
        .map(target)
        .transpose()?
        .unwrap_or(Target::Webgpu);
    // `workgroup_size: head_dim`: one invocation per element of a row, whatever the head_dim
    // of a `head_dim: [..]` list.
    let given_workgroup_size = get("workgroup_size", Field::WorkgroupSize)
        .map(|v| match v {
            Value::Word(w) if w == "head_dim" => Ok(width),
            v => number(v, "workgroup_size"),
        })
        .transpose()?;
    let mut workgroup_size = given_workgroup_size.unwrap_or(256);
    if auto_flash && op != Op::DecodeSplit {
        let config =
            attn_dsl::configs::for_description(op, width, &target.limits(), given_workgroup_size)
                .ok_or_else(|| {
                syn::Error::new(
                    grid_value.span(),
                    format!(
                        "no flash configuration of op {} fits head_dim {width} under this \
                     target{}; use the per-row grid (`tile = 1`), a `native(..)` target with \
                     more workgroup memory, or another head_dim",
                        op.name(),
                        given_workgroup_size
                            .map_or(String::new(), |wg| format!(" with workgroup_size {wg}"))
                    ),
                )
            })?;
        grid.tile = config.tile;
        grid.flash = Some(Flash {
            inner: config.inner,
            rows_per_thread: config.rows_per_thread,
        });
        workgroup_size = config.workgroup_size;
    }
    let dtype = get("dtype", Field::Dtype)
        .map(dtype)
        .transpose()?
        .unwrap_or_default();
    let (source, producer) = match get("source", Field::Source) {
        Some(v) => source(v)?,
        None => (Source::default(), None),
    };
    let cache = get("cache", Field::Cache)
        .map(cache)
        .transpose()?
        .unwrap_or_default();
    let kv_fp8 = get("kv_cache", Field::Cache).map(kv_cache).transpose()?;
    let writes_value = require(d, get("writes", Field::Write(String::new())), "writes")?;
    spans.extend(mask_spans);
    let writes = writes(writes_value, &mut spans)?;
    let spec = KernelSpec {
        name: d.name.to_string(),
        op,
        grid,
        head_dim,
        out_dim,
        gqa,
        masks,
        target,
        dtype,
        workgroup_size,
        writes,
        source,
        scatter: Scatter::Cas,
        cache,
        kv_fp8,
        matmul: None,
        // An instrument the runtime's bench builds; a description never asks for it.
        counts_residency: false,
    };
    let mut spec = spec;
    if auto_flash && op == Op::DecodeSplit {
        // The streamed pass's layout follows the widths and dtypes; its key groups sum by
        // subgroup shuffles where the target is native.
        spec.grid.subgroups = spec.target != Target::Webgpu;
        spec.grid.flash = Some(attn_dsl::layout::decode::stream_flash(&spec));
    }
    spans.extend(matrix_span.map(|span| (Field::Matrix, span)));
    Ok(Lowered {
        spec,
        producer,
        spans,
        name_span: d.name.span(),
    })
}

/// `masks` with the description's `tensors`, `score_mod` and `mask_mod`, if it has any.
fn with_modifiers<'a>(
    masks: Masks,
    get: &mut impl FnMut(&str, Field) -> Option<&'a Value>,
) -> syn::Result<Masks> {
    let tensors = match get("tensors", Field::Flex("tensors")) {
        Some(Value::Tensors(items, _)) => crate::flex::tensors(items)?,
        Some(other) => return err(other.span(), "`tensors` takes `{ name: [dims] f32, .. }`"),
        None => Vec::new(),
    };
    let mut closure = |key: &'static str, score: bool| -> syn::Result<_> {
        match get(key, Field::Flex(key)) {
            Some(Value::Closure(c)) => {
                Ok(Some(crate::flex::modifier(c, score, &tensors)?.erased()))
            }
            Some(other) => err(other.span(), format!("`{key}` takes a closure")),
            None => Ok(None),
        }
    };
    let score_mod = closure("score_mod", true)?;
    let mask_mod = closure("mask_mod", false)?;
    if let Some(Value::Tensors(items, _)) = get("tensors", Field::Flex("tensors")) {
        for (item, t) in items.iter().zip(&tensors) {
            let read = score_mod
                .as_ref()
                .is_some_and(|e| e.mentions_tensor(&t.name));
            if let Some(grad) = item.grad.as_ref().filter(|_| !read) {
                return err(
                    grad.span(),
                    format!(
                        "`{}` is declared `grad`, but score_mod does not read it: a gradient \
                         reaches only what the score depends on; drop `grad`",
                        t.name
                    ),
                );
            }
        }
    }
    let block_mask = match get("block_mask", Field::Flex("block_mask")) {
        Some(Value::Word(w)) if w == "device" => true,
        Some(other) => {
            return err(
                other.span(),
                "`block_mask` takes `device`: the kernels read a block mask of the mask_mod \
                 made on the device (`op: block_mask`)",
            );
        }
        None => false,
    };
    if let Some(v) = get("block_mask", Field::Flex("block_mask")).filter(|_| mask_mod.is_none()) {
        return err(
            v.span(),
            "`block_mask` is made from the description's mask_mod, and it has none: add a \
             mask_mod or drop `block_mask`",
        );
    }
    if score_mod.is_none() && mask_mod.is_none() && tensors.is_empty() {
        return Ok(masks);
    }
    let flex = attn_dsl::flex::Flex {
        score_mod,
        mask_mod,
        tensors,
        report_reads: false,
        block_mask,
    };
    Ok(Masks {
        flex: Some(flex.intern()),
        ..masks
    })
}

fn require<'a>(d: &Description, v: Option<&'a Value>, key: &str) -> syn::Result<&'a Value> {
    v.ok_or_else(|| {
        syn::Error::new(
            d.name.span(),
            format!(
                "kernel `{}` is missing `{key}`; add e.g. `{key}: {}`",
                d.name,
                example(key)
            ),
        )
    })
}

fn example(key: &str) -> &'static str {
    match key {
        "op" => "forward",
        "grid" => "s_major(tile = 1)",
        "head_dim" => "64",
        "hidden" => "768",
        "out" => "3072",
        _ => "{ o: owned }",
    }
}

fn err<T>(span: Span, message: impl Into<String>) -> syn::Result<T> {
    Err(syn::Error::new(span, message.into()))
}

fn word<'a>(v: &'a Value, what: &str, expected: &str) -> syn::Result<&'a Ident> {
    match v {
        Value::Word(w) => Ok(w),
        other => err(other.span(), format!("`{what}` takes a word: {expected}")),
    }
}

fn number(v: &Value, what: &str) -> syn::Result<u32> {
    match v {
        Value::Number(n) => Ok(n.value),
        other => err(
            other.span(),
            format!("`{what}` takes a whole number, e.g. `{what}: 64`"),
        ),
    }
}

fn op(v: &Value) -> syn::Result<Op> {
    let names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
    let w = word(v, "op", &names.join(" | "))?;
    Op::ALL.into_iter().find(|o| w == o.name()).map_or_else(
        || {
            err(
                w.span(),
                format!("unknown op `{w}`; expected one of: {}", names.join(", ")),
            )
        },
        Ok,
    )
}

/// The grid, whether it asks for the flash configuration the rules pick
/// (`s_major(flash)`), which depends on the op, head_dim and target lowered after it, and
/// where its `matrix` argument is (the flash schedule's, or a row layer's GEMMs').
fn grid(v: &Value, row_layer: bool) -> syn::Result<(Grid, bool, Option<Span>)> {
    const EXPECTED: &str = "s_major(tile = N), j_major(tile = N), s_major(flash), \
                            j_major(flash), head_major, slice_major(tile = N), r_major(tile = N) or elementwise";
    let (name, args) = match v {
        Value::Word(w) => (w, &[][..]),
        Value::Call(Call {
            name,
            path: Some(path),
            ..
        }) => {
            if !path.is_ident("flash") {
                return err(
                    name.span(),
                    format!(
                        "`{name}(..)` takes `flash` or `key = N` arguments; expected {EXPECTED}"
                    ),
                );
            }
            let major = match name.to_string().as_str() {
                "s_major" => Major::S,
                "j_major" => Major::J,
                // Split-K decode's streamed pass: key groups, each an online softmax.
                "slice_major" => {
                    let heads = attn_dsl::layout::decode::MAX_SPLIT_HEADS;
                    return Ok((Grid::rows(Major::Slice, heads), true, None));
                }
                _ => {
                    return err(
                        name.span(),
                        format!("`{name}` has no flash schedule; expected {EXPECTED}"),
                    );
                }
            };
            return Ok((Grid::rows(major, 1), true, None));
        }
        Value::Call(Call { name, args, .. }) => (name, args.as_slice()),
        other => return err(other.span(), format!("`grid` takes {EXPECTED}")),
    };
    let (major, inner_key) = match name.to_string().as_str() {
        "s_major" => (Major::S, "key_tile"),
        "j_major" => (Major::J, "query_tile"),
        "head_major" => (Major::Head, "key_tile"),
        // Split-K decode: `tile` is the query heads of one KV head a workgroup serves; the
        // streamed pass takes `key_tile` keys per step, `rows_per_thread` per key group.
        "slice_major" => (Major::Slice, "key_tile"),
        // Row-wise layers: no inner axis to stage, so no flash arguments.
        "r_major" => (Major::R, "-"),
        "elementwise" => (Major::Elem, "-"),
        _ => {
            return err(
                name.span(),
                format!("unknown grid `{name}`; expected {EXPECTED}"),
            );
        }
    };
    let (mut tile, mut inner, mut rows, mut subgroups) = (1, None, None, None);
    let mut matrix = None;
    let (mut pack_heads, mut ragged) = (false, false);
    for (key, v) in args {
        match key.to_string().as_str() {
            "tile" => tile = arg_number(key, v)?,
            k if k == inner_key => inner = Some(arg_number(key, v)?),
            "rows_per_thread" => rows = Some(arg_number(key, v)?),
            "subgroups" => subgroups = Some((arg_flag(key, v)?, key.span())),
            "matrix" => matrix = Some((arg_matrix(key, v)?, key.span())),
            "pack_heads" => pack_heads = arg_flag(key, v)?,
            "ragged" => ragged = arg_flag(key, v)?,
            _ => {
                return err(
                    key.span(),
                    format!(
                        "unknown grid argument `{key}`; expected `tile`, and for the flash \
                         schedule `{inner_key}`, `rows_per_thread`, `subgroups`, `matrix` and \
                         (a continued cache's chunk) `pack_heads` and `ragged`; `slice_major` \
                         also takes `subgroups`"
                    ),
                );
            }
        }
    }
    let flash = match (inner, rows) {
        (None, None) => None,
        (Some(inner), Some(rows_per_thread)) => Some(Flash {
            inner,
            rows_per_thread,
        }),
        _ => {
            return err(
                name.span(),
                format!(
                    "the flash schedule takes both `{inner_key}` and `rows_per_thread`, \
                     e.g. `{name}(tile = 32, {inner_key} = 32, rows_per_thread = 4)`"
                ),
            );
        }
    };
    // The staged split pass sums a key's lanes across invocations: it has the choice too.
    if let (None, Some((_, span)), false) = (flash, subgroups, major == Major::Slice) {
        return err(
            span,
            format!(
                "`subgroups` chooses how the flash schedule reduces its rows; the per-row \
                 grid has no such choice. Add `{inner_key}` and `rows_per_thread`, or drop it"
            ),
        );
    }
    if let (None, Some((_, span)), false) = (flash, matrix, row_layer) {
        return err(
            span,
            format!(
                "`matrix` chooses how the flash schedule multiplies its tiles; the per-row \
                 grid has no such choice. Add `{inner_key}` and `rows_per_thread`, or drop it"
            ),
        );
    }
    Ok((
        Grid {
            major,
            tile,
            flash,
            matrix: matrix.map_or(Matrix::Scalar, |(m, _)| m),
            pack_heads,
            ragged,
            subgroups: subgroups.is_some_and(|(on, _)| on),
        },
        false,
        matrix.map(|(_, span)| span),
    ))
}

fn arg_matrix(key: &Ident, v: &ArgValue) -> syn::Result<Matrix> {
    let expected = format!("`{key}` takes `scalar` or `coop16`");
    match v {
        ArgValue::Word(w) => {
            Matrix::parse(&w.to_string()).ok_or_else(|| syn::Error::new(w.span(), expected))
        }
        ArgValue::Number(n) => err(n.span, expected),
        ArgValue::Flag(b) => err(b.span, expected),
    }
}

fn arg_number(key: &Ident, v: &ArgValue) -> syn::Result<u32> {
    match v {
        ArgValue::Number(n) => Ok(n.value),
        ArgValue::Flag(b) => err(b.span, format!("`{key}` takes a number, not `{}`", b.value)),
        ArgValue::Word(w) => err(w.span(), format!("`{key}` takes a number, not `{w}`")),
    }
}

fn arg_flag(key: &Ident, v: &ArgValue) -> syn::Result<bool> {
    match v {
        ArgValue::Flag(b) => Ok(b.value),
        ArgValue::Number(n) => err(n.span, format!("`{key}` takes `true` or `false`")),
        ArgValue::Word(w) => err(w.span(), format!("`{key}` takes `true` or `false`")),
    }
}

fn gqa(v: &Value) -> syn::Result<Gqa> {
    match v {
        Value::Number(n) => Ok(Gqa::Ratio(n.value)),
        Value::Word(w) if w == "any" => Ok(Gqa::Any),
        other => err(
            other.span(),
            "`gqa` takes `any` or the number of query heads per KV head",
        ),
    }
}

fn masks(v: &Value, spans: &mut Vec<(Field, Span)>) -> syn::Result<Masks> {
    let items = match v {
        Value::List(items, _) => items.as_slice(),
        Value::Word(w) if w == "none" => &[],
        other => {
            return err(
                other.span(),
                "`masks` takes a list such as `[causal, document]`, or `none`",
            );
        }
    };
    let mut masks = Masks::default();
    for m in items {
        let Some(modifier) = Modifier::parse(&m.to_string()) else {
            return err(
                m.span(),
                format!("unknown mask `{m}`; expected {}", Modifier::expected()),
            );
        };
        if masks.has(modifier) {
            return err(m.span(), format!("mask `{m}` is listed twice"));
        }
        if let Some(other) = modifier.excludes().filter(|o| masks.has(*o)) {
            return err(
                m.span(),
                format!(
                    "mask `{m}` is listed beside `{}`; a kernel takes one bias: `bias` \
                     ([batch, heads, seq, seq]) or `shared_bias` ([batch, 1, seq, seq])",
                    other.word()
                ),
            );
        }
        masks = masks.with(modifier);
        spans.push((Field::Mask(modifier.word().to_string()), m.span()));
    }
    Ok(masks)
}

fn target(v: &Value) -> syn::Result<Target> {
    const EXPECTED: &str = "`webgpu` or `native(workgroup_storage = N, storage_buffers = N, \
                            uniform_buffers = N, invocations = N)`";
    match v {
        Value::Word(w) if w == "webgpu" => Ok(Target::Webgpu),
        Value::Call(Call { name, args, .. }) if name == "native" => {
            // Limits not stated stay at WebGPU's defaults, the floor every adapter meets.
            let mut limits = Limits::WEBGPU;
            for (key, v) in args {
                let slot = match key.to_string().as_str() {
                    "workgroup_storage" => &mut limits.workgroup_storage_bytes,
                    "storage_buffers" => &mut limits.storage_buffers_per_stage,
                    "uniform_buffers" => &mut limits.uniform_buffers_per_stage,
                    "invocations" => &mut limits.invocations_per_workgroup,
                    _ => {
                        return err(
                            key.span(),
                            format!("unknown limit `{key}`; `target` takes {EXPECTED}"),
                        );
                    }
                };
                *slot = arg_number(key, v)?;
            }
            Ok(Target::Native(limits))
        }
        other => err(other.span(), format!("`target` takes {EXPECTED}")),
    }
}

fn cache(v: &Value) -> syn::Result<Cache> {
    let w = word(v, "cache", "contiguous | paged")?;
    match w.to_string().as_str() {
        "contiguous" => Ok(Cache::Contiguous),
        "paged" => Ok(Cache::Paged),
        _ => err(
            w.span(),
            format!("unknown cache layout `{w}`; expected `contiguous` or `paged`"),
        ),
    }
}

/// `kv_cache: e4m3 | e5m2`: a KV cache of 8-bit floats (absent: the kernel's dtype).
fn kv_cache(v: &Value) -> syn::Result<Fp8> {
    let w = word(v, "kv_cache", "e4m3 | e5m2")?;
    Fp8::parse(&w.to_string()).ok_or_else(|| {
        syn::Error::new(
            w.span(),
            format!("unknown KV cache format `{w}`; expected `e4m3` or `e5m2`"),
        )
    })
}

fn source(v: &Value) -> syn::Result<(Source, Option<syn::Path>)> {
    match v {
        Value::Word(w) if w == "recompute" => Ok((Source::Recompute, None)),
        Value::Word(w) if w == "scratch" => err(
            w.span(),
            "a scratch consumer must name its producer, the kernel that flushes the scratch: \
             `source: scratch(attention_backward_short)`",
        ),
        Value::Call(Call {
            name,
            path: Some(path),
            ..
        }) if name == "scratch" => Ok((Source::Scratch, Some(path.clone()))),
        other => err(
            other.span(),
            "`source` takes `recompute` or `scratch(PRODUCER)`",
        ),
    }
}

fn dtype(v: &Value) -> syn::Result<Dtype> {
    match v {
        Value::Word(w) => Dtype::parse(&w.to_string())
            .ok_or_else(|| syn::Error::new(w.span(), "`dtype` takes `f32`, `f16` or `bf16`")),
        other => err(other.span(), "`dtype` takes `f32`, `f16` or `bf16`"),
    }
}

fn writes(v: &Value, spans: &mut Vec<(Field, Span)>) -> syn::Result<Vec<(String, WriteMode)>> {
    let Value::Map(items, _) = v else {
        return err(
            v.span(),
            "`writes` takes `{ name: owned | atomic | scratch, .. }`",
        );
    };
    let mut out: Vec<(String, WriteMode)> = Vec::new();
    for (name, mode) in items {
        let mode = match mode.to_string().as_str() {
            "owned" => WriteMode::Owned,
            "atomic" => WriteMode::AtomicScatter,
            "scratch" => WriteMode::ScratchFlush,
            _ => {
                return err(
                    mode.span(),
                    format!("unknown write mode `{mode}`; expected `owned`, `atomic` or `scratch`"),
                );
            }
        };
        if out.iter().any(|(n, _)| name == n) {
            return err(name.span(), format!("`{name}` is listed twice in `writes`"));
        }
        spans.push((Field::Write(name.to_string()), name.span()));
        out.push((name.to_string(), mode));
    }
    Ok(out)
}

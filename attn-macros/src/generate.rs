//! The Rust a description expands to: one module holding the WGSL, its ABI as a `const`,
//! `Pod` uniform structs, a bindings struct with one field per binding, and the grid.

use attn_dsl::{Access, Axis, Binding, Gqa, KernelAbi, Major, Op, Scalar, Target, WriteMode};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;

use crate::lower::Lowered;
use crate::parse::Description;

pub fn module(
    d: &Description,
    abi: &KernelAbi,
    native: Option<&KernelAbi>,
    contract: TokenStream,
) -> TokenStream {
    let attrs = &d.attrs;
    let vis = &d.vis;
    let name = &d.name;
    let name_str = abi.name.as_ref();
    let wgsl = abi.wgsl.as_ref();
    let entry = abi.entry_point.as_ref();
    let [wx, wy, wz] = abi.workgroup_size.map(Literal::u32_unsuffixed);
    let head_dim = Literal::u32_unsuffixed(abi.head_dim);
    let head_dim_v = Literal::u32_unsuffixed(abi.head_dim_v());
    let tile = Literal::u32_unsuffixed(abi.grid.tile);
    let abi_item = abi_const(abi, quote!(WGSL));
    let native_items = native.map(|n| {
        let wgsl = n.wgsl.as_ref();
        let abi = abi_const(n, quote!(WGSL_F32_ATOMIC));
        quote! {
            /// The same kernel with native `atomic<f32>` adds for its scatter outputs; needs
            /// the SHADER_FLOAT32_ATOMIC feature. Its bindings are those of [`Bindings`].
            pub const WGSL_F32_ATOMIC: &str = #wgsl;
            /// [`ABI`] for [`WGSL_F32_ATOMIC`]: what a host binds and dispatches where the
            /// adapter has native f32 atomics.
            pub static ABI_F32_ATOMIC: ::attn_dsl::KernelAbi = #abi;
        }
    });
    let uniforms = abi
        .bindings
        .iter()
        .filter(|b| b.access == Access::Uniform)
        .map(|b| uniform_struct(abi.op, b));
    let bindings = bindings_struct(abi);
    let grid = dispatch_grid(abi);
    // A description without a doc comment still expands to a documented module.
    let module_doc = (!attrs.iter().any(|a| a.path().is_ident("doc"))).then(|| {
        let doc = format!(
            "The `{name_str}` kernel (`op: {}`): its WGSL, ABI, bindings and pipeline.",
            abi.op.name()
        );
        quote!(#[doc = #doc])
    });
    quote! {
        #module_doc
        #(#attrs)*
        #[allow(clippy::all)]
        #vis mod #name {
            /// The kernel's WGSL, validated by naga when this module was expanded.
            pub const WGSL: &str = #wgsl;
            /// The kernel's name: the label of its wgpu objects and the name errors give.
            pub const NAME: &str = #name_str;
            /// The WGSL compute entry point the pipeline runs.
            pub const ENTRY_POINT: &str = #entry;
            /// Invocations per workgroup (x, y, z), as the WGSL's `@workgroup_size`.
            pub const WORKGROUP_SIZE: [u32; 3] = [#wx, #wy, #wz];
            /// The head dimension this kernel is specialized for (of Q and K).
            pub const HEAD_DIM: u32 = #head_dim;
            /// The width of V and O rows: `head_dim_v` where the description sets it.
            pub const HEAD_DIM_V: u32 = #head_dim_v;
            /// Rows of the major axis per workgroup.
            pub const TILE: u32 = #tile;
            /// Everything a host needs to bind and dispatch this kernel, from the same plan
            /// as the WGSL.
            pub static ABI: ::attn_dsl::KernelAbi = #abi_item;
            #native_items
            #contract

            #(#uniforms)*
            #bindings
            #grid

            /// Compiles the kernel on `device`: its bind-group layout and compute pipeline.
            pub fn create_pipeline(
                device: &::wgpu::Device,
            ) -> (::wgpu::BindGroupLayout, ::wgpu::ComputePipeline) {
                let layout = Bindings::layout(device);
                let module = device.create_shader_module(::wgpu::ShaderModuleDescriptor {
                    label: ::core::option::Option::Some(NAME),
                    source: ::wgpu::ShaderSource::Wgsl(WGSL.into()),
                });
                let pipeline_layout =
                    device.create_pipeline_layout(&::wgpu::PipelineLayoutDescriptor {
                        label: ::core::option::Option::Some(NAME),
                        bind_group_layouts: &[::core::option::Option::Some(&layout)],
                        immediate_size: 0,
                    });
                let pipeline =
                    device.create_compute_pipeline(&::wgpu::ComputePipelineDescriptor {
                        label: ::core::option::Option::Some(NAME),
                        layout: ::core::option::Option::Some(&pipeline_layout),
                        module: &module,
                        entry_point: ::core::option::Option::Some(ENTRY_POINT),
                        compilation_options: ::core::default::Default::default(),
                        cache: ::core::option::Option::None,
                    });
                (layout, pipeline)
            }
        }
    }
}

/// The scratch contract: a producer publishes what it flushes as `SCRATCH`; a consumer
/// states what it reads as `READS_SCRATCH` and asserts, in a `const` that rustc evaluates,
/// that its producer's `SCRATCH` matches. A producer that does not exist, or flushes no
/// scratch, fails to resolve at the name the description gives.
pub fn scratch_contract(lowered: &Lowered, abi: &KernelAbi) -> TokenStream {
    let scratch = |b: &Binding| {
        let tensor = b.name.as_ref();
        let layout = b.layout.iter().map(|a| axis(*a));
        let masks = masks_tokens(&abi.masks);
        quote!(::attn_dsl::contract::Scratch {
            tensor: #tensor,
            layout: &[#(::attn_dsl::Axis::#layout),*],
            masks: #masks,
        })
    };
    let mut out = TokenStream::new();
    if let Some(b) = abi
        .bindings
        .iter()
        .find(|b| b.write == Some(WriteMode::ScratchFlush))
    {
        let value = scratch(b);
        out.extend(quote! {
            /// The scratch this kernel flushes, for the kernels that read it.
            pub const SCRATCH: ::attn_dsl::contract::Scratch = #value;
        });
    }
    let read = abi.bindings.iter().find(|b| {
        b.access == Access::Read && attn_dsl::signature::is_scratch_read(b.name.as_ref())
    });
    if let (Some(b), Some(producer)) = (read, &lowered.producer) {
        let value = scratch(b);
        let relative = producer.leading_colon.is_none()
            && !["crate", "super", "self"]
                .iter()
                .any(|k| producer.segments[0].ident == k);
        let path = if relative {
            quote!(super::#producer)
        } else {
            quote!(#producer)
        };
        let message = format!(
            "kernel `{}` reads the scratch of `{}`, which flushes another layout or under other \
             masks; describe both kernels with the same masks",
            abi.name,
            quote!(#producer).to_string().replace(' ', "")
        );
        let check = quote_spanned! {producer.span()=>
            const _: () = ::core::assert!(
                ::attn_dsl::contract::compatible(&#path::SCRATCH, &READS_SCRATCH),
                #message
            );
        };
        out.extend(quote! {
            /// The scratch this kernel reads, checked against its producer's at compile time.
            pub const READS_SCRATCH: ::attn_dsl::contract::Scratch = #value;
            #check
        });
    }
    out
}

fn axis(a: Axis) -> TokenStream {
    match a {
        Axis::B => quote!(B),
        Axis::S => quote!(S),
        Axis::J => quote!(J),
        Axis::H => quote!(H),
        Axis::KvH => quote!(KvH),
        Axis::D => quote!(D),
        Axis::Part => quote!(Part),
        Axis::R => quote!(R),
        Axis::RowTile => quote!(RowTile),
        Axis::K => quote!(K),
        Axis::N => quote!(N),
        Axis::Slice => quote!(Slice),
        Axis::Page => quote!(Page),
    }
}

fn abi_const(abi: &KernelAbi, wgsl: TokenStream) -> TokenStream {
    let name = abi.name.as_ref();
    let op = match abi.op {
        Op::Forward => quote!(Forward),
        Op::Decode => quote!(Decode),
        Op::DecodeSplit => quote!(DecodeSplit),
        Op::DecodeReduce => quote!(DecodeReduce),
        Op::BackwardPrep => quote!(BackwardPrep),
        Op::BackwardQ => quote!(BackwardQ),
        Op::BackwardKv => quote!(BackwardKv),
        Op::Rope => quote!(Rope),
        Op::RopeBackward => quote!(RopeBackward),
        Op::LayernormLinear => quote!(LayernormLinear),
        Op::LayernormLinearBackward => quote!(LayernormLinearBackward),
        Op::LayernormLinearWeightGrad => quote!(LayernormLinearWeightGrad),
        Op::LayernormLinearReduce => quote!(LayernormLinearReduce),
        Op::CacheAppend => quote!(CacheAppend),
        Op::DkvReduce => quote!(DkvReduce),
        Op::ToDtype => quote!(ToDtype),
        Op::FromDtype => quote!(FromDtype),
        Op::GradFold => quote!(GradFold),
        Op::RowScale => quote!(RowScale),
        Op::SinkGrad => quote!(SinkGrad),
        Op::Merge => quote!(Merge),
        Op::LayernormRows => quote!(LayernormRows),
        Op::LayernormGradRows => quote!(LayernormGradRows),
        Op::LayernormRowsBackward => quote!(LayernormRowsBackward),
        Op::Matmul => quote!(Matmul),
        Op::LinearRows => quote!(LinearRows),
        Op::Extend => quote!(Extend),
        Op::BlockMask => quote!(BlockMask),
    };
    let f32_atomics = abi.f32_atomics;
    let [wx, wy, wz] = abi.workgroup_size;
    let major = major(abi.grid.major);
    let tile = abi.grid.tile;
    let flash = match abi.grid.flash {
        None => quote!(::core::option::Option::None),
        Some(f) => {
            let (inner, rows) = (f.inner, f.rows_per_thread);
            quote!(::core::option::Option::Some(::attn_dsl::Flash {
                inner: #inner, rows_per_thread: #rows,
            }))
        }
    };
    let (pack_heads, ragged, subgroups) =
        (abi.grid.pack_heads, abi.grid.ragged, abi.grid.subgroups);
    let matrix = match abi.grid.matrix {
        attn_dsl::Matrix::Scalar => quote!(::attn_dsl::Matrix::Scalar),
        attn_dsl::Matrix::Coop16 => quote!(::attn_dsl::Matrix::Coop16),
    };
    let head_dim = abi.head_dim;
    let gqa = match abi.gqa {
        Gqa::Any => quote!(::attn_dsl::Gqa::Any),
        Gqa::Ratio(r) => quote!(::attn_dsl::Gqa::Ratio(#r)),
    };
    let masks = masks_tokens(&abi.masks);
    let target = match abi.target {
        Target::Webgpu => quote!(::attn_dsl::Target::Webgpu),
        Target::Native(l) => {
            let (ws, sb, ub, inv) = (
                l.workgroup_storage_bytes,
                l.storage_buffers_per_stage,
                l.uniform_buffers_per_stage,
                l.invocations_per_workgroup,
            );
            quote!(::attn_dsl::Target::Native(::attn_dsl::Limits {
                workgroup_storage_bytes: #ws, storage_buffers_per_stage: #sb,
                uniform_buffers_per_stage: #ub, invocations_per_workgroup: #inv,
            }))
        }
    };
    let wg_bytes = abi.workgroup_storage_bytes;
    let out_dim = abi.out_dim;
    let bindings = abi.bindings.iter().map(binding_const);
    quote! {
        ::attn_dsl::KernelAbi {
            name: ::std::borrow::Cow::Borrowed(#name),
            op: ::attn_dsl::Op::#op,
            entry_point: ::std::borrow::Cow::Borrowed(ENTRY_POINT),
            workgroup_size: [#wx, #wy, #wz],
            grid: ::attn_dsl::Grid {
                major: #major,
                tile: #tile,
                flash: #flash,
                matrix: #matrix,
                pack_heads: #pack_heads,
                ragged: #ragged,
                subgroups: #subgroups,
            },
            head_dim: #head_dim,
            out_dim: #out_dim,
            gqa: #gqa,
            masks: #masks,
            target: #target,
            f32_atomics: #f32_atomics,
            workgroup_storage_bytes: #wg_bytes,
            bindings: ::std::borrow::Cow::Borrowed(&[#(#bindings),*]),
            wgsl: ::std::borrow::Cow::Borrowed(#wgsl),
        }
    }
}

fn major(m: Major) -> TokenStream {
    match m {
        Major::S => quote!(::attn_dsl::Major::S),
        Major::J => quote!(::attn_dsl::Major::J),
        Major::Head => quote!(::attn_dsl::Major::Head),
        Major::Slice => quote!(::attn_dsl::Major::Slice),
        Major::R => quote!(::attn_dsl::Major::R),
        Major::Elem => quote!(::attn_dsl::Major::Elem),
    }
}

fn binding_const(b: &Binding) -> TokenStream {
    let (group, index, name, ty) = (b.group, b.binding, b.name.as_ref(), b.wgsl_type.as_ref());
    let access = match b.access {
        Access::Read => quote!(Read),
        Access::ReadWrite => quote!(ReadWrite),
        Access::Uniform => quote!(Uniform),
    };
    let scalar = match b.scalar {
        Scalar::F32 => quote!(F32),
        Scalar::U32 => quote!(U32),
        Scalar::F16 => quote!(F16),
        Scalar::Bf16 => quote!(Bf16),
        Scalar::E4m3 => quote!(E4m3),
        Scalar::E5m2 => quote!(E5m2),
    };
    let fields = b.fields.iter().map(|f| f.as_ref());
    let layout = b.layout.iter().map(|a| axis(*a));
    let write = match b.write {
        None => quote!(::core::option::Option::None),
        Some(WriteMode::Owned) => {
            quote!(::core::option::Option::Some(::attn_dsl::WriteMode::Owned))
        }
        Some(WriteMode::AtomicScatter) => {
            quote!(::core::option::Option::Some(
                ::attn_dsl::WriteMode::AtomicScatter
            ))
        }
        Some(WriteMode::ScratchFlush) => {
            quote!(::core::option::Option::Some(
                ::attn_dsl::WriteMode::ScratchFlush
            ))
        }
    };
    quote! {
        ::attn_dsl::Binding {
            group: #group,
            binding: #index,
            name: ::std::borrow::Cow::Borrowed(#name),
            access: ::attn_dsl::Access::#access,
            scalar: ::attn_dsl::Scalar::#scalar,
            wgsl_type: ::std::borrow::Cow::Borrowed(#ty),
            fields: ::std::borrow::Cow::Borrowed(&[#(::std::borrow::Cow::Borrowed(#fields)),*]),
            layout: ::std::borrow::Cow::Borrowed(&[#(::attn_dsl::Axis::#layout),*]),
            write: #write,
        }
    }
}

fn scalar_type(s: Scalar) -> TokenStream {
    match s {
        Scalar::F32 => quote!(f32),
        // Uniform blocks hold f32 or u32 only; the 16-bit scalars name storage elements.
        Scalar::U32 | Scalar::F16 | Scalar::Bf16 | Scalar::E4m3 | Scalar::E5m2 => quote!(u32),
    }
}

fn uniform_struct(op: Op, b: &Binding) -> TokenStream {
    let ident = format_ident!("{}", b.wgsl_type.as_ref());
    let ty = scalar_type(b.scalar);
    let fields = b.fields.iter().map(|f| {
        let doc = field_doc(op, f);
        let f = format_ident!("{}", f.as_ref());
        quote!(#[doc = #doc] pub #f: #ty)
    });
    let doc = format!(
        "The `{}` uniform (binding {}), laid out as the WGSL struct.",
        b.name, b.binding
    );
    quote! {
        #[doc = #doc]
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, ::bytemuck::Pod, ::bytemuck::Zeroable)]
        pub struct #ident {
            #(#fields,)*
        }
    }
}

/// The doc of a uniform field: what the kernel reads it as under `op` (the field lists
/// are `attn_dsl::signature::dims` and the `params` blocks).
fn field_doc(op: Op, field: &str) -> &'static str {
    let rows = op.is_row_layer();
    match (op, field) {
        (_, f) if f.starts_with("_pad") => {
            "Unread padding: WGSL sizes uniform blocks in multiples of 16 bytes."
        }
        // `params`.
        (_, "scale") => "The factor on Q·K before the softmax (usually 1/sqrt(head_dim)).",
        (_, "softcap") => "The soft-cap c of `masks: [softcap]`: each score s becomes c·tanh(s/c).",
        (_, "dropout_scale") => "What dropout multiplies a kept probability by: 1 / (1 - p).",
        (_, "eps") => "LayerNorm's epsilon, added to each row's variance before its square root.",
        // The attention ops' `dims`.
        (Op::Extend, "seq_len") => "New query rows of each sequence.",
        (Op::BlockMask, "seq_len") => {
            "Positions a side of the mask (a sequence, or a cache's capacity)."
        }
        (_, "seq_len") => "Rows of each sequence.",
        (Op::Rope | Op::RopeBackward, "n_heads") => {
            "Heads of each token rotated: Q's (or K's) alone, or Q's and K's together."
        }
        (Op::Rope | Op::RopeBackward, "n_kv_heads") => {
            "Of those, the heads of a second tensor after the first in x's buffer (K's after \
             Q's, as a fused projection's parts lie); 0: none."
        }
        (_, "second_at") => "Where the second tensor's rows start: head rows from x's start.",
        (_, "n_heads") => "Query heads.",
        (_, "n_kv_heads") => "K and V heads; each serves n_heads / n_kv_heads query heads.",
        (Op::Rope | Op::RopeBackward, "head_dim") => {
            "Elements of each head's row, rotated in pairs."
        }
        (Op::Merge, "head_dim") => "Elements of each merged O row.",
        (_, "head_dim") => "Elements of each head's Q and K row.",
        (_, "batch") => "Sequences in the call.",
        (_, "window") => {
            "The width W of `masks: [window]`: query s sees keys j with s - W < j <= s."
        }
        (_, "seed_lo") => "The low word of dropout's Philox key (the seed).",
        (_, "seed_hi") => "The high word of dropout's Philox key (the seed).",
        (_, "rng_offset") => {
            "Dropout's Philox counter word: a call with another offset draws a fresh mask."
        }
        (_, "drop_threshold") => "p·2^32: dropout drops an element whose Philox word is below it.",
        (Op::Decode, "cache_len") => "Keys in the cache, the same for every sequence.",
        (_, "cache_len") => {
            "Keys of the longest sequence in the cache; `seq_lens` holds each one's."
        }
        (_, "capacity") => "Rows a contiguous cache holds per slot: the stride between slots.",
        (_, "page_size") => "Keys per page of a paged cache.",
        (_, "pages_per_seq") => "Pages per sequence: the length of a block-table row.",
        (_, "slice_len") => "Keys per split-K slice, a multiple of the split kernel's key tile.",
        (Op::SinkGrad, "n_slices") => "Blocks of rows, each summed by one workgroup of pass 0.",
        (_, "n_slices") => "Split-K slices of the keys, each flushing its own partials.",
        (_, "sink_pass") => "0: sum each block of rows; 1: sum each head's blocks into `dsinks`.",
        (_, "n_rows") => "The most query rows one sequence adds.",
        (_, "slot0") => "The cache slot of sequence 0; sequence b is in slot slot0 + b.",
        (_, "n_new") => "Rows each sequence appends to its slot.",
        (_, "n_slots") => "Slots of the cache, each of whose lengths moves on to `seq_lens_next`.",
        // The conversions, reductions and merges.
        (Op::DkvReduce, "len4") => "vec4s of dK to sum over the lanes.",
        (_, "len4") => "vec4s to convert.",
        (_, "len4_v") => {
            "vec4s of dV, which differ from dK's where V's rows are not head_dim wide."
        }
        (_, "len") => "Elements of the gradient.",
        (_, "lanes") => "Lanes of the compensated sums folded into each element.",
        (_, "queries") => "Queries to merge: rows by heads.",
        (_, "parts") => "States merged into each query, stacked part-major.",
        (_, "blocks") => "Blocks a side of the mask: seq_len / MASK_BLOCK, rounded up.",
        (_, "mask_heads") => "The mask's heads: n_heads where mask_mod reads `h`, else 1.",
        (_, "mask_batch") => "The mask's sequences: batch where mask_mod reads `b`, else 1.",
        (Op::RowScale, "rows") => "Rows whose largest magnitude the pass finds.",
        (_, "width4") => "vec4s per row.",
        (_, "at") => "Where row 0's maximum lands in `dst`: row r's is at `at + r`.",
        // c = a·b.
        (_, "m") => "Rows of a and c.",
        (_, "n") => "Columns of b and c.",
        (_, "k") => "The reduction's length: columns of a, rows of b.",
        (_, "split") => "Parts the reduction is split into, each workgroup summing one.",
        // The row-wise layers.
        (_, "rows") if rows => "Rows of x: batch · seq.",
        (_, "hidden") => "Elements of each row of x: LayerNorm's width and the Linear's input.",
        (_, "out") => "The Linear's output width.",
        (_, "n_tiles") => {
            "Partials of dW to reduce: the fused backward's row tiles, or the matmul's parts."
        }
        (_, "n_blocks") => {
            "Partials of dγ and dβ to reduce: the fused backward's dx blocks, or the row workgroups."
        }
        (_, "db_parts") => "Partials of db to reduce: row tiles, or row workgroups.",
        (_, "part1") => "Where y's second part starts among its columns; 0: y is one part.",
        (_, "part2") => "Where y's third part starts among its columns; 0: no third part.",
        (_, "y_rows") => "Rows of each part of y: the call's rows, or more where they are padded.",
        _ => UNDESCRIBED,
    }
}

/// The doc of a uniform field [`field_doc`] has no text for.
const UNDESCRIBED: &str = "A run-time value of the kernel, as its WGSL reads it.";

fn bindings_struct(abi: &KernelAbi) -> TokenStream {
    let count = abi.bindings.len();
    let fields = abi.bindings.iter().map(|b| {
        let f = format_ident!("{}", b.name.as_ref());
        let doc = binding_doc(b);
        quote!(#[doc = #doc] pub #f: &'a ::wgpu::Buffer)
    });
    let entries = abi.bindings.iter().map(layout_entry);
    let group_entries = abi.bindings.iter().map(|b| {
        let (index, f) = (b.binding, format_ident!("{}", b.name.as_ref()));
        quote!(::wgpu::BindGroupEntry { binding: #index, resource: self.#f.as_entire_binding() })
    });
    quote! {
        /// One buffer per binding of the kernel, by name.
        #[derive(Clone, Copy, Debug)]
        pub struct Bindings<'a> {
            #(#fields,)*
        }

        impl<'a> Bindings<'a> {
            /// The bind-group layout entries, in binding order.
            pub const LAYOUT_ENTRIES: [::wgpu::BindGroupLayoutEntry; #count] = [#(#entries),*];

            /// Creates the kernel's bind-group layout from [`Self::LAYOUT_ENTRIES`].
            pub fn layout(device: &::wgpu::Device) -> ::wgpu::BindGroupLayout {
                device.create_bind_group_layout(&::wgpu::BindGroupLayoutDescriptor {
                    label: ::core::option::Option::Some(NAME),
                    entries: &Self::LAYOUT_ENTRIES,
                })
            }

            /// Binds these buffers, each to its binding, in a bind group of `layout` (from
            /// [`Self::layout`]).
            pub fn bind_group(
                &self,
                device: &::wgpu::Device,
                layout: &::wgpu::BindGroupLayout,
            ) -> ::wgpu::BindGroup {
                device.create_bind_group(&::wgpu::BindGroupDescriptor {
                    label: ::core::option::Option::Some(NAME),
                    layout,
                    entries: &[#(#group_entries),*],
                })
            }
        }
    }
}

fn binding_doc(b: &Binding) -> String {
    let axes: Vec<_> = b.layout.iter().map(|a| a.name()).collect();
    match b.access {
        Access::Uniform => format!("binding {}: uniform `{}`", b.binding, b.wgsl_type),
        Access::Read => format!(
            "binding {}: read, `{}` [{}]",
            b.binding,
            b.wgsl_type,
            axes.join(", ")
        ),
        Access::ReadWrite => format!(
            "binding {}: read_write, `{}` [{}], {}",
            b.binding,
            b.wgsl_type,
            axes.join(", "),
            b.write.map_or("written", |w| w.name())
        ),
    }
}

fn layout_entry(b: &Binding) -> TokenStream {
    let index = b.binding;
    let ty = match b.access {
        Access::Read => quote!(::wgpu::BufferBindingType::Storage { read_only: true }),
        Access::ReadWrite => quote!(::wgpu::BufferBindingType::Storage { read_only: false }),
        Access::Uniform => quote!(::wgpu::BufferBindingType::Uniform),
    };
    let min_size = match b.access {
        Access::Uniform => {
            let size = b.uniform_size();
            quote!(::core::num::NonZeroU64::new(#size))
        }
        _ => quote!(::core::option::Option::None),
    };
    quote! {
        ::wgpu::BindGroupLayoutEntry {
            binding: #index,
            visibility: ::wgpu::ShaderStages::COMPUTE,
            ty: ::wgpu::BindingType::Buffer {
                ty: #ty,
                has_dynamic_offset: false,
                min_binding_size: #min_size,
            },
            count: ::core::option::Option::None,
        }
    }
}

fn dispatch_grid(abi: &KernelAbi) -> TokenStream {
    let Some(dims) = abi.binding("dims") else {
        return TokenStream::new();
    };
    let fields = dims.fields.iter().map(|f| format_ident!("{}", f.as_ref()));
    quote! {
        /// Workgroups to dispatch for `dims`.
        pub fn dispatch_grid(dims: &Dims) -> [u32; 3] {
            ABI.dispatch_grid(&[#(dims.#fields),*])
        }
    }
}

/// The `Masks` value of a kernel, as an expression.
fn masks_tokens(m: &attn_dsl::Masks) -> TokenStream {
    let attn_dsl::Masks {
        causal,
        document,
        window,
        alibi,
        bias,
        softcap,
        dropout,
        sinks,
        flex,
    } = *m;
    let flex = match flex {
        None => quote!(::core::option::Option::None),
        Some(f) => {
            let json = f.json();
            quote!(::core::option::Option::Some(::attn_dsl::flex::FlexRef::from_json(#json)))
        }
    };
    let bias = match bias {
        None => quote!(::core::option::Option::None),
        Some(attn_dsl::BiasHeads::PerHead) => {
            quote!(::core::option::Option::Some(::attn_dsl::BiasHeads::PerHead))
        }
        Some(attn_dsl::BiasHeads::Shared) => {
            quote!(::core::option::Option::Some(::attn_dsl::BiasHeads::Shared))
        }
    };
    quote!(::attn_dsl::Masks {
        causal: #causal,
        document: #document,
        window: #window,
        alibi: #alibi,
        bias: #bias,
        softcap: #softcap,
        dropout: #dropout,
        sinks: #sinks,
        flex: #flex,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of every op's uniform blocks has a doc of its own.
    #[test]
    fn every_uniform_field_is_described() {
        for op in Op::ALL {
            for binding in ["dims", "params"] {
                let Some(block) = attn_dsl::signature::uniform_block(op, binding) else {
                    continue;
                };
                for field in block.fields {
                    assert_ne!(
                        field_doc(op, field),
                        UNDESCRIBED,
                        "{op:?}: {binding}.{field}"
                    );
                }
            }
        }
    }
}

//! Appending rows of K and V to a KV cache on the device (`cache_append`): each new row is
//! copied, vec4 by vec4 of its dtype, to its slot's position `seq_lens[slot] + s`, through
//! the block table when the cache is paged; workgroup 0 also writes every slot's length,
//! advanced for the slots appended to, into `seq_lens_next`. A cache in the kernel's dtype
//! takes the rows as they are; an fp8 cache takes each value divided by its KV head's scale,
//! rounded to nearest even and saturated (`narrow_kv4`).

use super::writer::{Fragment, Template, Wgsl, uint};

use crate::spec::{Cache, KernelSpec};

pub(super) fn constants(out: &mut Wgsl, spec: &KernelSpec) {
    out.put(match spec.split_dims() {
        false => ONE_WIDTH.fill([
            ("wg", uint(spec.workgroup_size)),
            ("head_dim", uint(spec.head_dim)),
        ]),
        true => TWO_WIDTHS.fill([
            ("wg", uint(spec.workgroup_size)),
            ("qk_dim", uint(spec.head_dim)),
            ("v_dim", uint(spec.v_dim())),
        ]),
    });
}

/// The workgroup, and the rows' width where K's and V's are one.
const ONE_WIDTH: Template = Template {
    name: "append_one_width_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
const HEAD_DIM: u32 = $head_dim;
// vec4s of a row.
const V4: u32 = HEAD_DIM / 4u;

"#,
};

/// The workgroup, and K's and V's widths where they differ.
const TWO_WIDTHS: Template = Template {
    name: "append_two_widths_constants",
    needs: &[],
    text: r#"const WG: u32 = $wg;
// K rows, V rows.
const QK_DIM: u32 = $qk_dim;
const V_DIM: u32 = $v_dim;
// vec4s of a K row, of a V row, of the two.
const QK4: u32 = QK_DIM / 4u;
const V4: u32 = V_DIM / 4u;
const KV4: u32 = QK4 + V4;

"#,
};

/// `cache_row(slot, j, kv_h)`: the row of key j of slot `slot`, KV head kv_h, in either
/// layout, counted in rows (a row of K starts at it times K's width, one of V at it times
/// V's): the one place every kernel that reads or writes a cache finds its rows.
pub(super) fn cache_row(spec: &KernelSpec) -> Fragment {
    match spec.cache {
        Cache::Contiguous => CONTIGUOUS_ROW.plain(),
        Cache::Paged => PAGED_ROW.plain(),
    }
}

const CONTIGUOUS_ROW: Template = Template {
    name: "contiguous_row",
    needs: &[],
    text: r#"// Row j of slot `slot`, KV head kv_h: [slot, capacity, kv_h, d].
fn cache_row(slot: u32, j: u32, kv_h: u32) -> u32 {
    return (slot * dims.capacity + j) * dims.n_kv_heads + kv_h;
}
"#,
};

const PAGED_ROW: Template = Template {
    name: "paged_row",
    needs: &[],
    text: r#"// Row j of slot `slot` lives in page block_table[slot, j / page_size] of the pool
// [page, row, kv_h, d], at row j % page_size.
fn cache_row(slot: u32, j: u32, kv_h: u32) -> u32 {
    let page = block_table[slot * dims.pages_per_seq + j / dims.page_size];
    let row = page * dims.page_size + j % dims.page_size;
    return row * dims.n_kv_heads + kv_h;
}
"#,
};

/// One new row's vec4 `rest` of `[kv_h, d]`: where it goes and what it stores, for one width.
const ONE_WIDTH_COPY: Template = Template {
    name: "append_one_width",
    needs: &[],
    text: r#"let kv_h = rest / V4;
let to = cache_row(slot, start + s, kv_h) * V4 + rest % V4;
let src = (batch * dims.n_new + s) * per_row + rest;
k_cache[to] = $k;
v_cache[to] = $v;
"#,
};

/// Rows of two widths: vec4 `rest` of `[kv_h, K's QK4 then V's V4]`, the K or the V one.
const TWO_WIDTH_COPY: Template = Template {
    name: "append_two_widths",
    needs: &[],
    text: r#"let kv_h = rest / KV4;
let c = rest % KV4;
let row = cache_row(slot, start + s, kv_h);
if (c < QK4) {
    let src = ((batch * dims.n_new + s) * dims.n_kv_heads + kv_h) * QK4 + c;
    k_cache[row * QK4 + c] = $k;
} else {
    let src = ((batch * dims.n_new + s) * dims.n_kv_heads + kv_h) * V4 + c - QK4;
    v_cache[row * V4 + c - QK4] = $v;
}
"#,
};

pub(super) fn append(out: &mut Wgsl, spec: &KernelSpec) {
    let split = spec.split_dims();
    out.put(cache_row(spec));
    let (k, v) = match spec.kv_fp8 {
        Some(_) => {
            super::dtype::vec4_codec(out, spec.dtype);
            super::dtype::cache_codec(out, spec);
            (
                "narrow_kv4(widen4(k_new[src]) / kv_scales[kv_h])",
                "narrow_kv4(widen4(v_new[src]) / kv_scales[dims.n_kv_heads + kv_h])",
            )
        }
        None => ("k_new[src]", "v_new[src]"),
    };
    let (per_row, copy) = match split {
        false => ("V4", ONE_WIDTH_COPY),
        true => ("KV4", TWO_WIDTH_COPY),
    };
    let copy = copy.fill([("k", Fragment::from(k)), ("v", Fragment::from(v))]);
    out.put(APPEND.fill([
        ("name", Fragment::from(spec.name.as_str())),
        ("per_row", Fragment::from(per_row)),
        ("copy", copy),
    ]));
}

/// The entry: a grid-stride loop over the new rows' vec4s, each copied by `$copy`; then
/// workgroup 0 writes every slot's next length.
const APPEND: Template = Template {
    name: "cache_append",
    needs: &[],
    text: r#"
@compute @workgroup_size(WG)
fn $name(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    batch = wg.y;
    let slot = dims.slot0 + batch;
    let start = seq_lens[slot];
    let per_row = dims.n_kv_heads * $per_row;
    let total = dims.n_new * per_row;
    for (var i = wg.x * WG + tid; i < total; i = i + groups.x * WG) {
        let s = i / per_row;
        let rest = i % per_row;
        $copy
    }
    // Every slot's length moves on in one place, so that seq_lens_next is whole.
    if (wg.x == 0u && wg.y == 0u) {
        for (var t = tid; t < dims.n_slots; t = t + WG) {
            let appended = t >= dims.slot0 && t < dims.slot0 + dims.batch;
            seq_lens_next[t] = seq_lens[t] + select(0u, dims.n_new, appended);
        }
    }
}
"#,
};

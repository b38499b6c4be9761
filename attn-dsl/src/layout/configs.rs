//! Flash configurations derived by rule, for any head_dim: the candidates `bench --tune`
//! times and `check` proves, and the configuration a description gets when it asks for
//! `s_major(flash)` (or `j_major(flash)`).
//!
//! The rule: a short menu of workgroup shapes (rows per workgroup × invocations), and for
//! each the largest inner tile (fewest barriers per key), then the most rows per invocation
//! (the most reuse of each staged value), that the thread layout, the register budget and
//! the workgroup memory allow. The menu holds the shapes that won on an H100 at head_dims
//! 64 and 128 (64×256 and 64×128 forward, 16×128 and 32×128 backward) and small ones that
//! fit WebGPU's default 16 KiB; candidate 0 is the best that fits those defaults.

use crate::layout::tiling::Tiling;
use crate::spec::{FlashConfig, KernelSpec, Limits, Masks, Matrix, Op};

/// Workgroup memory no candidate exceeds: the most that common GPUs give one workgroup
/// (48 KiB on NVIDIA's Vulkan driver). A device with less runs the candidates that fit.
pub const CANDIDATE_WORKGROUP_BYTES: u32 = 48 * 1024;

/// (rows per workgroup, invocations) searched, in order, for candidate 0: the best that
/// fits WebGPU's defaults.
const PORTABLE_MENU: &[(u32, u32)] = &[(16, 64), (8, 64), (16, 32), (8, 32)];
/// The shapes of the other candidates, in order of preference.
const FORWARD_MENU: &[(u32, u32)] = &[(64, 256), (64, 128), (32, 128), (32, 256), (16, 64)];
const BACKWARD_MENU: &[(u32, u32)] = &[(16, 128), (32, 128), (32, 256), (16, 64), (8, 64)];
/// Two or one invocations per row: the layouts left when head_dim / 4 has few factors of 2
/// (the invocations of a row share its vec4 columns evenly).
const FEW_PER_ROW: &[(u32, u32)] = &[(16, 32), (32, 64), (32, 32), (64, 64)];
/// Register blocks of backward winners, as (rows per workgroup, rows per invocation, vec4
/// accumulator columns per invocation, staged columns per invocation). Where the menu's
/// power-of-two shapes hold one row per invocation (head_dim / 4 with few factors of 2, as
/// 20 at head_dim 80), the same blocks are laid out with as many invocations per row as
/// head_dim needs: d64's 16x32/2@128 becomes 16x40/2@160 at head_dim 80. (On an H100 at
/// d80 they lead the tiled and streaming schedules, 32x20/4@160 at 6.5 TFLOP/s, but not
/// the flash one: 32x16/1@128 stays at 7.3.)
const BACKWARD_BLOCKS: &[(u32, u32, u32, u32)] = &[(16, 2, 1, 2), (32, 2, 2, 2), (32, 4, 1, 1)];

/// Forward shapes that also get a twin with subgroup row reductions.
const SUBGROUP_TWINS: &[(u32, u32)] = &[(64, 256), (64, 128), (32, 256)];

const INNER: [u32; 4] = [32, 16, 8, 4];
const ROWS_PER_THREAD: [u32; 3] = [4, 2, 1];

/// Workgroup memory of a flash kernel of `op` under `config`, or why the layout is invalid
/// (the thread layout does not divide, or the register block is over budget).
pub fn workgroup_bytes(op: Op, head_dim: u32, config: FlashConfig) -> Result<u32, String> {
    let spec = KernelSpec::flash("probe", op, head_dim, Masks::default(), config);
    match Tiling::of(&spec) {
        Some(Ok(t)) => Ok(t.bytes(op)),
        Some(Err(why)) => Err(why),
        None => Err("not a flash grid".into()),
    }
}

/// Whether `config` is a valid flash layout for every op in `ops` within `bytes`.
fn fits(ops: &[Op], head_dim: u32, config: FlashConfig, bytes: u32) -> bool {
    ops.iter()
        .all(|&op| workgroup_bytes(op, head_dim, config).is_ok_and(|b| b <= bytes))
}

/// Whether `config`'s row groups hold padding columns at `head_dim` (their invocations do
/// not divide its vec4 columns).
fn pads(head_dim: u32, config: FlashConfig) -> bool {
    let groups = (config.tile / config.rows_per_thread).max(1);
    let tx = config.workgroup_size / groups;
    tx == 0 || !(head_dim / 4).is_multiple_of(tx)
}

/// For a workgroup shape, the configuration with the largest inner tile, then the most
/// rows per invocation, that is valid for `ops` within `bytes`; with `exact`, only layouts
/// whose row groups share head_dim's vec4 columns evenly (no padding columns).
fn best_of_shape(
    ops: &[Op],
    head_dim: u32,
    (tile, wg): (u32, u32),
    bytes: u32,
    exact: bool,
) -> Option<FlashConfig> {
    INNER.iter().find_map(|&inner| {
        ROWS_PER_THREAD.iter().find_map(|&rows_per_thread| {
            let config = FlashConfig {
                tile,
                inner,
                rows_per_thread,
                workgroup_size: wg,
                subgroups: false,
                matrix: Matrix::Scalar,
            };
            ((!exact || !pads(head_dim, config)) && fits(ops, head_dim, config, bytes))
                .then_some(config)
        })
    })
}

/// Candidate 0 (the best shape that fits WebGPU's defaults, when one does), then the
/// `menu` within [`CANDIDATE_WORKGROUP_BYTES`], without repeats; two or one invocations
/// per row when nothing else fits. Layouts without padding columns come first, then the
/// menu's shapes again with padding allowed: at head_dim 80 (20 vec4 columns) the exact
/// layouts of the menu hold one row per invocation, the padded ones two or four.
fn from_menu(ops: &[Op], head_dim: u32, menu: &[(u32, u32)]) -> Vec<FlashConfig> {
    let webgpu = Limits::WEBGPU.workgroup_storage_bytes;
    let portable = [true, false].iter().find_map(|&exact| {
        PORTABLE_MENU
            .iter()
            .chain(FEW_PER_ROW)
            .find_map(|&shape| best_of_shape(ops, head_dim, shape, webgpu, exact))
    });
    let mut out: Vec<FlashConfig> = portable.into_iter().collect();
    let add = |shapes: &[(u32, u32)], exact: bool, out: &mut Vec<FlashConfig>| {
        for &shape in shapes {
            if let Some(c) = best_of_shape(ops, head_dim, shape, CANDIDATE_WORKGROUP_BYTES, exact)
                && !out.contains(&c)
            {
                out.push(c);
            }
        }
    };
    add(menu, true, &mut out);
    add(menu, false, &mut out);
    if out.is_empty() {
        add(FEW_PER_ROW, true, &mut out);
        add(FEW_PER_ROW, false, &mut out);
    }
    out
}

/// Every flash forward configuration for `head_dim`, candidate 0 first (it fits WebGPU's
/// defaults whenever any forward does); the `subgroups` twins come last.
pub fn forward(head_dim: u32) -> Vec<FlashConfig> {
    let mut out = from_menu(&[Op::Forward], head_dim, FORWARD_MENU);
    let twins: Vec<FlashConfig> = out
        .iter()
        .filter(|c| SUBGROUP_TWINS.contains(&(c.tile, c.workgroup_size)))
        .map(|c| FlashConfig {
            subgroups: true,
            ..*c
        })
        .filter(|c| fits(&[Op::Forward], head_dim, *c, CANDIDATE_WORKGROUP_BYTES))
        .collect();
    out.extend(twins);
    out
}

/// (query rows, keys per block, subgroups per 16 rows) of the cooperative-matrix forward,
/// in order of preference: more rows per workgroup reuse each staged key more; 32 keys
/// keep K, V, S and P of head_dim 128 within 32 KiB (64 keys would need 60.5 KiB); two
/// subgroups per 16 rows halve each one's accumulators. The last, 128 rows (Q staged in
/// column passes), halves the staging per key again but gives a grid half the
/// workgroups: the runtime picks it only for problems with workgroups to spare
/// (`tuning::Table::forward_for`).
const COOP_MENU: &[(u32, u32, u32)] = &[
    (64, 32, 2),
    (64, 32, 1),
    (32, 32, 2),
    (32, 32, 1),
    (64, 16, 1),
    (32, 16, 1),
    (16, 16, 1),
    (128, 32, 1),
];

/// The cooperative-matrix forward configurations for `head_dim` (a multiple of 16) within
/// `bytes` of workgroup memory, best first; empty for other head_dims.
pub fn coop_forward(head_dim: u32, bytes: u32) -> Vec<FlashConfig> {
    coop_forward_in(head_dim, bytes, crate::Dtype::F16)
}

/// [`coop_forward`] with operands in `dtype`: bf16's row scales take workgroup memory.
pub fn coop_forward_in(head_dim: u32, bytes: u32, dtype: crate::Dtype) -> Vec<FlashConfig> {
    let scaled = dtype == crate::Dtype::Bf16;
    coop_configs(COOP_MENU, &[Op::Forward], head_dim, bytes, scaled)
}

/// Workgroup memory of the cooperative-matrix forward under `config` (one of
/// [`coop_forward_in`]'s) at `head_dim`, operands in `dtype`.
pub fn coop_forward_bytes(head_dim: u32, config: FlashConfig, dtype: crate::Dtype) -> u32 {
    coop_bytes(Op::Forward, head_dim, config, dtype)
}

/// [`coop_forward_bytes`] for `op`: the forward, or a continued cache's chunk (which
/// stages V over K where that holds more of its small tiles).
pub fn coop_bytes(op: Op, head_dim: u32, config: FlashConfig, dtype: crate::Dtype) -> u32 {
    let spec = KernelSpec {
        dtype,
        ..KernelSpec::flash("probe", op, head_dim, Masks::default(), config)
    };
    super::coop::CoopTiling::of(&spec).map_or(0, |t| t.bytes())
}

/// (owned rows, rows per staged block, subgroups per 16 rows) of the cooperative-matrix
/// tiled backward. Each subgroup holds the A fragments of both its owned tensors for the
/// whole pass, and the key-major half two sets of accumulators, so every layout but the
/// last splits each 16 rows between two subgroups.
const COOP_BACKWARD_MENU: &[(u32, u32, u32)] = &[
    (64, 32, 2),
    (32, 32, 2),
    (32, 32, 1),
    (16, 32, 2),
    (16, 16, 1),
];

/// The cooperative-matrix tiled backward configurations for `head_dim` (a multiple of 16)
/// within `bytes` of workgroup memory, each valid for both halves, best first.
pub fn coop_backward(head_dim: u32, bytes: u32) -> Vec<FlashConfig> {
    coop_backward_in(head_dim, bytes, crate::Dtype::F16)
}

/// [`coop_backward`] with operands in `dtype`: bf16's rescale factors take workgroup
/// memory.
pub fn coop_backward_in(head_dim: u32, bytes: u32, dtype: crate::Dtype) -> Vec<FlashConfig> {
    let ops = [Op::BackwardQ, Op::BackwardKv];
    let scaled = dtype == crate::Dtype::Bf16;
    coop_configs(COOP_BACKWARD_MENU, &ops, head_dim, bytes, scaled)
}

fn coop_configs(
    menu: &[(u32, u32, u32)],
    ops: &[Op],
    head_dim: u32,
    bytes: u32,
    scaled: bool,
) -> Vec<FlashConfig> {
    use super::coop::{CoopTiling, FRAG};
    if head_dim == 0 || !head_dim.is_multiple_of(FRAG) {
        return Vec::new();
    }
    let halves = |n: u32| (n / FRAG).is_multiple_of(2);
    let tiling = |br, bc, split, op| CoopTiling {
        br,
        bc,
        head_dim,
        split,
        qk_frags: head_dim / FRAG,
        v_frags: head_dim / FRAG,
        op,
        scaled,
        fp8: false,
    };
    menu.iter()
        .filter(|&&(_, bc, split)| split == 1 || (halves(bc) && halves(head_dim)))
        .filter(|&&(br, bc, split)| {
            ops.iter()
                .all(|&op| tiling(br, bc, split, op).bytes() <= bytes)
        })
        .map(|&(br, bc, split)| FlashConfig {
            tile: br,
            inner: bc,
            rows_per_thread: FRAG,
            workgroup_size: tiling(br, bc, split, ops[0]).workgroup_size(),
            subgroups: false,
            matrix: Matrix::Coop16,
        })
        .collect()
}

/// Every flash backward configuration for `head_dim`, each valid for both halves (the
/// query-major dQ kernel and the key-major dK/dV kernel), candidate 0 first.
pub fn backward(head_dim: u32) -> Vec<FlashConfig> {
    let ops = [Op::BackwardQ, Op::BackwardKv];
    let mut out = from_menu(&ops, head_dim, BACKWARD_MENU);
    let exact = out.iter().skip(1).filter(|c| !pads(head_dim, **c));
    if exact.clone().all(|c| c.rows_per_thread == 1) {
        let scaled = BACKWARD_BLOCKS
            .iter()
            .filter_map(|&block| scaled_block(head_dim, block))
            .filter(|c| fits(&ops, head_dim, *c, CANDIDATE_WORKGROUP_BYTES));
        for c in scaled {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

/// `block` laid out for `head_dim`: `head_dim / 4 / columns` invocations per row, when that
/// divides, within WebGPU's default 256 invocations.
fn scaled_block(
    head_dim: u32,
    (tile, tm, columns, staged): (u32, u32, u32, u32),
) -> Option<FlashConfig> {
    let d4 = head_dim / 4;
    if !d4.is_multiple_of(columns) {
        return None;
    }
    let tx = d4 / columns;
    let workgroup_size = tile / tm * tx;
    (workgroup_size <= Limits::WEBGPU.invocations_per_workgroup).then_some(FlashConfig {
        tile,
        inner: staged * tx,
        rows_per_thread: tm,
        workgroup_size,
        subgroups: false,
        matrix: Matrix::Scalar,
    })
}

/// The configuration a description that asks for `flash` gets: the first candidate of
/// `op` that fits `limits` (and `workgroup_size`, when the description fixes it).
pub fn for_description(
    op: Op,
    head_dim: u32,
    limits: &Limits,
    workgroup_size: Option<u32>,
) -> Option<FlashConfig> {
    let candidates = match op {
        Op::Forward | Op::Extend => forward(head_dim),
        Op::BackwardQ | Op::BackwardKv => backward(head_dim),
        _ => return None,
    };
    candidates.into_iter().find(|c| {
        !c.subgroups
            && workgroup_size.is_none_or(|wg| wg == c.workgroup_size)
            && c.workgroup_size <= limits.invocations_per_workgroup
            && workgroup_bytes(op, head_dim, *c).is_ok_and(|b| b <= limits.workgroup_storage_bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn label(c: &[FlashConfig]) -> Vec<String> {
        c.iter().map(FlashConfig::label).collect()
    }

    /// Every tensor-core forward configuration the rule gives, at every head_dim it
    /// takes, compiles (naga validates it), Q staged whole or in column passes, with f16
    /// operands and with bf16 ones scaled into f16.
    #[test]
    fn every_coop_forward_configuration_compiles() {
        let mut passes = 0;
        for (head_dim, dtype) in (16..=256)
            .step_by(16)
            .flat_map(|d| [(d, crate::Dtype::F16), (d, crate::Dtype::Bf16)])
        {
            for config in coop_forward_in(head_dim, CANDIDATE_WORKGROUP_BYTES, dtype) {
                let mut spec = crate::KernelSpec {
                    dtype,
                    ..crate::KernelSpec::flash(
                        "coop_forward",
                        Op::Forward,
                        head_dim,
                        crate::Masks::new(true, true),
                        config,
                    )
                };
                spec.fit_target();
                let abi = crate::compile(&spec).unwrap_or_else(|e| {
                    panic!("d{head_dim} {} {}: {e}", config.label(), dtype.name())
                });
                assert!(abi.workgroup_storage_bytes <= CANDIDATE_WORKGROUP_BYTES);
                passes += usize::from(abi.wgsl.contains("const QC: u32"));
            }
        }
        // The 128-row tile stages Q in column passes wherever it fits.
        assert!(passes >= 20, "{passes}");
    }

    /// V goes over K only where K and V side by side do not fit: among the f16 candidates
    /// that is the 128-row tile from head_dim 224 (and at 144, by 32 bytes), which it lets
    /// run at all (the bytes it declares there); at head_dim 128 every candidate keeps
    /// both blocks.
    #[test]
    fn v_over_k_only_where_k_and_v_side_by_side_do_not_fit() {
        let over = |head_dim: u32, dtype: crate::Dtype| -> Vec<String> {
            coop_forward_in(head_dim, CANDIDATE_WORKGROUP_BYTES, dtype)
                .into_iter()
                .filter(|c| {
                    let spec = crate::KernelSpec {
                        dtype,
                        ..crate::KernelSpec::flash("p", Op::Forward, head_dim, Masks::default(), *c)
                    };
                    super::super::coop::CoopTiling::of(&spec).is_some_and(|t| t.v_over_k())
                })
                .map(|c| c.label())
                .collect()
        };
        for head_dim in [64, 128, 192] {
            assert_eq!(over(head_dim, crate::Dtype::F16), Vec::<String>::new());
        }
        for (head_dim, bytes) in [(144, 39_456), (224, 44_576), (240, 45_600), (256, 46_624)] {
            assert_eq!(over(head_dim, crate::Dtype::F16), ["128x32/16@256+tc"]);
            let config = forward_tc(head_dim, 128);
            assert_eq!(
                coop_forward_bytes(head_dim, config, crate::Dtype::F16),
                bytes
            );
        }
        assert_eq!(over(256, crate::Dtype::Bf16), Vec::<String>::new());
    }

    /// A chunk's tiles of at most 32 rows take V over K where it holds one more of them in
    /// 48 KiB (at head_dim 128 the 32-row tile of 32-key blocks three instead of two); the
    /// larger tiles stay as the forward's.
    #[test]
    fn the_chunk_stages_v_over_k_where_its_small_tiles_fit_more() {
        let f16 = crate::Dtype::F16;
        let held = |op, head_dim, c| CANDIDATE_WORKGROUP_BYTES / coop_bytes(op, head_dim, c, f16);
        let changed = |head_dim: u32| -> Vec<(String, u32, u32)> {
            coop_forward_in(head_dim, CANDIDATE_WORKGROUP_BYTES, f16)
                .into_iter()
                .filter(|&c| {
                    coop_bytes(Op::Extend, head_dim, c, f16)
                        != coop_bytes(Op::Forward, head_dim, c, f16)
                })
                .map(|c| {
                    let fwd = held(Op::Forward, head_dim, c);
                    (c.label(), fwd, held(Op::Extend, head_dim, c))
                })
                .collect()
        };
        // (tile, held apart, held with V over K) at head_dim 128 and at 64.
        let small = [
            "32x32/16@128+tc",
            "32x32/16@64+tc",
            "32x16/16@64+tc",
            "16x16/16@32+tc",
        ];
        for (head_dim, held) in [
            (128, [(2, 3), (2, 3), (4, 5), (4, 7)]),
            (64, [(3, 4), (3, 4), (6, 7), (8, 10)]),
        ] {
            let want: Vec<(String, u32, u32)> = (small.iter().zip(held))
                .map(|(l, (a, b))| (l.to_string(), a, b))
                .collect();
            assert_eq!(changed(head_dim), want, "head_dim {head_dim}");
        }
    }

    fn forward_tc(head_dim: u32, tile: u32) -> FlashConfig {
        coop_forward_in(head_dim, CANDIDATE_WORKGROUP_BYTES, crate::Dtype::F16)
            .into_iter()
            .find(|c| c.tile == tile)
            .expect("a tensor-core forward of that tile")
    }

    /// The rule reproduces the configurations that won on an H100 when they were listed
    /// by hand, and candidate 0 fits WebGPU's defaults.
    #[test]
    fn the_rule_finds_the_measured_winners() {
        let f64 = label(&forward(64));
        for want in ["64x32/4@256", "64x32/4@256+sg", "64x32/4@128"] {
            assert!(f64.contains(&want.to_string()), "{want} not in {f64:?}");
        }
        let f128 = label(&forward(128));
        for want in ["64x16/4@128", "64x16/4@128+sg", "32x32/4@128"] {
            assert!(f128.contains(&want.to_string()), "{want} not in {f128:?}");
        }
        assert!(label(&backward(64)).contains(&"16x32/2@128".to_string()));
        assert!(label(&backward(128)).contains(&"32x8/2@128".to_string()));
        for head_dim in [32, 64, 80, 96, 128] {
            for (op, c) in [
                (Op::Forward, forward(head_dim)[0]),
                (Op::BackwardKv, backward(head_dim)[0]),
            ] {
                let bytes = workgroup_bytes(op, head_dim, c).unwrap();
                assert!(bytes <= 16384, "d{head_dim} {}: {bytes} B", c.label());
            }
        }
    }

    #[test]
    fn every_head_dim_that_is_a_multiple_of_4_has_candidates() {
        for head_dim in (4u32..=256).step_by(4) {
            // With padded layouts every head_dim has a forward and a backward on the flash
            // grids (before them, head_dim / 4 with an odd factor over 31 had none).
            let (f, b) = (forward(head_dim), backward(head_dim));
            assert!(!f.is_empty(), "forward d{head_dim}");
            assert!(!b.is_empty(), "backward d{head_dim}");
            for c in f {
                let bytes = workgroup_bytes(Op::Forward, head_dim, c).unwrap();
                assert!(bytes <= CANDIDATE_WORKGROUP_BYTES);
            }
        }
    }

    /// Where the menu's shapes hold one row per invocation, d64's winning block is laid out
    /// with head_dim / 4 invocations per row; a prime head_dim / 4 gets a backward too.
    #[test]
    fn head_dims_with_few_factors_of_two_keep_two_rows_per_invocation() {
        let d80 = label(&backward(80));
        assert!(d80.contains(&"16x40/2@160".to_string()), "{d80:?}");
        assert!(label(&backward(68)).contains(&"16x34/2@136".to_string()));
        // Head_dims the menu serves keep its shapes only.
        assert!(
            backward(64)
                .iter()
                .all(|c| c.workgroup_size.is_power_of_two())
        );
    }

    /// Where the invocations of a row group do not divide head_dim's vec4 columns, the
    /// menu's shapes are offered padded (a quarter of padding at most): the layouts that
    /// hold two or four rows per invocation at head_dim 80 and beat every exact one on an
    /// H100 (flash-32x16/1@256, 8 invocations of 3 columns for 20: 7.75 TFLOP/s against
    /// 7.30). Head_dim 28 has padded backward layouts within 32 KiB, so every adapter's
    /// `check` runs some.
    #[test]
    fn padded_layouts_are_offered_after_the_exact_ones() {
        let d80 = backward(80);
        let first_padded = d80.iter().position(|c| pads(80, *c)).unwrap();
        assert!(d80[..first_padded].iter().all(|c| !pads(80, *c)));
        assert!(label(&d80).contains(&"32x16/1@256".to_string()), "{d80:?}");
        assert!(!pads(80, forward(80)[0]) && !pads(80, d80[0]));
        let small = backward(28).into_iter().filter(|c| {
            pads(28, *c)
                && [Op::BackwardQ, Op::BackwardKv]
                    .iter()
                    .all(|&op| workgroup_bytes(op, 28, *c).unwrap() <= 32 * 1024)
        });
        assert!(small.count() >= 2);
        // More than a quarter of padding is refused: 16 invocations for 20 columns.
        let c = FlashConfig::from_label("32x32/2@256").unwrap();
        assert!(
            workgroup_bytes(Op::Forward, 80, c)
                .unwrap_err()
                .contains("padding")
        );
    }

    #[test]
    fn a_description_gets_the_best_config_that_fits_its_target() {
        let c = for_description(Op::Forward, 96, &Limits::WEBGPU, None).unwrap();
        assert!(workgroup_bytes(Op::Forward, 96, c).unwrap() <= 16384);
        let wide = for_description(Op::Forward, 96, &Limits::WEBGPU, Some(64)).unwrap();
        assert_eq!(wide.workgroup_size, 64);
    }
}

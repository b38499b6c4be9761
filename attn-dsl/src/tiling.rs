//! The flash schedule's thread layout, derived once from a description's grid so that the
//! checks, the workgroup-memory count and the emitter agree on it.
//!
//! A workgroup owns `br` rows of its major axis and stages `bc` rows of the other axis at a
//! time. Its invocations form `groups` row groups of `tx` invocations; each invocation holds
//! `tm` rows, and of each staged block the `tn` columns `tx, tx + TX, ...` (interleaved, so
//! that the invocations of a group read consecutive rows of workgroup memory), and of each
//! head_dim-wide accumulator the `dn` vec4 columns `tx, tx + TX, ...`.

use crate::spec::{KernelSpec, Op};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiling {
    /// Rows of the major axis per workgroup.
    pub br: u32,
    /// Rows of the other axis staged per step.
    pub bc: u32,
    /// Rows per invocation.
    pub tm: u32,
    /// Row groups per workgroup.
    pub groups: u32,
    /// Invocations per row group.
    pub tx: u32,
    /// Staged columns per invocation.
    pub tn: u32,
    /// vec4s in a head_dim row.
    pub d4: u32,
    /// vec4 accumulator columns per invocation.
    pub dn: u32,
    /// Row stride of a staged head_dim row in vec4s: one vec4 of padding shifts each row
    /// by four banks, so a group reading `tx` rows at one offset does not conflict.
    pub row4: u32,
    /// Row reductions by subgroup shuffles, with a workgroup-memory fallback.
    pub subgroups: bool,
    /// A query-major backward that also scatters dK and dV (the streaming schedule), and
    /// so stages P beside dS.
    pub scatters_kv: bool,
}

/// Most accumulator values one invocation keeps in registers; past this the driver spills.
pub const MAX_REGISTER_BLOCK: u32 = 128;

impl Tiling {
    /// The layout of `spec`'s flash grid, or what is wrong with it. `None` when the grid is
    /// not a flash grid.
    pub fn of(spec: &KernelSpec) -> Option<Result<Tiling, String>> {
        let flash = spec.grid.flash?;
        let tiling = Tiling::new(
            spec.op,
            spec.grid.tile,
            flash.inner,
            flash.rows_per_thread,
            spec.workgroup_size,
            spec.head_dim,
        );
        Some(tiling.map(|t| Tiling {
            subgroups: flash.subgroups,
            scatters_kv: spec.op == Op::BackwardQ && spec.write_mode("dkv").is_some(),
            ..t
        }))
    }

    fn new(op: Op, br: u32, bc: u32, tm: u32, wg: u32, head_dim: u32) -> Result<Tiling, String> {
        if br == 0 || bc == 0 || tm == 0 {
            return Err("flash tiles and rows_per_thread must be at least 1".into());
        }
        if !br.is_multiple_of(tm) {
            return Err(format!(
                "rows_per_thread {tm} does not divide tile {br}; each invocation takes an equal \
                 share of the tile's rows"
            ));
        }
        let groups = br / tm;
        if !wg.is_multiple_of(groups) {
            return Err(format!(
                "tile {br} / rows_per_thread {tm} = {groups} row groups, which does not divide \
                 workgroup_size {wg}; pick sizes whose quotient is a power of two"
            ));
        }
        let tx = wg / groups;
        if !bc.is_multiple_of(tx) {
            return Err(format!(
                "{tx} invocations share each row group (workgroup_size {wg} / {groups} groups), \
                 which does not divide the inner tile {bc}; raise the inner tile or \
                 rows_per_thread"
            ));
        }
        if !head_dim.is_multiple_of(4) || !(head_dim / 4).is_multiple_of(tx) {
            return Err(format!(
                "head_dim {head_dim} must be a multiple of 4 × {tx} (vec4 columns shared by \
                 the {tx} invocations of a row group); raise rows_per_thread or lower \
                 workgroup_size"
            ));
        }
        let (tn, d4) = (bc / tx, head_dim / 4);
        let dn = d4 / tx;
        // Scores (and dP) per staged column; one head_dim-wide accumulator per output row
        // (two, dK and dV, in the key-major backward).
        let (scores, outputs) = match op {
            Op::Forward => (tn, 4 * dn),
            Op::BackwardQ => (2 * tn, 4 * dn),
            _ => (2 * tn, 8 * dn),
        };
        let block = tm * (scores + outputs);
        if block > MAX_REGISTER_BLOCK {
            return Err(format!(
                "each invocation would hold {block} values in registers ({tm} rows × ({scores} \
                 scores + {outputs} outputs)), over {MAX_REGISTER_BLOCK}; lower rows_per_thread \
                 or the inner tile, or raise workgroup_size"
            ));
        }
        Ok(Tiling {
            br,
            bc,
            tm,
            groups,
            tx,
            tn,
            d4,
            dn,
            row4: d4 + 1,
            subgroups: false,
            scatters_kv: false,
        })
    }

    /// Workgroup memory of a flash kernel of `op`: its staged head_dim-wide rows, its
    /// P-sized tiles, and the small per-row or per-tile state.
    pub fn bytes(&self, op: Op) -> u32 {
        let rows = |br: u32, bc: u32| 16 * self.row4 * (br + bc);
        let tile = 4 * self.br * (self.bc + 1);
        match op {
            // Q; K or V; P; the row reductions; the key range; the subgroup switch.
            Op::Forward => {
                rows(self.br, self.bc)
                    + tile
                    + 4 * self.br * self.tx
                    + 16
                    + if self.subgroups { 4 } else { 0 }
            }
            // Q, dO; K, V; dS (and P, when scattering dK and dV); the key range.
            Op::BackwardQ => {
                rows(2 * self.br, 2 * self.bc) + if self.scatters_kv { 2 * tile } else { tile } + 16
            }
            // K, V; Q, dO; P, dS; (LSE, D) per staged query; the query range.
            _ => rows(2 * self.br, 2 * self.bc) + 2 * tile + 8 * self.bc + 16,
        }
    }
}

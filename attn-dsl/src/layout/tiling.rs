//! The flash schedule's thread layout, derived once from a description's grid so that the
//! checks, the workgroup-memory count and the emitter agree on it.
//!
//! A workgroup owns `br` rows of its major axis and stages `bc` rows of the other axis at a
//! time. Its invocations form `groups` row groups of `tx` invocations; each invocation holds
//! `tm` rows, and of each staged block the `tn` columns `tx, tx + TX, ...` (interleaved, so
//! that the invocations of a group read consecutive rows of workgroup memory), and of each
//! head_dim-wide accumulator the `dn` vec4 columns `tx, tx + TX, ...`.

use crate::spec::{KernelSpec, Op};

/// The thread layout of a flash kernel, as the module docs lay it out.
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
    /// vec4 accumulator columns per invocation: `d4 / tx` rounded up. Where `tx` does not
    /// divide `d4` (head_dim 80 has 20 vec4 columns, 8 invocations per row take 3 each),
    /// the columns past `d4` are padding: staged but never loaded, summed but never
    /// stored (see [`Tiling::column_guard`]). A layout with a quarter or less of padding
    /// can beat every exact one: at head_dim 80 the exact layouts hold one row per
    /// invocation or split rows over 10 or 20 invocations.
    pub dn: u32,
    /// Row stride of a staged head_dim row in vec4s: room for every invocation's columns
    /// (`dn · tx`, past `d4` when `tx` does not divide it), then one vec4 of padding that
    /// shifts each row by four banks, so a group reading `tx` rows at one offset does not
    /// conflict.
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
    /// not a flash grid of scalar products (cooperative matrices have their own layout,
    /// [`super::coop::CoopTiling`]).
    pub fn of(spec: &KernelSpec) -> Option<Result<Tiling, String>> {
        // A slice-major flash grid is the streamed decode's ([`super::decode::Stream`]).
        let flash = spec
            .grid
            .flash
            .filter(|_| spec.grid.matrix.is_scalar() && spec.op != Op::DecodeSplit)?;
        let tiling = Tiling::new(
            spec.op,
            spec.grid.tile,
            flash.inner,
            flash.rows_per_thread,
            spec.workgroup_size,
            spec.width(),
        );
        Some(tiling.map(|t| Tiling {
            subgroups: spec.grid.subgroups,
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
        if !head_dim.is_multiple_of(4) {
            return Err(format!(
                "head_dim {head_dim} must be a multiple of 4 (vec4 columns)"
            ));
        }
        let (tn, d4) = (bc / tx, head_dim / 4);
        let dn = d4.div_ceil(tx);
        if 4 * dn * tx > 5 * d4 {
            return Err(format!(
                "the {tx} invocations of a row group share head_dim {head_dim}'s {d4} vec4 \
                 columns as {dn} each, {} of them padding (more than a quarter); pick a \
                 workgroup_size / (tile / rows_per_thread) that divides {d4} or nearly does",
                dn * tx - d4
            ));
        }
        // Scores (and dP) per staged column; one head_dim-wide accumulator per output row
        // (two, dK and dV, in the key-major backward).
        let (scores, outputs) = match op {
            Op::Forward | Op::Extend => (tn, 4 * dn),
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
            row4: dn * tx + 1,
            subgroups: false,
            scatters_kv: false,
        })
    }

    /// The WGSL condition under which accumulator column `n` of invocation `tx` is a real
    /// column, or `None` when it is one for every invocation.
    pub fn column_guard(&self, n: u32) -> Option<String> {
        ((n + 1) * self.tx > self.d4).then(|| format!("tx + {n}u * TX < D4"))
    }

    /// `code` (statements at indent `ind`) run only where accumulator column `n` is real.
    pub fn guarded(&self, n: u32, code: &str, ind: &str) -> String {
        match self.column_guard(n) {
            None => code.to_string(),
            Some(cond) => format!(
                "if ({cond}) {{\n{ind}    {}\n{ind}}}",
                code.replace('\n', "\n    ")
            ),
        }
    }

    /// Workgroup memory of a flash kernel of `op`: its staged head_dim-wide rows, its
    /// P-sized tiles, and the small per-row or per-tile state.
    pub fn bytes(&self, op: Op) -> u32 {
        let rows = |br: u32, bc: u32| 16 * self.row4 * (br + bc);
        let tile = 4 * self.br * (self.bc + 1);
        match op {
            // Q; K or V; P; the row reductions; the key range; the subgroup switch.
            Op::Forward | Op::Extend => {
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

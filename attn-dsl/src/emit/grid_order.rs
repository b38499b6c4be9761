//! Which tile, head and sequence a flash kernel's workgroup takes. A GPU starts workgroups
//! in the order of their linear id (x fastest), and under a causal mask a query-major tile
//! x walks x + 1 key blocks (a key-major one the rest of the sequence): in grid order the
//! longest tiles of the last heads start last and run alone at the end. Taking the tiles
//! longest first, every head's tile of one length together, is the classic
//! longest-processing-time order: on 132 SMs holding one workgroup each, seq 4096, 16
//! heads, 128-row tiles, it brings a simulated causal forward from 1.32x the ideal
//! makespan to 1.02x, and on an H100 the tensor-core forward from 0.745 to 0.578 ms.
//! Over every head at once it also spreads the workgroups in flight over every head's K
//! and V, which at seq 16384 no longer fit the L2 cache (the forward 3% and the backward
//! 12% slower there), so the heads (and sequences) go in chunks of about [`CHUNK`]
//! workgroups, longest first within each (the same simulated 1.00-1.02x at every length,
//! with as few heads in flight as grid order at long ones). Even so grids of [`WAVES`]
//! chunks or more ran 1-3% slower than in grid order (16384 rows, the forward and
//! backward), where the tail is a small part anyway, so they keep grid order. Without a
//! causal mask the order changes nothing but which workgroup takes which tile.

use super::writer::{Fragment, Template};
use crate::spec::{KernelSpec, Op};

/// Workgroups per chunk of heads: about two per SM on an H100, enough that a chunk's
/// short tiles fill the gaps its long ones leave.
pub const CHUNK: u32 = 256;

/// Grids of this many chunks or more keep grid order.
pub const WAVES: u32 = 8;

/// How workgroup ids map to (tile, head): as the grid lays them out, or longest first in
/// chunks of heads (`chunked`) or over all heads at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Order {
    Grid,
    LongestFirst { chunked: bool },
}

/// What an entry point needs: its extra builtin parameter, the statements that set
/// `batch` (and the names below), and the tile's and the head's expressions.
pub(super) struct Mapping {
    pub builtin: &'static str,
    pub prologue: Fragment,
    pub tile: &'static str,
    pub head: &'static str,
}

/// The mapping of `order` for `spec`'s kernel: a key-major half's longest tiles are its
/// first (the keys every later query sees), a query-major kernel's its last.
pub(super) fn mapping(spec: &KernelSpec, order: Order) -> Mapping {
    let mut m = sequence_mapping(spec, order);
    if spec.op == Op::Extend {
        // The sequence's cache slot and rows, once `batch` is known.
        m.prologue = m.prologue.then(Fragment::from("continue_rows();\n"));
    }
    m
}

fn sequence_mapping(spec: &KernelSpec, order: Order) -> Mapping {
    let chunked = match order {
        Order::Grid => {
            return Mapping {
                builtin: "",
                prologue: Fragment::from("batch = wg.z;\n"),
                tile: "wg.x",
                head: "wg.y",
            };
        }
        Order::LongestFirst { chunked } => chunked,
    };
    // A stream is one head of one sequence; `group` streams make a chunk, the last
    // chunk's `here` may be fewer. Past WAVES chunks (`chunked`), grid order.
    let (group, keep) = match chunked {
        true => (
            format!("clamp(({CHUNK}u + n.x - 1u) / n.x, 1u, streams)"),
            format!("let lpt = n.x * streams < {}u;", CHUNK * WAVES),
        ),
        false => ("streams".into(), "let lpt = true;".into()),
    };
    let prologue = LONGEST_FIRST.fill([
        ("keep", Fragment::from(keep)),
        ("group", Fragment::from(group)),
    ]);
    Mapping {
        builtin: ", @builtin(num_workgroups) n: vec3<u32>",
        prologue,
        tile: match spec.op {
            Op::BackwardKv => "select(wg.x, at / here, lpt)",
            _ => "select(wg.x, n.x - 1u - at / here, lpt)",
        },
        head: "select(wg.y, stream % n.y, lpt)",
    }
}

/// The statements of the longest-first mapping: the workgroup's stream (head and
/// sequence) and its rank `at / here` among its chunk's tiles; `lpt` false where the grid
/// keeps grid order.
const LONGEST_FIRST: Template = Template {
    name: "longest_first",
    needs: &[],
    text: r#"let streams = n.y * n.z;
$keep
let id = (wg.z * n.y + wg.y) * n.x + wg.x;
let group = $group;
let chunk = id / (group * n.x);
let here = min(group, streams - chunk * group);
let at = id - chunk * group * n.x;
let stream = chunk * group + at % here;
batch = select(wg.z, stream / n.y, lpt);
"#,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Masks, Op};

    /// The prologue's arithmetic in Rust, statement for statement.
    fn place(id: u32, n: [u32; 3], chunked: bool, key_major: bool) -> (u32, u32, u32) {
        let streams = n[1] * n[2];
        if chunked && n[0] * streams >= CHUNK * WAVES {
            return (id % n[0], id / n[0] % n[1], id / (n[0] * n[1]));
        }
        let group = match chunked {
            true => CHUNK.div_ceil(n[0]).clamp(1, streams),
            false => streams,
        };
        let chunk = id / (group * n[0]);
        let here = group.min(streams - chunk * group);
        let at = id - chunk * group * n[0];
        let stream = chunk * group + at % here;
        let rank = at / here;
        let tile = if key_major { rank } else { n[0] - 1 - rank };
        (tile, stream % n[1], stream / n[1])
    }

    #[test]
    fn every_workgroup_takes_one_tile_longest_first_within_its_chunk() {
        let spec = |op| {
            KernelSpec::flash(
                "k",
                op,
                64,
                Masks::new(true, false),
                crate::configs::forward(64)[0],
            )
        };
        for (op, key_major) in [(Op::Forward, false), (Op::BackwardKv, true)] {
            let m = mapping(&spec(op), Order::LongestFirst { chunked: true });
            let rank = if key_major {
                "at / here"
            } else {
                "n.x - 1u - at / here"
            };
            assert_eq!(m.tile, format!("select(wg.x, {rank}, lpt)"));
            assert_eq!(m.head, "select(wg.y, stream % n.y, lpt)");
            let waves = format!("let lpt = n.x * streams < {}u;", CHUNK * WAVES);
            assert!(m.prologue.text.contains(&waves));
            assert!(
                m.prologue
                    .text
                    .contains(&format!("clamp(({CHUNK}u + n.x - 1u) / n.x, 1u, streams)"))
            );
        }
        for chunked in [true, false] {
            for n in [
                [32, 16, 1],
                [128, 16, 1],
                [7, 5, 3],
                [1, 1, 1],
                [300, 3, 2],
                [64, 12, 2],
                [8, 16, 3],
            ] {
                for key_major in [false, true] {
                    let total = n[0] * n[1] * n[2];
                    let mut seen = vec![false; total as usize];
                    let mut last: Option<(u32, u32)> = None;
                    for id in 0..total {
                        let (tile, head, batch) = place(id, n, chunked, key_major);
                        assert!(tile < n[0] && head < n[1] && batch < n[2], "{n:?} {id}");
                        let at = ((batch * n[1] + head) * n[0] + tile) as usize;
                        assert!(!seen[at], "{n:?}: tile {tile} of {head}/{batch} twice");
                        seen[at] = true;
                        // Within one chunk (the same first stream), tiles only get shorter.
                        let length = if key_major { n[0] - tile } else { tile + 1 };
                        let group = if chunked {
                            CHUNK.div_ceil(n[0]).clamp(1, n[1] * n[2])
                        } else {
                            n[1] * n[2]
                        };
                        let chunk = id / (group * n[0]);
                        let lpt = !chunked || total < CHUNK * WAVES;
                        if let Some((c, l)) = last
                            && c == chunk
                            && lpt
                        {
                            assert!(length <= l, "{n:?}: longer tile after a shorter one");
                        }
                        last = Some((chunk, length));
                    }
                    assert!(seen.iter().all(|s| *s));
                }
            }
        }
    }
}

//! The scratch contract between a producer (an s-major kernel that flushes scratch) and a
//! consumer (a j-major kernel that reads it), checked when the consumer's crate compiles:
//! the macro emits the producer's [`Scratch`] as a `const` and a `const` assertion in the
//! consumer, so naming a kernel that flushes nothing, or one with another layout or masks,
//! is a compile error.

use crate::flex::same_str;
use crate::spec::{Axis, Masks};

/// What a producer flushes: the tensor, its layout, and the masks that decide which
/// entries it writes (a consumer reads only entries its own masks make visible).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scratch {
    /// The scratch tensor's binding name (`p_ds`, `partials`).
    pub tensor: &'static str,
    /// Its index axes, outermost first.
    pub layout: &'static [Axis],
    /// The producer's masks, which decide the entries it writes.
    pub masks: Masks,
}

/// Whether `consumer` may read the scratch `producer` flushes. `const` so that the check
/// runs at compile time.
pub const fn compatible(producer: &Scratch, consumer: &Scratch) -> bool {
    same_str(producer.tensor, consumer.tensor)
        && same_axes(producer.layout, consumer.layout)
        && producer.masks.causal == consumer.masks.causal
        && producer.masks.document == consumer.masks.document
        && crate::flex::FlexRef::same(producer.masks.flex, consumer.masks.flex)
}

const fn same_axes(a: &[Axis], b: &[Axis]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] as u8 != b[i] as u8 {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Scratch = Scratch {
        tensor: "p_ds",
        layout: &[Axis::Part, Axis::S, Axis::H, Axis::J],
        masks: Masks::new(true, true),
    };

    #[test]
    fn layouts_and_masks_must_match() {
        assert!(compatible(&P, &P));
        assert!(!compatible(
            &P,
            &Scratch {
                layout: &[Axis::Part, Axis::H, Axis::S, Axis::J],
                ..P
            }
        ));
        assert!(!compatible(
            &P,
            &Scratch {
                masks: Masks::new(false, true),
                ..P
            }
        ));
        assert!(!compatible(&P, &Scratch { tensor: "p", ..P }));
    }
}

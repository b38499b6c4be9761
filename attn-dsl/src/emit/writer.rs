//! The WGSL writer: a kernel's text is built from named templates whose `$holes` are
//! filled with fragments, and from the numerics helpers those fragments declare they call.
//!
//! Why not `format!` and `.replace`: a marker matched by exact whitespace silently drops
//! code when an indentation changes, and a helper found by searching the body for its name
//! is included or not by accident. Here a hole is found by name or the emitter panics (every
//! emitter path runs in the snapshot and macro tests), a fill lands at its hole's
//! indentation, and a helper is emitted because a fragment said it calls it (`validate`
//! refuses a module that defines a helper nothing calls).

use super::numerics::Helper;

/// A set of numerics helpers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Needs(u8);

impl Needs {
    pub const NONE: Needs = Needs(0);

    pub const fn of(helpers: &[Helper]) -> Needs {
        let mut bits = 0;
        let mut i = 0;
        while i < helpers.len() {
            bits |= 1 << helpers[i] as u8;
            i += 1;
        }
        Needs(bits)
    }

    pub fn union(self, other: Needs) -> Needs {
        Needs(self.0 | other.0)
    }

    pub fn has(self, h: Helper) -> bool {
        self.0 & (1 << h as u8) != 0
    }
}

/// WGSL text with the helpers it calls.
#[derive(Clone, Debug, Default)]
pub(super) struct Fragment {
    pub text: String,
    pub needs: Needs,
}

impl Fragment {
    pub fn new(text: impl Into<String>, needs: &[Helper]) -> Fragment {
        Fragment {
            text: text.into(),
            needs: Needs::of(needs),
        }
    }

    /// `self` followed by `other`.
    pub fn then(mut self, other: Fragment) -> Fragment {
        self.text.push_str(&other.text);
        self.needs = self.needs.union(other.needs);
        self
    }
}

impl From<String> for Fragment {
    fn from(text: String) -> Fragment {
        Fragment {
            text,
            needs: Needs::NONE,
        }
    }
}

impl From<&str> for Fragment {
    fn from(text: &str) -> Fragment {
        Fragment::from(text.to_string())
    }
}

/// A WGSL template: text with `$name` holes (WGSL has no `$`), and the helpers its own text
/// calls.
///
/// A hole alone on its line takes a fragment of whole lines, written at the hole's
/// indentation (an empty fragment removes the line); a hole inside a line takes one line,
/// and is written `${name}` where letters or digits follow it.
pub(super) struct Template {
    pub name: &'static str,
    pub text: &'static str,
    pub needs: &'static [Helper],
}

impl Template {
    /// The template with every hole filled from `fills`, `(hole, fragment)`. Panics when a
    /// hole has no fill or a fill no hole: an emitter bug, which every test run finds.
    pub fn fill<'a>(&self, fills: impl IntoIterator<Item = (&'a str, Fragment)>) -> Fragment {
        let fills: Vec<(&str, Fragment)> = fills.into_iter().collect();
        let mut used = vec![false; fills.len()];
        let mut needs = Needs::of(self.needs);
        let mut take = |hole: &str| {
            let i = fills
                .iter()
                .position(|(name, _)| *name == hole)
                .unwrap_or_else(|| panic!("template `{}`: no fill for ${hole}", self.name));
            used[i] = true;
            needs = needs.union(fills[i].1.needs);
            fills[i].1.text.as_str()
        };
        let mut text = String::with_capacity(self.text.len());
        for line in self.text.split_inclusive('\n') {
            let trimmed = line.trim();
            if let Some(hole) = trimmed.strip_prefix('$').filter(|h| is_name(h)) {
                let indent = &line[..line.len() - line.trim_start().len()];
                let fill = take(hole);
                indent_into(&mut text, fill, indent);
                // A fill of one line without its newline still ends the template's line.
                if line.ends_with('\n') && !fill.is_empty() && !fill.ends_with('\n') {
                    text.push('\n');
                }
                continue;
            }
            let mut rest = line;
            while let Some(at) = rest.find('$') {
                text.push_str(&rest[..at]);
                let (hole, after) = hole_at(&rest[at + 1..]);
                let fill = take(hole);
                assert!(
                    fill.lines().count() <= 1,
                    "template `{}`: ${hole} sits inside a line but its fill has several",
                    self.name,
                );
                text.push_str(fill.trim_end_matches('\n'));
                rest = after;
            }
            text.push_str(rest);
        }
        if let Some(i) = used.iter().position(|u| !u) {
            panic!("template `{}` has no hole ${}", self.name, fills[i].0);
        }
        Fragment { text, needs }
    }

    /// The template, which has no holes.
    pub fn plain(&self) -> Fragment {
        self.fill([])
    }
}

/// The hole's name at the start of `text` (after its `$`) and the text after it: `name`,
/// or `{name}` where letters or digits follow the hole (`${i}u`).
fn hole_at(text: &str) -> (&str, &str) {
    if let Some(braced) = text.strip_prefix('{') {
        let end = braced.find('}').expect("a `${` hole closes with `}`");
        return (&braced[..end], &braced[end + 1..]);
    }
    let len = text.find(|c: char| !is_name_char(c)).unwrap_or(text.len());
    text.split_at(len)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_name_char)
}

/// Whole lines, one per item: unrolled per-register statements and the like.
pub(super) fn lines(each: impl IntoIterator<Item = String>) -> Fragment {
    let mut text = String::new();
    for line in each {
        text.push_str(&line);
        text.push('\n');
    }
    Fragment::from(text)
}

/// `parts` one after another.
pub(super) fn concat(parts: impl IntoIterator<Item = Fragment>) -> Fragment {
    parts.into_iter().fold(Fragment::default(), Fragment::then)
}

/// `n` as a WGSL u32 literal.
pub(super) fn uint(n: u32) -> Fragment {
    Fragment::from(format!("{n}u"))
}

/// Each line of `text` into `out` at indentation `indent` (blank lines stay empty).
fn indent_into(out: &mut String, text: &str, indent: &str) {
    for line in text.split_inclusive('\n') {
        if !line.trim().is_empty() {
            out.push_str(indent);
        }
        out.push_str(line);
    }
}

/// A kernel's WGSL under construction: the text after the declarations, and the helpers it
/// calls, which [`super::emit`] writes before it.
#[derive(Default)]
pub(super) struct Wgsl {
    text: String,
    needs: Needs,
}

impl Wgsl {
    pub fn new() -> Wgsl {
        Wgsl::default()
    }

    pub fn push_str(&mut self, s: &str) {
        self.text.push_str(s);
    }

    /// Writes `fragment` and records the helpers it calls.
    pub fn put(&mut self, fragment: Fragment) {
        self.text.push_str(&fragment.text);
        self.needs = self.needs.union(fragment.needs);
    }

    pub fn into_parts(self) -> (String, Needs) {
        (self.text, self.needs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Template = Template {
        name: "t",
        text: "fn f() {\n    let a = $x;\n    $body\n}\n",
        needs: &[Helper::Hsum],
    };

    #[test]
    fn holes_fill_at_their_indentation() {
        let f = T.fill([
            ("x", Fragment::from("1")),
            (
                "body",
                Fragment::new("if (a) {\n    b();\n}\n", &[Helper::Exp]),
            ),
        ]);
        assert_eq!(
            f.text,
            "fn f() {\n    let a = 1;\n    if (a) {\n        b();\n    }\n}\n"
        );
        assert!(f.needs.has(Helper::Hsum) && f.needs.has(Helper::Exp));
        assert!(!f.needs.has(Helper::Tanh));
    }

    #[test]
    fn a_braced_hole_may_be_followed_by_letters() {
        const U: Template = Template {
            name: "u",
            needs: &[],
            text: "let x_$i = ${i}u;\n",
        };
        assert_eq!(U.fill([("i", Fragment::from("3"))]).text, "let x_3 = 3u;\n");
    }

    #[test]
    fn an_empty_fill_removes_its_line() {
        let f = T.fill([("x", Fragment::from("1")), ("body", Fragment::from(""))]);
        assert_eq!(f.text, "fn f() {\n    let a = 1;\n}\n");
    }

    #[test]
    #[should_panic(expected = "no fill for $body")]
    fn a_missing_fill_is_an_emitter_bug() {
        T.fill([("x", Fragment::from("1"))]);
    }

    #[test]
    #[should_panic(expected = "has no hole $y")]
    fn a_fill_without_a_hole_is_an_emitter_bug() {
        T.fill([
            ("x", Fragment::from("1")),
            ("body", Fragment::from("")),
            ("y", Fragment::from("")),
        ]);
    }
}

//! The documentation's internal links resolve: every relative link in README.md and
//! docs/*.md names a file that exists, and every `#anchor` names a heading of its file by
//! GitHub's anchor rules. The README stays a front page (at most `README_MAX_LINES` lines);
//! the rest lives in docs/.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Component, Path, PathBuf};

const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// README.md and every docs/*.md, as paths relative to the workspace root.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![PathBuf::from("README.md")];
    let mut more: Vec<PathBuf> = fs::read_dir(root().join("docs"))
        .expect("docs/ exists")
        .map(|e| e.expect("a readable docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| Path::new("docs").join(p.file_name().unwrap()))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

fn read(path: &Path) -> String {
    fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The opening fence of a fenced code block: its character and length.
fn fence(line: &str) -> Option<(char, usize)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let rest = &line[indent..];
    let c = rest.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = rest.chars().take_while(|x| *x == c).count();
    // A backtick fence's info string may not contain a backtick.
    (n >= 3 && !(c == '`' && rest[n..].contains('`'))).then_some((c, n))
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut open: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        match open {
            Some((c, n)) => {
                let t = line.trim_start_matches(' ');
                let run = t.chars().take_while(|x| *x == c).count();
                if line.len() - t.len() <= 3 && run >= n && t[run..].trim().is_empty() {
                    open = None;
                }
            }
            None => match fence(line) {
                Some(f) => open = Some(f),
                None => out.push((i + 1, line)),
            },
        }
    }
    out
}

/// GitHub's anchor for a heading's text: lowercase; keep letters (any script), digits,
/// underscores, hyphens and spaces, drop everything else (backticks, punctuation,
/// symbols); spaces become hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a document's ATX headings, duplicates numbered as GitHub numbers them
/// (`x`, `x-1`, `x-2`, ...).
fn anchors(text: &str) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim_start_matches(' ');
        if line.len() - t.len() > 3 {
            continue;
        }
        let level = t.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&level) {
            continue;
        }
        let rest = &t[level..];
        if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
            continue;
        }
        // An optional closing sequence of `#`s.
        let mut title = rest.trim();
        let closed = title.trim_end_matches('#');
        if closed.is_empty() || closed.ends_with(' ') {
            title = closed.trim_end();
        }
        let base = anchor(&link_text(title));
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// A heading's text as GitHub renders it for its anchor: links reduced to their text.
fn link_text(title: &str) -> String {
    let mut out = String::new();
    let mut rest = title;
    while let Some((before, text, _, after)) = next_link(rest) {
        out.push_str(before);
        out.push_str(text);
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `s` with inline code spans blanked out (same length in bytes is not kept; only the
/// link syntax matters after this). A span is a run of n backticks up to the next run of
/// exactly n; an unmatched run is literal.
fn without_code(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'`' {
            let next = s[i..].find('`').map_or(s.len(), |k| i + k);
            out.push_str(&s[i..next]);
            i = next;
            continue;
        }
        let n = b[i..].iter().take_while(|c| **c == b'`').count();
        let mut j = i + n;
        let mut close = None;
        while j < b.len() {
            if b[j] == b'`' {
                let m = b[j..].iter().take_while(|c| **c == b'`').count();
                if m == n {
                    close = Some(j + m);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                out.push_str(" code ");
                i = end;
            }
            None => {
                out.push_str(&s[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// The first inline link `[text](target)` of `s`: the text before it, its text, its
/// target (without a title) and the text after it.
fn next_link(s: &str) -> Option<(&str, &str, &str, &str)> {
    let mut from = 0;
    loop {
        let open = from + s[from..].find('[')?;
        // The matching `]`, brackets nested.
        let mut depth = 0;
        let mut close = None;
        for (k, c) in s[open..].char_indices() {
            match c {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else {
            from = open + 1;
            continue;
        };
        if !s[close + 1..].starts_with('(') {
            from = open + 1;
            continue;
        }
        let start = close + 2;
        let mut depth = 1;
        let mut end = None;
        for (k, c) in s[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(start + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            from = open + 1;
            continue;
        };
        let inner = s[start..end].trim();
        let target = match inner.strip_prefix('<') {
            Some(t) => t.split('>').next().unwrap_or(""),
            None => inner.split_whitespace().next().unwrap_or(""),
        };
        return Some((&s[..open], &s[open + 1..close], target, &s[end + 1..]));
    }
}

/// Every link of a document outside fenced code and inline code: (line, target).
fn links(text: &str) -> Vec<(usize, String)> {
    // Paragraphs, so that a link or a code span broken over two lines is still seen whole.
    let mut out = Vec::new();
    let mut para: Vec<(usize, &str)> = Vec::new();
    let flush = |para: &mut Vec<(usize, &str)>, out: &mut Vec<(usize, String)>| {
        if para.is_empty() {
            return;
        }
        let first = para[0].0;
        let joined: Vec<&str> = para.iter().map(|(_, l)| *l).collect();
        let joined = without_code(&joined.join("\n"));
        let mut rest = joined.as_str();
        let mut consumed = 0;
        while let Some((before, _, target, after)) = next_link(rest) {
            consumed += before.len();
            let line = first + joined[..consumed].matches('\n').count();
            out.push((line, target.to_string()));
            consumed = joined.len() - after.len();
            rest = after;
        }
        para.clear();
    };
    let mut last = 0;
    for (n, line) in prose_lines(text) {
        if line.trim().is_empty() || n != last + 1 {
            flush(&mut para, &mut out);
        }
        if !line.trim().is_empty() {
            para.push((n, line));
        }
        last = n;
    }
    flush(&mut para, &mut out);
    out
}

/// `base` joined with a relative `target`, `.` and `..` resolved.
fn resolve(base: &Path, target: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in base.join(target).components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether a link leaves the repository (a scheme such as `https:` or `mailto:`).
fn external(target: &str) -> bool {
    let scheme: String = target.chars().take_while(|c| *c != ':').collect();
    scheme.len() < target.len()
        && !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

#[test]
fn internal_links_resolve() {
    let docs = documents();
    assert!(docs.len() > 1, "no docs/*.md found");
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let text = read(doc);
        let dir = doc.parent().unwrap_or(Path::new(""));
        for (line, target) in links(&text) {
            if target.is_empty() {
                problems.push(format!("{}:{line}: an empty link target", doc.display()));
                continue;
            }
            if external(&target) {
                continue;
            }
            checked += 1;
            let (file, fragment) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = match file {
                "" => doc.clone(),
                f => resolve(dir, f),
            };
            if !root().join(&path).exists() {
                problems.push(format!(
                    "{}:{line}: `{target}`: {} does not exist",
                    doc.display(),
                    path.display()
                ));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            if path.extension().is_none_or(|e| e != "md") {
                problems.push(format!(
                    "{}:{line}: `{target}`: an anchor into a file that is not markdown",
                    doc.display()
                ));
                continue;
            }
            let known = anchors(&read(&path));
            if !known.iter().any(|a| a == fragment) {
                problems.push(format!(
                    "{}:{line}: `{target}`: no heading of {} has the anchor `#{fragment}` (it has: {})",
                    doc.display(),
                    path.display(),
                    known.join(", ")
                ));
            }
        }
    }
    assert!(
        checked > 0,
        "no internal links found: is the link parser broken?"
    );
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn readme_is_a_front_page() {
    let lines = read(Path::new("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move the detail to docs/"
    );
}

#[test]
fn every_doc_links_back_to_the_readme() {
    for doc in documents().iter().filter(|d| d.starts_with("docs")) {
        let text = read(doc);
        let first = text.lines().next().unwrap_or("");
        assert!(
            first.starts_with("# "),
            "{} starts with no title",
            doc.display()
        );
        assert!(
            links(&text)
                .iter()
                .any(|(_, t)| t.split('#').next() == Some("../README.md")),
            "{} has no link back to README.md",
            doc.display()
        );
    }
}

#[test]
fn anchors_follow_github() {
    assert_eq!(
        anchor("Half precision and tensor cores"),
        "half-precision-and-tensor-cores"
    );
    assert_eq!(anchor("`attn` tool"), "attn-tool");
    assert_eq!(
        anchor("The runtime: tensors on the device, your device, your encoder"),
        "the-runtime-tensors-on-the-device-your-device-your-encoder"
    );
    assert_eq!(
        anchor("A dataflow that is not attention: fused LayerNorm + Linear"),
        "a-dataflow-that-is-not-attention-fused-layernorm--linear"
    );
    assert_eq!(
        anchor("Where the forward's time goes"),
        "where-the-forwards-time-goes"
    );
    assert_eq!(anchor("snake_case and x-y (z)"), "snake_case-and-x-y-z");
    assert_eq!(anchor("Über Größe é 日本"), "über-größe-é-日本");
    assert_eq!(
        anchors("# A\n## A\n```\n# B\n```\n### A ##\n"),
        ["a", "a-1", "a-2"]
    );
    let text = "See [one](a.md#x) and `[not](b.md)`, [two](\n<c d.md>) ```[no](e)```.\n\n```\n[no](f)\n```\n[three](g.md \"t\")";
    let got: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, ["a.md#x", "c d.md", "g.md"]);
    assert!(external("https://example.com") && external("mailto:a@b"));
    assert!(!external("docs/a.md") && !external("#x"));
}

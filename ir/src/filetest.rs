//! Data-driven tests over `*.kir` files: an input graph, a transformation, and
//! the expected printed result, all in one file.
//!
//! ```text
//! ; test fold_constants          <- required; handed to `run` as `FileTest::test`
//! ; target cpu                   <- optional
//! ; option max_iters=3           <- any number, `key=value`
//! graph {
//!   ...                          <- the input, in the text form (`crate::text`)
//! }
//! ; expect:
//! ; graph {
//! ;   ...                        <- `text::print` of the graph after `run`
//! ; }
//! ```
//!
//! The header is the run of comment lines at the top of the file. The
//! expectation block is the last thing in the file: `; expect:` followed by the
//! printed graph with every line prefixed by `; `, or one line
//! `; expect-error: <substring>` when `run` (or parsing the input) must fail
//! with a message containing the substring.
//!
//! [`run_dir`] with `BLESS=1` in the environment rewrites each expectation
//! block with what was actually produced instead of failing; review the diff.

use crate::text;
use crate::Graph;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// One test file's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileTest {
    pub path: PathBuf,
    /// What to run (`; test <name>`), e.g. a pass name.
    pub test: String,
    pub target: Option<String>,
    /// `; option key=value` lines, in file order.
    pub options: Vec<(String, String)>,
}

impl FileTest {
    /// The value of the first `; option key=...` line.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// What a file expects `run` to produce.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expectation {
    /// The printed graph (with a trailing newline).
    Graph(String),
    /// A substring of the error message.
    Error(String),
    /// No block yet (only acceptable when blessing).
    Missing,
}

/// A test file split into its parts.
struct Parsed {
    header: FileTest,
    /// Everything before the expectation block, verbatim.
    input: String,
    expect: Expectation,
}

const EXPECT: &str = "; expect:";
const EXPECT_ERROR: &str = "; expect-error:";

fn parse_file(path: &Path, src: &str) -> Result<Parsed, String> {
    let mut header = FileTest { path: path.to_path_buf(), test: String::new(), target: None, options: vec![] };
    for (i, line) in src.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(comment) = line.strip_prefix(';') else { break };
        let comment = comment.trim();
        let (key, rest) = comment.split_once(char::is_whitespace).unwrap_or((comment, ""));
        let rest = rest.trim();
        match key {
            "test" => header.test = rest.to_string(),
            "target" => header.target = Some(rest.to_string()),
            "option" => {
                let (k, v) =
                    rest.split_once('=').ok_or_else(|| format!("line {}: expected `; option key=value`", i + 1))?;
                header.options.push((k.trim().to_string(), v.trim().to_string()));
            }
            _ => {}
        }
    }
    if header.test.is_empty() {
        return Err("missing `; test <name>` header line".to_string());
    }

    let lines: Vec<&str> = src.lines().collect();
    let start = lines.iter().position(|l| {
        let l = l.trim_end();
        l == EXPECT || l.starts_with(EXPECT_ERROR)
    });
    let Some(start) = start else {
        return Ok(Parsed { header, input: src.to_string(), expect: Expectation::Missing });
    };
    let mut input: String = lines[..start].iter().map(|l| format!("{l}\n")).collect();
    if input.is_empty() {
        input.push('\n');
    }
    let first = lines[start].trim_end();
    let rest = &lines[start + 1..];
    let expect = if let Some(msg) = first.strip_prefix(EXPECT_ERROR) {
        if let Some(extra) = rest.iter().position(|l| !l.trim().is_empty()) {
            return Err(format!("line {}: nothing may follow `; expect-error:`", start + 2 + extra));
        }
        Expectation::Error(msg.trim().to_string())
    } else {
        let mut text = String::new();
        for (i, l) in rest.iter().enumerate() {
            let body = if let Some(b) = l.strip_prefix("; ") {
                b
            } else if let Some(b) = l.strip_prefix(';') {
                b
            } else if rest[i..].iter().all(|l| l.trim().is_empty()) {
                break;
            } else {
                return Err(format!("line {}: the `; expect:` block must end the file", start + 2 + i));
            };
            text.push_str(body);
            text.push('\n');
        }
        Expectation::Graph(text)
    };
    Ok(Parsed { header, input, expect })
}

/// Runs one file. `Ok(Some(text))` is the new file content when blessing changed it.
fn run_file(
    path: &Path,
    bless: bool,
    run: &dyn Fn(&FileTest, &mut Graph) -> Result<(), String>,
) -> Result<Option<String>, String> {
    let src = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    let parsed = parse_file(path, &src)?;
    // Parse errors count as errors of the run, so that the parser itself can be
    // tested with `; expect-error:`.
    let outcome = match text::parse(&parsed.input) {
        Ok(mut g) => run(&parsed.header, &mut g).map(|()| text::print(&g)),
        Err(e) => Err(format!("parse error: {e}")),
    };
    let matches = match (&parsed.expect, &outcome) {
        (Expectation::Graph(want), Ok(got)) => want == got,
        (Expectation::Error(want), Err(got)) => got.contains(want.as_str()),
        _ => false,
    };
    if matches {
        return Ok(None);
    }
    if bless {
        let mut out = parsed.input.clone();
        if !out.ends_with('\n') {
            out.push('\n');
        }
        match &outcome {
            Ok(printed) => {
                out.push_str(EXPECT);
                out.push('\n');
                for line in printed.lines() {
                    out.push_str(if line.is_empty() { ";" } else { "; " });
                    out.push_str(line);
                    out.push('\n');
                }
            }
            Err(e) => {
                // Only the first line: the block is a single comment line.
                let _ = writeln!(out, "{EXPECT_ERROR} {}", e.lines().next().unwrap_or(""));
            }
        }
        return Ok(Some(out));
    }
    Err(match (&parsed.expect, outcome) {
        (Expectation::Missing, Ok(got)) => format!("no `; expect:` block; the output was:\n{got}"),
        (Expectation::Missing, Err(e)) => format!("no expectation block; the run failed with: {e}"),
        (Expectation::Graph(want), Ok(got)) => format!("output differs:\n{}", diff(want, &got)),
        (Expectation::Graph(_), Err(e)) => format!("expected a graph, but the run failed: {e}"),
        (Expectation::Error(want), Err(e)) => format!("expected an error containing `{want}`, got: {e}"),
        (Expectation::Error(want), Ok(got)) => {
            format!("expected an error containing `{want}`, but the run succeeded:\n{got}")
        }
    })
}

/// Runs every `*.kir` file under `dir` (recursively, in path order) through
/// `run` and compares with its expectation. Returns the number of files; the
/// error lists every failing file with a diff. `BLESS=1` rewrites expectations.
pub fn run_dir(dir: &Path, run: &dyn Fn(&FileTest, &mut Graph) -> Result<(), String>) -> Result<usize, String> {
    let bless = std::env::var("BLESS").is_ok_and(|v| v == "1");
    run_dir_with(dir, bless, run)
}

/// [`run_dir`] with blessing chosen by the caller rather than the environment.
pub fn run_dir_with(
    dir: &Path,
    bless: bool,
    run: &dyn Fn(&FileTest, &mut Graph) -> Result<(), String>,
) -> Result<usize, String> {
    let mut files = vec![];
    collect_kir(dir, &mut files).map_err(|e| format!("{}: {e}", dir.display()))?;
    files.sort();
    let mut failures = String::new();
    let mut failed = 0;
    for path in &files {
        let result = run_file(path, bless, run).and_then(|new| match new {
            Some(text) => std::fs::write(path, text).map_err(|e| format!("cannot bless: {e}")),
            None => Ok(()),
        });
        if let Err(e) = result {
            failed += 1;
            let _ = writeln!(failures, "FAIL {}: {e}", path.display());
        }
    }
    if failed > 0 {
        return Err(format!(
            "{failed} of {} filetests failed (BLESS=1 rewrites expectations):\n\n{failures}",
            files.len()
        ));
    }
    Ok(files.len())
}

fn collect_kir(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_kir(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "kir") {
            out.push(path);
        }
    }
    Ok(())
}

/// A line diff (`-` expected, `+` actual) with two lines of context around
/// each change, from a longest-common-subsequence table.
fn diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    // lcs[i][j] = LCS length of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut script: Vec<(char, &str)> = vec![];
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            script.push((' ', a[i]));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] > lcs[i + 1][j]) {
            script.push(('+', b[j]));
            j += 1;
        } else {
            script.push(('-', a[i]));
            i += 1;
        }
    }
    const CONTEXT: usize = 2;
    let changed: Vec<bool> = script.iter().map(|(c, _)| *c != ' ').collect();
    let near_change = |k: usize| {
        let lo = k.saturating_sub(CONTEXT);
        let hi = (k + CONTEXT + 1).min(changed.len());
        changed[lo..hi].iter().any(|&c| c)
    };
    let mut out = String::from("--- expected\n+++ actual\n");
    let mut skipped = false;
    for (k, (c, line)) in script.iter().enumerate() {
        if near_change(k) {
            if skipped {
                out.push_str("@@ ... @@\n");
                skipped = false;
            }
            let _ = writeln!(out, "{c}{line}");
        } else {
            skipped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_marks_changes_with_context() {
        let d = diff("a\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nX\ne\nf\ng\n");
        assert_eq!(d, "--- expected\n+++ actual\n@@ ... @@\n b\n c\n-d\n+X\n e\n f\n");
    }

    #[test]
    fn header_and_blocks_are_split() {
        let src = "; test fold\n; target cpu\n; option a = 1\n\ngraph {\n}\n; expect:\n; graph {\n; }\n";
        let p = parse_file(Path::new("x.kir"), src).unwrap();
        assert_eq!(p.header.test, "fold");
        assert_eq!(p.header.target.as_deref(), Some("cpu"));
        assert_eq!(p.header.option("a"), Some("1"));
        assert_eq!(p.input, "; test fold\n; target cpu\n; option a = 1\n\ngraph {\n}\n");
        assert_eq!(p.expect, Expectation::Graph("graph {\n}\n".to_string()));
        let p = parse_file(Path::new("x.kir"), "; test t\ngraph {}\n; expect-error: boom\n").unwrap();
        assert_eq!(p.expect, Expectation::Error("boom".to_string()));
        assert!(parse_file(Path::new("x.kir"), "graph {}\n").is_err());
        assert!(parse_file(Path::new("x.kir"), "; test t\ngraph {}\n; expect:\n; graph {}\nstray\n").is_err());
    }
}

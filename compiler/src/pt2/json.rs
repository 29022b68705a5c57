//! Navigation over untrusted JSON that remembers where it is, so every error
//! names the member and the JSON path (`graph_module.graph.nodes[3].inputs[0]`).

use serde_json::Value;

/// A JSON structure error: where, what was expected, what was found.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{member}: at `{path}`: expected {expected}, found {found}")]
pub struct JsonError {
    pub member: String,
    pub path: String,
    pub expected: String,
    pub found: String,
}

/// A JSON value together with its path inside a named member.
#[derive(Clone, Copy)]
pub struct J<'a> {
    pub v: &'a Value,
    member: &'a str,
    path: &'a PathSeg<'a>,
}

/// Paths are a linked list of segments on the stack: cheap to extend, only
/// rendered to a string when an error happens.
pub enum PathSeg<'a> {
    Root,
    Key(&'a PathSeg<'a>, &'a str),
    Index(&'a PathSeg<'a>, usize),
}

impl PathSeg<'_> {
    fn render(&self) -> String {
        match self {
            PathSeg::Root => String::new(),
            PathSeg::Key(p, k) => {
                let head = p.render();
                if head.is_empty() {
                    k.to_string()
                } else {
                    format!("{head}.{k}")
                }
            }
            PathSeg::Index(p, i) => format!("{}[{i}]", p.render()),
        }
    }
}

pub static ROOT: PathSeg<'static> = PathSeg::Root;

/// Short description of a value for error messages.
pub fn describe(v: &Value) -> String {
    let s = match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("bool {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(a) => format!("array of {}", a.len()),
        Value::Object(o) => {
            let keys: Vec<&str> = o.keys().map(String::as_str).take(4).collect();
            format!("object {{{}}}", keys.join(", "))
        }
    };
    if s.len() > 80 {
        format!("{}…", &s[..s.char_indices().nth(77).map_or(s.len(), |(i, _)| i)])
    } else {
        s
    }
}

impl<'a> J<'a> {
    pub fn root(v: &'a Value, member: &'a str) -> J<'a> {
        J { v, member, path: &ROOT }
    }

    pub fn path(&self) -> String {
        self.path.render()
    }

    pub fn member(&self) -> &'a str {
        self.member
    }

    pub fn err(&self, expected: impl Into<String>) -> JsonError {
        JsonError {
            member: self.member.to_string(),
            path: self.path(),
            expected: expected.into(),
            found: describe(self.v),
        }
    }

    /// Calls `f` with the child at `key` (an error if missing or null).
    pub fn with<R>(&self, key: &str, f: impl FnOnce(J<'_>) -> Result<R, JsonError>) -> Result<R, JsonError> {
        let seg = PathSeg::Key(self.path, key);
        match self.v.get(key) {
            Some(v) if !v.is_null() => f(J { v, member: self.member, path: &seg }),
            _ => Err(JsonError {
                member: self.member.to_string(),
                path: seg.render(),
                expected: "a value".into(),
                found: "nothing (missing or null)".into(),
            }),
        }
    }

    /// Like [`J::with`] but a missing or null key gives `None`.
    pub fn with_opt<R>(
        &self,
        key: &str,
        f: impl FnOnce(J<'_>) -> Result<R, JsonError>,
    ) -> Result<Option<R>, JsonError> {
        let seg = PathSeg::Key(self.path, key);
        match self.v.get(key) {
            Some(v) if !v.is_null() => f(J { v, member: self.member, path: &seg }).map(Some),
            _ => Ok(None),
        }
    }

    /// Maps `f` over an array (missing or null counts as empty: torch omits
    /// empty fields in old versions).
    pub fn list<R>(&self, mut f: impl FnMut(J<'_>) -> Result<R, JsonError>) -> Result<Vec<R>, JsonError> {
        match self.v {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| f(J { v, member: self.member, path: &PathSeg::Index(self.path, i) }))
                .collect(),
            _ => Err(self.err("an array")),
        }
    }

    /// Maps `f` over an object's entries in file order.
    pub fn entries<R>(&self, mut f: impl FnMut(&str, J<'_>) -> Result<R, JsonError>) -> Result<Vec<R>, JsonError> {
        match self.v {
            Value::Null => Ok(Vec::new()),
            Value::Object(map) => {
                map.iter().map(|(k, v)| f(k, J { v, member: self.member, path: &PathSeg::Key(self.path, k) })).collect()
            }
            _ => Err(self.err("an object")),
        }
    }

    /// A one-key object (torch's encoding of a union): `(tag, payload)`.
    /// Keys whose value is null are skipped, since some writers emit every
    /// field of the union with nulls for the inactive ones.
    pub fn union<R>(&self, f: impl FnOnce(&str, J<'_>) -> Result<R, JsonError>) -> Result<R, JsonError> {
        let Value::Object(map) = self.v else { return Err(self.err("a one-key object (union)")) };
        let mut set = map.iter().filter(|(_, v)| !v.is_null());
        match (set.next(), set.next()) {
            (Some((k, v)), None) => f(k, J { v, member: self.member, path: &PathSeg::Key(self.path, k) }),
            // A union whose active field is itself null (`{"as_none": null}`).
            (None, None) if map.len() == 1 => {
                let (k, v) = map.iter().next().ok_or_else(|| self.err("a one-key object (union)"))?;
                f(k, J { v, member: self.member, path: &PathSeg::Key(self.path, k) })
            }
            _ => Err(self.err("a one-key object (union)")),
        }
    }

    pub fn str(&self) -> Result<&'a str, JsonError> {
        self.v.as_str().ok_or_else(|| self.err("a string"))
    }

    pub fn i64(&self) -> Result<i64, JsonError> {
        self.v.as_i64().ok_or_else(|| self.err("an integer"))
    }

    pub fn bool(&self) -> Result<bool, JsonError> {
        self.v.as_bool().ok_or_else(|| self.err("a bool"))
    }

    /// A float: a JSON number or one of torch's spellings of non-finite values.
    pub fn f64(&self) -> Result<f64, JsonError> {
        match self.v {
            Value::Number(n) => n.as_f64().ok_or_else(|| self.err("a float")),
            Value::String(s) => match s.as_str() {
                "Infinity" | "inf" => Ok(f64::INFINITY),
                "-Infinity" | "-inf" => Ok(f64::NEG_INFINITY),
                "NaN" | "nan" => Ok(f64::NAN),
                _ => Err(self.err("a float or \"Infinity\"/\"-Infinity\"/\"NaN\"")),
            },
            _ => Err(self.err("a float")),
        }
    }

    /// A string field, `None` if absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<String>, JsonError> {
        self.with_opt(key, |j| j.str().map(str::to_string))
    }
}

/// Parses JSON text, turning syntax errors into a [`JsonError`] with a position.
/// Bare `Infinity`/`NaN` tokens (torch 2.5 wrote them) are rewritten to strings.
pub fn parse(text: &str, member: &str) -> Result<Value, JsonError> {
    match serde_json::from_str(text) {
        Ok(v) => Ok(v),
        Err(first) => {
            let fixed = quote_bare_non_finite(text);
            serde_json::from_str(&fixed).map_err(|_| JsonError {
                member: member.to_string(),
                path: format!("line {} column {}", first.line(), first.column()),
                expected: "valid JSON".into(),
                found: first.to_string(),
            })
        }
    }
}

/// Quotes `Infinity`, `-Infinity` and `NaN` tokens outside strings.
fn quote_bare_non_finite(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        } else {
            let token = ["-Infinity", "Infinity", "NaN"].into_iter().find(|t| rest.starts_with(t));
            if let Some(t) = token {
                out.push('"');
                out.push_str(t);
                out.push('"');
                rest = &rest[t.len()..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

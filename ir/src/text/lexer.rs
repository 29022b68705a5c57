//! Tokens of the text form, each with the line and column it starts at.

use super::ParseError;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    /// `[A-Za-z_][A-Za-z0-9_]*`: keywords, op names, dtypes, symbol names.
    Ident(String),
    /// A numeric literal as written (sign included): `12`, `-0.5`, `1e-5`, `0x7fc00001`.
    Num(String),
    /// `%12`.
    Value(u32),
    /// A string literal with its escapes resolved.
    Str(String),
    /// `{ } [ ] ( ) , : = @ + * // % -` (a `-` is only a token when no digit follows).
    Punct(&'static str),
    Eof,
}

impl Tok {
    pub(super) fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("`{s}`"),
            Tok::Num(s) => format!("number `{s}`"),
            Tok::Value(n) => format!("`%{n}`"),
            Tok::Str(_) => "string".to_string(),
            Tok::Punct(p) => format!("`{p}`"),
            Tok::Eof => "end of input".to_string(),
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    pub(super) fn error(self, message: impl Into<String>) -> ParseError {
        ParseError { line: self.line, column: self.column, message: message.into() }
    }
}

struct Cursor<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    pos: Pos,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.pos.line += 1;
            self.pos.column = 1;
        } else {
            self.pos.column += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, out: &mut String, f: impl Fn(char) -> bool) {
        while let Some(c) = self.peek() {
            if !f(c) {
                break;
            }
            out.push(c);
            self.bump();
        }
    }
}

pub(super) fn lex(src: &str) -> Result<Vec<(Tok, Pos)>, ParseError> {
    let mut cur = Cursor { chars: src.chars().peekable(), pos: Pos { line: 1, column: 1 } };
    let mut toks = Vec::new();
    loop {
        let start = cur.pos;
        let Some(c) = cur.peek() else {
            toks.push((Tok::Eof, start));
            return Ok(toks);
        };
        let tok = match c {
            c if c.is_whitespace() => {
                cur.bump();
                continue;
            }
            ';' => {
                while cur.peek().is_some_and(|c| c != '\n') {
                    cur.bump();
                }
                continue;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut s = String::new();
                cur.take_while(&mut s, |c| c.is_ascii_alphanumeric() || c == '_');
                Tok::Ident(s)
            }
            c if c.is_ascii_digit() || c == '-' => {
                let mut s = String::new();
                cur.bump();
                s.push(c);
                if c == '-' && !cur.peek().is_some_and(|c| c.is_ascii_digit()) {
                    Tok::Punct("-")
                } else {
                    lex_number(&mut cur, &mut s);
                    Tok::Num(s)
                }
            }
            '%' => {
                cur.bump();
                if cur.peek().is_some_and(|c| c.is_ascii_digit()) {
                    let mut s = String::new();
                    cur.take_while(&mut s, |c| c.is_ascii_digit());
                    let n = s.parse::<u32>().map_err(|_| start.error(format!("value number `%{s}` is too large")))?;
                    Tok::Value(n)
                } else {
                    Tok::Punct("%")
                }
            }
            '"' => {
                cur.bump();
                Tok::Str(lex_string(&mut cur, start)?)
            }
            '/' => {
                cur.bump();
                if cur.peek() != Some('/') {
                    return Err(start.error("expected `//`"));
                }
                cur.bump();
                Tok::Punct("//")
            }
            _ => {
                const PUNCT: [&str; 11] = ["{", "}", "[", "]", "(", ")", ",", ":", "=", "@", "+"];
                let p = PUNCT.iter().find(|p| p.starts_with(c)).copied();
                let p = p.or(if c == '*' { Some("*") } else { None });
                match p {
                    Some(p) => {
                        cur.bump();
                        Tok::Punct(p)
                    }
                    None => return Err(start.error(format!("unexpected character `{c}`"))),
                }
            }
        };
        toks.push((tok, start));
    }
}

/// Continues a number whose first character (digit or `-`) is in `s`.
fn lex_number(cur: &mut Cursor<'_>, s: &mut String) {
    if s.ends_with('0') && cur.peek() == Some('x') {
        s.push('x');
        cur.bump();
        cur.take_while(s, |c| c.is_ascii_hexdigit());
        return;
    }
    cur.take_while(s, |c| c.is_ascii_digit());
    if cur.peek() == Some('.') {
        s.push('.');
        cur.bump();
        cur.take_while(s, |c| c.is_ascii_digit());
    }
    if matches!(cur.peek(), Some('e' | 'E')) {
        s.push('e');
        cur.bump();
        if let Some(sign @ ('+' | '-')) = cur.peek() {
            s.push(sign);
            cur.bump();
        }
        cur.take_while(s, |c| c.is_ascii_digit());
    }
}

fn lex_string(cur: &mut Cursor<'_>, start: Pos) -> Result<String, ParseError> {
    let mut s = String::new();
    loop {
        let pos = cur.pos;
        match cur.bump() {
            None => return Err(start.error("unterminated string")),
            Some('"') => return Ok(s),
            Some('\\') => match cur.bump() {
                Some('n') => s.push('\n'),
                Some('t') => s.push('\t'),
                Some('r') => s.push('\r'),
                Some('0') => s.push('\0'),
                Some('\\') => s.push('\\'),
                Some('"') => s.push('"'),
                Some('u') => {
                    if cur.bump() != Some('{') {
                        return Err(pos.error("expected `{` after `\\u`"));
                    }
                    let mut hex = String::new();
                    cur.take_while(&mut hex, |c| c.is_ascii_hexdigit());
                    if cur.bump() != Some('}') {
                        return Err(pos.error("expected `}` closing `\\u{...}`"));
                    }
                    let ch = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32);
                    s.push(ch.ok_or_else(|| pos.error(format!("invalid unicode escape `\\u{{{hex}}}`")))?);
                }
                _ => return Err(pos.error("unknown escape in string")),
            },
            Some(c) => s.push(c),
        }
    }
}

/// Quotes `s` so that [`lex_string`] reads it back unchanged.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

//! Size expressions: sympy `srepr` (torch ≥ 2.6:
//! `Add(Symbol('s17', positive=True, integer=True), Integer(1))`) and plain
//! infix (torch 2.5: `s0 + 1`, `2*s0`, `(s0//2)`), parsed into [`Dim`].
//!
//! One grammar covers both: a call `Name(args)` is a sympy constructor, a bare
//! identifier is a symbol.
//!
//! ```text
//! expr   := term (('+' | '-') term)*
//! term   := unary (('*' | '//' | '/' | '%') unary)*
//! unary  := '-' unary | power
//! power  := atom ('**' unary)?
//! atom   := INT | IDENT | IDENT '(' args ')' | '(' expr ')' | STRING
//! args   := [arg (',' arg)*]       arg := IDENT '=' atom | expr
//! ```

use kiln_ir::Dim;

/// A size expression that could not be parsed, with the offending text.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("cannot parse size expression `{expr}`: {detail}")]
pub struct SympyError {
    pub expr: String,
    pub detail: String,
}

/// Parses `text`, resolving symbol names with `symbol` (which may create them).
pub fn parse_dim(text: &str, symbol: &mut dyn FnMut(&str) -> Dim) -> Result<Dim, SympyError> {
    let err = |detail: String| SympyError { expr: text.to_string(), detail };
    let tokens = tokenize(text).map_err(err)?;
    // Bounds the depth of the resulting `Dim` tree (`Add(a, b, c, ...)` nests).
    if tokens.len() > MAX_TOKENS {
        return Err(err(format!("longer than {MAX_TOKENS} tokens")));
    }
    let mut p = Parser { tokens, pos: 0, symbol, depth: 0 };
    let value = p.expr().map_err(err)?;
    if p.pos != p.tokens.len() {
        return Err(err(format!("unexpected {:?} after the expression", p.tokens[p.pos])));
    }
    match value {
        Val::Dim(d) => Ok(d),
        other => Err(err(format!("expected an integer expression, found {other:?}"))),
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Int(i64),
    Ident(String),
    Str(String),
    Op(&'static str),
}

fn tokenize(text: &str) -> Result<Vec<Tok>, String> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() {
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let n = text[start..i]
                .parse::<i64>()
                .map_err(|_| format!("integer {} does not fit in i64", &text[start..i]))?;
            out.push(Tok::Int(n));
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(text[start..i].to_string()));
        } else if c == b'\'' || c == b'"' {
            let start = i + 1;
            let end = text[start..].find(c as char).ok_or("unterminated string")? + start;
            out.push(Tok::Str(text[start..end].to_string()));
            i = end + 1;
        } else {
            let ops = ["**", "//", "+", "-", "*", "/", "%", "(", ")", ",", "="];
            let op = ops
                .into_iter()
                .find(|o| text[i..].starts_with(o))
                .ok_or_else(|| format!("unexpected character {:?}", c as char))?;
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Ok(out)
}

/// Values during parsing: keyword flags and strings only appear as call arguments.
#[derive(Clone, Debug)]
enum Val {
    Dim(Dim),
    Str(String),
    Keyword,
}

struct Parser<'s> {
    tokens: Vec<Tok>,
    pos: usize,
    symbol: &'s mut dyn FnMut(&str) -> Dim,
    depth: usize,
}

/// Nesting limit: hostile inputs must not overflow the stack.
const MAX_DEPTH: usize = 200;
const MAX_TOKENS: usize = 4096;

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos)
    }

    fn eat(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Tok::Op(o)) if *o == op) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn dim(v: Val) -> Result<Dim, String> {
        match v {
            Val::Dim(d) => Ok(d),
            other => Err(format!("expected an integer expression, found {other:?}")),
        }
    }

    fn expr(&mut self) -> Result<Val, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err("expression nested too deeply".into());
        }
        let mut acc = self.term()?;
        loop {
            if self.eat("+") {
                let rhs = Self::dim(self.term()?)?;
                acc = Val::Dim(Dim::add(Self::dim(acc)?, rhs));
            } else if self.eat("-") {
                let rhs = Self::dim(self.term()?)?;
                acc = Val::Dim(Dim::add(Self::dim(acc)?, negate(rhs)));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Ok(acc)
    }

    fn term(&mut self) -> Result<Val, String> {
        let mut acc = self.unary()?;
        while let Some(Tok::Op(o @ ("*" | "//" | "/" | "%"))) = self.peek() {
            let op = *o;
            self.pos += 1;
            let rhs = Self::dim(self.unary()?)?;
            let lhs = Self::dim(acc)?;
            acc = Val::Dim(match op {
                "*" => Dim::mul(lhs, rhs),
                "%" => Dim::modulo(lhs, rhs),
                // `/` between sizes only appears for exact divisions (CleanDiv).
                _ => Dim::floor_div(lhs, rhs),
            });
        }
        Ok(acc)
    }

    fn unary(&mut self) -> Result<Val, String> {
        if self.eat("-") {
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return Err("expression nested too deeply".into());
            }
            let v = Self::dim(self.unary()?)?;
            self.depth -= 1;
            return Ok(Val::Dim(negate(v)));
        }
        let base = self.atom()?;
        if self.eat("**") {
            let exp = Self::dim(self.unary()?)?;
            return Ok(Val::Dim(power(Self::dim(base)?, exp)?));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Val, String> {
        match self.tokens.get(self.pos).cloned() {
            Some(Tok::Int(n)) => {
                self.pos += 1;
                Ok(Val::Dim(Dim::Const(n)))
            }
            Some(Tok::Str(s)) => {
                self.pos += 1;
                Ok(Val::Str(s))
            }
            Some(Tok::Op("(")) => {
                self.pos += 1;
                let v = self.expr()?;
                if !self.eat(")") {
                    return Err("missing `)`".into());
                }
                Ok(v)
            }
            Some(Tok::Ident(name)) => {
                self.pos += 1;
                if self.eat("(") {
                    let args = self.args()?;
                    self.call(&name, args)
                } else {
                    match name.as_str() {
                        "True" | "False" => Ok(Val::Keyword),
                        _ => Ok(Val::Dim((self.symbol)(&name))),
                    }
                }
            }
            Some(t) => Err(format!("unexpected {t:?}")),
            None => Err("unexpected end of expression".into()),
        }
    }

    /// Call arguments; keyword arguments (`positive=True`) are dropped.
    fn args(&mut self) -> Result<Vec<Val>, String> {
        let mut args = Vec::new();
        if self.eat(")") {
            return Ok(args);
        }
        loop {
            let is_keyword = matches!(self.peek(), Some(Tok::Ident(_)))
                && matches!(self.tokens.get(self.pos + 1), Some(Tok::Op("=")));
            if is_keyword {
                self.pos += 2;
                self.atom()?;
            } else {
                args.push(self.expr()?);
            }
            if self.eat(")") {
                return Ok(args);
            }
            if !self.eat(",") {
                return Err("expected `,` or `)` in argument list".into());
            }
        }
    }

    fn call(&mut self, name: &str, args: Vec<Val>) -> Result<Val, String> {
        let arity = |n: usize| -> Result<(), String> {
            if args.len() == n {
                Ok(())
            } else {
                Err(format!("{name} takes {n} arguments, got {}", args.len()))
            }
        };
        let dims = |args: Vec<Val>| args.into_iter().map(Self::dim).collect::<Result<Vec<_>, _>>();
        match name {
            "Symbol" => match args.first() {
                Some(Val::Str(s)) => Ok(Val::Dim((self.symbol)(s))),
                _ => Err("Symbol takes a quoted name".into()),
            },
            "Integer" => {
                arity(1)?;
                Ok(args.into_iter().next().ok_or("Integer takes 1 argument")?)
            }
            "Add" | "Mul" => {
                let mut ds = dims(args)?.into_iter();
                let first = ds.next().ok_or_else(|| format!("{name} takes at least 1 argument"))?;
                Ok(Val::Dim(ds.fold(first, |a, b| if name == "Add" { Dim::add(a, b) } else { Dim::mul(a, b) })))
            }
            // CleanDiv is FloorDiv known to be exact; IntTrueDiv never reaches sizes.
            "FloorDiv" | "CleanDiv" | "Mod" | "PythonMod" => {
                arity(2)?;
                let mut ds = dims(args)?.into_iter();
                let (a, b) = (ds.next().ok_or("missing operand")?, ds.next().ok_or("missing operand")?);
                Ok(Val::Dim(if name.ends_with("Mod") { Dim::modulo(a, b) } else { Dim::floor_div(a, b) }))
            }
            "Pow" => {
                arity(2)?;
                let mut ds = dims(args)?.into_iter();
                let (a, b) = (ds.next().ok_or("missing operand")?, ds.next().ok_or("missing operand")?);
                Ok(Val::Dim(power(a, b)?))
            }
            "Min" | "Max" => {
                let mut ds = dims(args)?.into_iter();
                let first = ds.next().ok_or_else(|| format!("{name} takes at least 1 argument"))?;
                ds.try_fold(first, |a, b| min_max_by_offset(name == "Min", a, b)).map(Val::Dim)
            }
            _ => Err(format!("unsupported function `{name}` (kiln's dimensions support + * // %)")),
        }
    }
}

/// `Min(a, b)` / `Max(a, b)` of two sizes that differ by a constant (torch's
/// `Min(s0, s0 - 1)` for an off-centre diagonal of a square): the smaller or
/// larger one, which holds at every size. Sizes whose order depends on the
/// symbols' values have no [`Dim`] form.
fn min_max_by_offset(min: bool, a: Dim, b: Dim) -> Result<Dim, String> {
    // The candidate offset from one evaluation point; the polynomial
    // comparison then proves `a == b + offset` for every value.
    let offset = a.eval(&|_| 7).saturating_sub(b.eval(&|_| 7));
    let shifted = Dim::add(b.clone(), Dim::Const(offset));
    if kiln_ir::infer::dims_equal(&a, &shifted, &kiln_ir::PrimaryMap::new()) != Some(true) {
        let what = if min { "Min" } else { "Max" };
        return Err(format!(
            "`{what}` of sizes whose order depends on their values (kiln's dimensions have no min/max)"
        ));
    }
    Ok(if (offset <= 0) == min { a } else { b })
}

fn negate(d: Dim) -> Dim {
    Dim::mul(Dim::Const(-1), d)
}

/// `base ** exp` for a small constant exponent, as repeated multiplication.
fn power(base: Dim, exp: Dim) -> Result<Dim, String> {
    match exp.as_const() {
        Some(n @ 0..=8) => Ok((0..n).fold(Dim::Const(1), |acc, _| Dim::mul(acc, base.clone()))),
        _ => Err("only small constant integer exponents are supported".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{Graph, SymbolId};

    fn parse(text: &str, g: &mut Graph) -> Result<Dim, SympyError> {
        parse_dim(text, &mut |name| {
            let id = g.symbol_by_name(name).unwrap_or_else(|| g.add_symbol(name, 0, None));
            Dim::Sym(id)
        })
    }

    fn show(text: &str) -> String {
        let mut g = Graph::new();
        match parse(text, &mut g) {
            Ok(d) => d.display(&g.symbols).to_string(),
            Err(e) => format!("error: {}", e.detail),
        }
    }

    #[test]
    fn srepr_forms() {
        assert_eq!(show("Symbol('s17', positive=True, integer=True)"), "s17");
        assert_eq!(show("Add(Symbol('s17', positive=True, integer=True), Integer(1))"), "(s17 + 1)");
        assert_eq!(show("Mul(Integer(2), Symbol('s27', positive=True, integer=True))"), "(2 * s27)");
        assert_eq!(show("FloorDiv(Symbol('s0', integer=True), Integer(2))"), "(s0 // 2)");
        assert_eq!(show("Mod(Symbol('s0'), Integer(4))"), "(s0 % 4)");
        assert_eq!(show("Add(Mul(Integer(2), Symbol('s0')), Symbol('s1'), Integer(-1))"), "(((2 * s0) + s1) + -1)");
        assert_eq!(show("Integer(7)"), "7");
        assert_eq!(show("Pow(Symbol('s0'), Integer(2))"), "(s0 * s0)");
    }

    #[test]
    fn min_max_of_sizes_a_constant_apart() {
        let s = "Symbol('s31', positive=True, integer=True)";
        assert_eq!(show(&format!("Min({s}, Add({s}, Integer(-1)))")), "(s31 + -1)");
        assert_eq!(show(&format!("Max({s}, Add({s}, Integer(-1)))")), "s31");
        assert_eq!(show(&format!("Min(Add({s}, Integer(2)), {s}, Add({s}, Integer(1)))")), "s31");
        assert_eq!(show("Min(Mul(Integer(2), s0), Add(s0, s0, Integer(3)))"), "(2 * s0)");
        // Which of `s0` and `s1` (or `3` and `s0`) is smaller depends on the values.
        assert!(
            show("Min(s0, s1)").starts_with("error: `Min` of sizes whose order depends"),
            "{}",
            show("Min(s0, s1)")
        );
        assert!(show("Max(Integer(3), s0)").starts_with("error: `Max`"), "{}", show("Max(Integer(3), s0)"));
    }

    #[test]
    fn infix_forms() {
        assert_eq!(show("s0 + 1"), "(s0 + 1)");
        assert_eq!(show("2*s0"), "(2 * s0)");
        assert_eq!(show("(s0//2) + s1*3"), "((s0 // 2) + (s1 * 3))");
        assert_eq!(show("s0 - 1"), "(s0 + -1)");
        assert_eq!(show("s0**2"), "(s0 * s0)");
        assert_eq!(show("4 + 4"), "8");
    }

    #[test]
    fn symbols_are_shared() {
        let mut g = Graph::new();
        let d = parse("Add(Symbol('s3'), Mul(Integer(3), Symbol('s3')))", &mut g).unwrap();
        assert_eq!(g.symbols.len(), 1);
        let mut syms: Vec<SymbolId> = Vec::new();
        d.collect_symbols(&mut syms);
        assert_eq!(syms.len(), 1);
        assert_eq!(d.eval(&|_| 5), 20);
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in [
            "",
            "Add(",
            "Symbol(",
            "s0 +",
            "Foo(s0)",
            "1.5",
            "s0 $ 1",
            "((((",
            "Symbol(1)",
            "99999999999999999999",
            "Pow(s0, s1)",
        ] {
            assert!(show(bad).starts_with("error"), "{bad:?} parsed: {}", show(bad));
        }
        let deep = format!("{}s0{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(show(&deep).starts_with("error"));
        let deep_neg = format!("{}s0", "-".repeat(10_000));
        assert!(show(&deep_neg).starts_with("error"));
    }

    #[test]
    fn extreme_integers_do_not_overflow() {
        // i64::MIN // -1 and % -1, as constants and when evaluated.
        assert_eq!(show("FloorDiv(-9223372036854775807 - 1, -1)"), "9223372036854775807");
        assert_eq!(show("Mod(-9223372036854775807 - 1, -1)"), "0");
        let mut g = Graph::new();
        let d = parse("FloorDiv(-9223372036854775807 - s0, -1)", &mut g).unwrap();
        assert_eq!(d.eval(&|_| 1), i64::MAX);
        assert_eq!(show("9223372036854775807 * 9223372036854775807 + 9223372036854775807"), "9223372036854775807");
    }
}

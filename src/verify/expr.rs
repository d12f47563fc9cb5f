//! A small LaTeX math expression parser (its trees are evaluated by [`super::eval`]).
//!
//! Parses normalised scalar answers: numbers (decimals, `1.5e3`), mixed numbers
//! (`2\frac{1}{2}`), `+ - * / ^`, `\cdot`, `\times`, `\div`, implicit multiplication,
//! `\frac`, `\sqrt`, `\sqrt[n]`, `\binom`, `!`, `|x|`, trigonometric / hyperbolic /
//! logarithmic functions (with or without parentheses, `\sin^2 x`, `\log_2 8`),
//! `\pi`, `e`, `i`, `\infty`, single-letter and Greek variables with subscripts, and
//! function values (`f(x)`, `I(0)`, `y'(0)`, `f^{-1}(x)`, `\operatorname{Var}(X)`,
//! `\gcd(a,b)`).
//! TeX argument rules apply to `\frac12` and `\sqrt2` (one digit per argument); an
//! unbraced exponent takes the whole number (`10^23`).
//!
//! A name followed by `(` is an application ([`Node::App`]) or a product by the rule in
//! the [`super`] documentation: always an application after `f`, `g`, `h`, a prime,
//! `f^{-1}`, `\operatorname{}` or an operator command; after other letters and Greek
//! letters only around one atomic argument (number, `-`number, variable, application)
//! or a comma-separated list. An application evaluates to `eval::application_value`: a
//! smooth nonlinear function of its argument values, drawn per name and per round, so
//! symbolic comparison treats it as a variable that equals only itself.
//!
//! Evaluation is in [`super::eval`]. The parse tree ([`Node`]) is what the two share.
//!
//! It does not know relations, sets or tuples (the caller splits those), and it is not a
//! CAS: nothing is simplified. Parsing is depth-limited ([`MAX_DEPTH`]) and token-limited
//! ([`MAX_TOKENS`]), so no input can overflow the stack; evaluation ticks the [`Budget`].

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::One;

use super::types::Budget;

/// Deepest bracket / argument nesting accepted by the parser.
pub const MAX_DEPTH: usize = 40;
/// Most tokens in one expression.
pub const MAX_TOKENS: usize = 600;
/// Longest digit string in a literal.
const MAX_LITERAL_DIGITS: usize = 400;
/// Largest decimal exponent in a literal like `1e300`.
const MAX_LITERAL_EXPONENT: i64 = 400;

/// A lexical token.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(String),
    Letter(char),
    Cmd(String),
    /// `\operatorname{name}`: a named operator, applied like a function.
    Op(String),
    Sym(char),
}

/// Elementary functions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fun {
    Sin,
    Cos,
    Tan,
    Cot,
    Sec,
    Csc,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Tanh,
    Ln,
    Log10,
    Exp,
}

/// An expression tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    Num(BigRational),
    Var(String),
    Pi,
    E,
    I,
    Infinity,
    Neg(Box<Node>),
    Add(Box<Node>, Box<Node>),
    Mul(Box<Node>, Box<Node>),
    Div(Box<Node>, Box<Node>),
    Pow(Box<Node>, Box<Node>),
    /// `Root(index, radicand)`.
    Root(Box<Node>, Box<Node>),
    Func(Fun, Box<Node>),
    Abs(Box<Node>),
    Fact(Box<Node>),
    Binom(Box<Node>, Box<Node>),
    /// A function's value `f(x)`, `I(0)`, `\operatorname{Var}(X)`: an opaque symbol of
    /// its name and arguments (see `eval::application_value`).
    App(String, Vec<Node>),
}

const FUNCTIONS: &[(&str, Fun)] = &[
    ("arcsin", Fun::Asin),
    ("arccos", Fun::Acos),
    ("arctan", Fun::Atan),
    ("sinh", Fun::Sinh),
    ("cosh", Fun::Cosh),
    ("tanh", Fun::Tanh),
    ("sin", Fun::Sin),
    ("cos", Fun::Cos),
    ("tan", Fun::Tan),
    ("cot", Fun::Cot),
    ("sec", Fun::Sec),
    ("csc", Fun::Csc),
    ("log", Fun::Log10),
    ("lg", Fun::Log10),
    ("ln", Fun::Ln),
    ("exp", Fun::Exp),
];
/// Bare (backslash-less) names recognised as commands, longest first.
const BARE_NAMES: &[&str] = &[
    "arcsin", "arccos", "arctan", "sqrt", "sinh", "cosh", "tanh", "sin", "cos", "tan", "cot",
    "sec", "csc", "log", "exp", "ln", "pi",
];
const GREEK: &[&str] = &[
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
];

/// Single letters that always name a function when a parenthesis follows (`f(x+1)`).
const FUNCTION_LETTERS: &[char] = &['f', 'g', 'h'];
/// Operator commands that are not evaluated but applied opaquely: `\gcd(12,18)`.
const OPERATORS: &[&str] = &[
    "gcd", "lcm", "max", "min", "det", "deg", "dim", "arg", "Pr", "Re", "Im", "ker",
];

/// Whether `name` is a known function name (bare or after a backslash).
pub fn is_function_name(name: &str) -> bool {
    FUNCTIONS.iter().any(|(n, _)| *n == name) || name == "sqrt"
}

/// Whether `name` (without its backslash) is a Greek letter the parser reads as a variable.
pub fn is_greek(name: &str) -> bool {
    GREEK.contains(&name)
}

/// Parse a normalised scalar expression. `None` when it is not a supported expression.
pub fn parse(s: &str, budget: &mut Budget) -> Option<Node> {
    let toks = tokenize(s)?;
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
        abs_depth: 0,
        budget,
    };
    let node = p.expr()?;
    (p.pos == p.toks.len()).then_some(node)
}

fn tokenize(s: &str) -> Option<Vec<Tok>> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        if out.len() > MAX_TOKENS {
            return None;
        }
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            let (tok, next) = lex_number(&chars, i);
            out.push(tok);
            i = next;
        } else if c.is_ascii_alphabetic() {
            let rest: String = chars.get(i..(i + 6).min(chars.len()))?.iter().collect();
            if let Some(name) = BARE_NAMES.iter().find(|n| rest.starts_with(**n)) {
                out.push(Tok::Cmd((*name).to_string()));
                i += name.len();
            } else {
                out.push(Tok::Letter(c));
                i += 1;
            }
        } else if c == '\\' {
            let name: String = chars
                .get(i + 1..)?
                .iter()
                .take_while(|c| c.is_ascii_alphabetic())
                .collect();
            if name.is_empty() {
                let tok = match chars.get(i + 1) {
                    Some('{') => Tok::Sym('('),
                    Some('}') => Tok::Sym(')'),
                    _ => return None,
                };
                out.push(tok);
                i += 2;
            } else if name == "operatorname" && chars.get(i + 1 + name.len()) == Some(&'{') {
                let start = i + 2 + name.len();
                let op: String = chars
                    .get(start..)?
                    .iter()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                if op.is_empty() || chars.get(start + op.len()) != Some(&'}') {
                    return None;
                }
                i = start + op.len() + 1;
                out.push(Tok::Op(op));
            } else {
                i += 1 + name.len();
                out.push(Tok::Cmd(name));
            }
        } else if "+-*/^_!()[]{}|=<>,'".contains(c) {
            out.push(Tok::Sym(c));
            i += 1;
        } else {
            return None;
        }
    }
    Some(out)
}

/// Digits with at most one point, then an optional `e±digits` exponent.
fn lex_number(chars: &[char], start: usize) -> (Tok, usize) {
    let mut i = start;
    let mut seen_dot = false;
    while let Some(&c) = chars.get(i) {
        if c.is_ascii_digit()
            || (c == '.' && !seen_dot && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            seen_dot |= c == '.';
            i += 1;
        } else {
            break;
        }
    }
    if matches!(chars.get(i), Some('e' | 'E')) {
        let mut j = i + 1;
        if matches!(chars.get(j), Some('+' | '-')) {
            j += 1;
        }
        if chars.get(j).is_some_and(char::is_ascii_digit) {
            while chars.get(j).is_some_and(char::is_ascii_digit) {
                j += 1;
            }
            i = j;
        }
    }
    let text: String = chars.get(start..i).unwrap_or(&[]).iter().collect();
    (Tok::Num(text), i)
}

/// A decimal / scientific literal as an exact rational.
pub fn parse_literal(s: &str) -> Option<BigRational> {
    let (mant, exp) = match s.find(['e', 'E']) {
        Some(p) => (s.get(..p)?, s.get(p + 1..)?.parse::<i64>().ok()?),
        None => (s, 0),
    };
    if mant.len() > MAX_LITERAL_DIGITS || exp.abs() > MAX_LITERAL_EXPONENT {
        return None;
    }
    let (int_part, frac_part) = mant.split_once('.').unwrap_or((mant, ""));
    let digits = format!("{int_part}{frac_part}");
    let numer: BigInt = if digits.is_empty() {
        return None;
    } else {
        digits.parse().ok()?
    };
    let scale = exp - i64::try_from(frac_part.len()).ok()?;
    let ten_pow = BigInt::from(10u32).pow(u32::try_from(scale.unsigned_abs()).ok()?);
    Some(if scale >= 0 {
        BigRational::from_integer(numer * ten_pow)
    } else {
        BigRational::new(numer, ten_pow)
    })
}

struct Parser<'b> {
    toks: Vec<Tok>,
    pos: usize,
    depth: usize,
    abs_depth: usize,
    budget: &'b mut Budget,
}

fn bx(n: Node) -> Box<Node> {
    Box::new(n)
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos)
    }

    fn peek_sym(&self, c: char) -> bool {
        self.peek() == Some(&Tok::Sym(c))
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn expect(&mut self, c: char) -> Option<()> {
        (self.next()? == Tok::Sym(c)).then_some(())
    }

    /// Enter one nesting level; fails beyond [`MAX_DEPTH`] or when time is up.
    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH && self.budget.tick()).then_some(())
    }

    fn expr(&mut self) -> Option<Node> {
        self.enter()?;
        let mut lhs = self.term()?;
        loop {
            if self.peek_sym('+') {
                self.pos += 1;
                lhs = Node::Add(bx(lhs), bx(self.term()?));
            } else if self.peek_sym('-') {
                self.pos += 1;
                lhs = Node::Add(bx(lhs), bx(Node::Neg(bx(self.term()?))));
            } else {
                break;
            }
        }
        self.depth -= 1;
        Some(lhs)
    }

    fn term(&mut self) -> Option<Node> {
        let mut lhs = self.unary()?;
        loop {
            if !self.budget.tick() {
                return None;
            }
            match self.peek() {
                Some(Tok::Sym('*')) => {
                    self.pos += 1;
                    lhs = Node::Mul(bx(lhs), bx(self.unary()?));
                }
                Some(Tok::Cmd(c)) if matches!(c.as_str(), "cdot" | "times" | "ast") => {
                    self.pos += 1;
                    lhs = Node::Mul(bx(lhs), bx(self.unary()?));
                }
                Some(Tok::Sym('/')) => {
                    self.pos += 1;
                    lhs = Node::Div(bx(lhs), bx(self.unary()?));
                }
                Some(Tok::Cmd(c)) if c == "div" => {
                    self.pos += 1;
                    lhs = Node::Div(bx(lhs), bx(self.unary()?));
                }
                Some(t) if self.starts_primary(t) => {
                    lhs = Node::Mul(bx(lhs), bx(self.power()?));
                }
                _ => break,
            }
        }
        Some(lhs)
    }

    fn starts_primary(&self, t: &Tok) -> bool {
        match t {
            Tok::Num(_) | Tok::Letter(_) | Tok::Op(_) => true,
            Tok::Sym(c) => matches!(c, '(' | '[' | '{') || (*c == '|' && self.abs_depth == 0),
            Tok::Cmd(c) => is_primary_cmd(c),
        }
    }

    fn unary(&mut self) -> Option<Node> {
        self.enter()?;
        let node = if self.peek_sym('-') {
            self.pos += 1;
            Node::Neg(bx(self.unary()?))
        } else if self.peek_sym('+') {
            self.pos += 1;
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Some(node)
    }

    fn power(&mut self) -> Option<Node> {
        let mut base = self.primary()?;
        while self.peek_sym('!') {
            self.pos += 1;
            base = Node::Fact(bx(base));
        }
        if self.peek_sym('^') {
            self.pos += 1;
            let exp = self.script_arg()?;
            base = Node::Pow(bx(base), bx(exp));
        }
        Some(base)
    }

    /// The argument of `^` or `_`: a group, a signed argument, or one primary.
    fn script_arg(&mut self) -> Option<Node> {
        self.enter()?;
        let node = if self.peek_sym('{') {
            self.pos += 1;
            let e = self.expr()?;
            self.expect('}')?;
            e
        } else if self.peek_sym('-') {
            self.pos += 1;
            Node::Neg(bx(self.script_arg()?))
        } else if self.peek_sym('+') {
            self.pos += 1;
            self.script_arg()?
        } else {
            self.primary()?
        };
        self.depth -= 1;
        Some(node)
    }

    /// A TeX macro argument: a group, or a single digit / letter / command.
    fn tex_arg(&mut self) -> Option<Node> {
        self.enter()?;
        let node = match self.peek()?.clone() {
            Tok::Sym('{') => {
                self.pos += 1;
                let e = self.expr()?;
                self.expect('}')?;
                e
            }
            Tok::Num(s) if s.len() > 1 && s.bytes().all(|b| b.is_ascii_digit()) => {
                let (first, rest) = s.split_at(1);
                let value = parse_literal(first)?;
                if let Some(slot) = self.toks.get_mut(self.pos) {
                    *slot = Tok::Num(rest.to_string());
                }
                Node::Num(value)
            }
            _ => self.primary()?,
        };
        self.depth -= 1;
        Some(node)
    }

    fn primary(&mut self) -> Option<Node> {
        self.enter()?;
        let node = match self.next()? {
            Tok::Num(s) => self.number(&s)?,
            Tok::Letter(c) => self.letter(c)?,
            Tok::Sym(open @ ('(' | '[' | '{')) => {
                let close = match open {
                    '(' => ')',
                    '[' => ']',
                    _ => '}',
                };
                let saved_abs = self.abs_depth;
                self.abs_depth = 0;
                let e = self.expr()?;
                self.abs_depth = saved_abs;
                self.expect(close)?;
                e
            }
            Tok::Sym('|') => {
                self.abs_depth += 1;
                let e = self.expr()?;
                self.abs_depth -= 1;
                self.expect('|')?;
                Node::Abs(bx(e))
            }
            Tok::Cmd(name) => self.command(&name)?,
            Tok::Op(name) => match FUNCTIONS.iter().find(|(n, _)| *n == name) {
                Some((_, f)) => self.function(*f)?,
                None if self.peek_sym('(') => self.application(name)?,
                None => return None,
            },
            Tok::Sym(_) => return None,
        };
        self.depth -= 1;
        Some(node)
    }

    /// A literal, or a mixed number `2\frac{1}{2}` when an integer is followed by a
    /// fraction of two integers.
    fn number(&mut self, s: &str) -> Option<Node> {
        let value = parse_literal(s)?;
        if s.bytes().all(|b| b.is_ascii_digit()) && self.simple_fraction_ahead() {
            let frac = self.primary()?;
            return Some(Node::Add(bx(Node::Num(value)), bx(frac)));
        }
        Some(Node::Num(value))
    }

    /// Whether the next tokens are `\frac{int}{int}` or `\frac12`.
    fn simple_fraction_ahead(&self) -> bool {
        let t = |k: usize| self.toks.get(self.pos + k);
        let is_int =
            |k: usize| matches!(t(k), Some(Tok::Num(n)) if n.bytes().all(|b| b.is_ascii_digit()));
        if t(0) != Some(&Tok::Cmd("frac".to_string())) {
            return false;
        }
        let braced = t(1) == Some(&Tok::Sym('{'))
            && is_int(2)
            && t(3) == Some(&Tok::Sym('}'))
            && t(4) == Some(&Tok::Sym('{'))
            && is_int(5)
            && t(6) == Some(&Tok::Sym('}'));
        let short = matches!(t(1), Some(Tok::Num(n)) if n.len() == 2 && n.bytes().all(|b| b.is_ascii_digit()));
        braced || short
    }

    fn letter(&mut self, c: char) -> Option<Node> {
        match c {
            'i' => return Some(Node::I),
            'e' => return Some(Node::E),
            _ => {}
        }
        self.named(c.to_string(), FUNCTION_LETTERS.contains(&c))
    }

    /// A variable or Greek name with its subscript, or its application to a
    /// parenthesised argument. See the module documentation for when a parenthesis
    /// after a name is an application: always after a function name (`always_applied`),
    /// a prime (`f'(x)`) or `f^{-1}`; otherwise only around an atomic argument or a
    /// comma-separated list. Anything else stays a variable (a product follows).
    fn named(&mut self, mut name: String, always_applied: bool) -> Option<Node> {
        if self.peek_sym('_') {
            self.pos += 1;
            name.push('_');
            name.push_str(&self.subscript_text()?);
        }
        let primes = self
            .toks
            .get(self.pos..)
            .unwrap_or(&[])
            .iter()
            .take_while(|t| **t == Tok::Sym('\''))
            .count();
        if primes > 0 {
            self.pos += primes;
            name.push_str(&"'".repeat(primes));
            return self.application(name);
        }
        if always_applied {
            if let Some(len) = self.inverse_ahead() {
                self.pos += len;
                name.push_str("^{-1}");
                return self.application(name);
            }
        }
        if self.peek_sym('(') && (always_applied || self.application_ahead(self.pos, 0)) {
            return self.application(name);
        }
        Some(Node::Var(name))
    }

    /// Length of `^{-1}` / `^-1` when it is followed by `(`.
    fn inverse_ahead(&self) -> Option<usize> {
        let t = |k: usize| self.toks.get(self.pos + k);
        let one = |k: usize| matches!(t(k), Some(Tok::Num(n)) if n == "1");
        let sym = |k: usize, c: char| t(k) == Some(&Tok::Sym(c));
        if !sym(0, '^') {
            return None;
        }
        if sym(1, '{') && sym(2, '-') && one(3) && sym(4, '}') && sym(5, '(') {
            return Some(5);
        }
        (sym(1, '-') && one(2) && sym(3, '(')).then_some(3)
    }

    /// Whether the group opening at `open` is an application's argument list for a name
    /// that is not a function name: it holds a top-level comma, or one atomic argument
    /// (a number, `-` a number, a variable or Greek letter with optional subscript, or
    /// itself an application).
    fn application_ahead(&self, open: usize, nesting: usize) -> bool {
        let Some(close) = self.group_end(open) else {
            return false;
        };
        let inner = self.toks.get(open + 1..close).unwrap_or(&[]);
        let mut depth = 0i64;
        for t in inner {
            match t {
                Tok::Sym('(' | '[' | '{') => depth += 1,
                Tok::Sym(')' | ']' | '}') => depth -= 1,
                Tok::Sym(',') if depth == 0 => return true,
                _ => {}
            }
        }
        self.atomic(open + 1, close, nesting)
    }

    /// Whether tokens `start..end` form one atomic argument (see [`Self::application_ahead`]).
    fn atomic(&self, start: usize, end: usize, nesting: usize) -> bool {
        let t = |k: usize| self.toks.get(k).filter(|_| k < end);
        match t(start) {
            Some(Tok::Num(_)) => start + 1 == end,
            Some(Tok::Sym('-')) => matches!(t(start + 1), Some(Tok::Num(_))) && start + 2 == end,
            Some(Tok::Letter(c)) => {
                self.name_tail(start + 1, end, FUNCTION_LETTERS.contains(c), nesting)
            }
            Some(Tok::Cmd(c)) if GREEK.contains(&c.as_str()) => {
                self.name_tail(start + 1, end, false, nesting)
            }
            _ => false,
        }
    }

    /// After a name: nothing, a subscript, or an application's group, up to `end`.
    fn name_tail(&self, mut k: usize, end: usize, head_is_function: bool, nesting: usize) -> bool {
        if self.toks.get(k) == Some(&Tok::Sym('_')) && k < end {
            k += 1;
            k = match self.toks.get(k) {
                Some(Tok::Sym('{')) => match self.group_end(k) {
                    Some(c) => c + 1,
                    None => return false,
                },
                Some(_) => k + 1,
                None => return false,
            };
        }
        if k == end {
            return true;
        }
        self.toks.get(k) == Some(&Tok::Sym('('))
            && self.group_end(k) == Some(end - 1)
            && nesting < MAX_DEPTH
            && (head_is_function || self.application_ahead(k, nesting + 1))
    }

    /// Index of the bracket closing the one at `open`.
    fn group_end(&self, open: usize) -> Option<usize> {
        let mut depth = 0i64;
        for (k, t) in self.toks.iter().enumerate().skip(open) {
            match t {
                Tok::Sym('(' | '[' | '{') => depth += 1,
                Tok::Sym(')' | ']' | '}') => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                return Some(k);
            }
        }
        None
    }

    /// `name(arg, ...)` with the parser at the `(`.
    fn application(&mut self, name: String) -> Option<Node> {
        self.enter()?;
        self.expect('(')?;
        let saved_abs = self.abs_depth;
        self.abs_depth = 0;
        let mut args = vec![self.expr()?];
        while self.peek_sym(',') {
            self.pos += 1;
            args.push(self.expr()?);
        }
        self.abs_depth = saved_abs;
        self.expect(')')?;
        self.depth -= 1;
        Some(Node::App(name, args))
    }

    /// The raw text of a subscript (`_1`, `_{n+1}`), used only as part of a name.
    fn subscript_text(&mut self) -> Option<String> {
        let mut text = String::new();
        if self.peek_sym('{') {
            self.pos += 1;
            let mut depth = 1usize;
            loop {
                let t = self.next()?;
                match t {
                    Tok::Sym('{') => depth += 1,
                    Tok::Sym('}') => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                text.push_str(&format!("{t:?}"));
            }
        } else {
            text = format!("{:?}", self.next()?);
        }
        Some(text)
    }

    fn command(&mut self, name: &str) -> Option<Node> {
        if let Some((_, f)) = FUNCTIONS.iter().find(|(n, _)| *n == name) {
            return self.function(*f);
        }
        match name {
            "frac" => {
                let num = self.tex_arg()?;
                let den = self.tex_arg()?;
                Some(Node::Div(bx(num), bx(den)))
            }
            "binom" => {
                let n = self.tex_arg()?;
                let k = self.tex_arg()?;
                Some(Node::Binom(bx(n), bx(k)))
            }
            "sqrt" => {
                let index = if self.peek_sym('[') {
                    self.pos += 1;
                    let e = self.expr()?;
                    self.expect(']')?;
                    e
                } else {
                    Node::Num(BigRational::from_integer(BigInt::from(2)))
                };
                let arg = self.tex_arg()?;
                Some(Node::Root(bx(index), bx(arg)))
            }
            "pi" => Some(Node::Pi),
            "infty" => Some(Node::Infinity),
            g if GREEK.contains(&g) => self.named(g.to_string(), false),
            op if OPERATORS.contains(&op) && self.peek_sym('(') => {
                self.application(format!("\\{op}"))
            }
            _ => None,
        }
    }

    /// `\sin x`, `\sin(x)`, `\sin^2 x`, `\sin^{-1} x`, `\log_2 8`.
    fn function(&mut self, f: Fun) -> Option<Node> {
        let mut f = f;
        let mut power = None;
        if self.peek_sym('^') {
            self.pos += 1;
            let p = self.script_arg()?;
            if p == Node::Neg(bx(Node::Num(BigRational::one()))) {
                f = match f {
                    Fun::Sin => Fun::Asin,
                    Fun::Cos => Fun::Acos,
                    Fun::Tan => Fun::Atan,
                    _ => return None,
                };
            } else {
                power = Some(p);
            }
        }
        let mut base = None;
        if self.peek_sym('_') {
            self.pos += 1;
            base = Some(self.tex_arg()?);
        }
        let arg = match self.peek() {
            Some(Tok::Sym('(' | '[' | '{')) => self.power()?,
            _ => {
                let mut a = self.power()?;
                while let Some(t) = self.peek() {
                    let is_fn = matches!(t, Tok::Cmd(c) if is_function_name(c));
                    if is_fn || !self.starts_primary(t) || !self.budget.tick() {
                        break;
                    }
                    a = Node::Mul(bx(a), bx(self.power()?));
                }
                a
            }
        };
        let mut node = match base {
            Some(b) => Node::Div(
                bx(Node::Func(Fun::Ln, bx(arg))),
                bx(Node::Func(Fun::Ln, bx(b))),
            ),
            None => Node::Func(f, bx(arg)),
        };
        if let Some(p) = power {
            node = Node::Pow(bx(node), bx(p));
        }
        Some(node)
    }
}

/// Commands that can start an operand (and so trigger implicit multiplication).
fn is_primary_cmd(c: &str) -> bool {
    matches!(c, "frac" | "sqrt" | "binom" | "pi" | "infty")
        || is_function_name(c)
        || GREEK.contains(&c)
        || OPERATORS.contains(&c)
}

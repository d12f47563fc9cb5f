//! Evaluation of parsed expressions ([`Node`] from [`super::expr`]): exact ([`exact`], big
//! rationals: refuses irrational results, exponents above [`MAX_EXACT_EXPONENT`] and results
//! above [`MAX_EXACT_BITS`] bits) or numeric ([`numeric`], complex `f64` with principal
//! branches; overflow gives non-finite values that never compare equal). An application
//! (`f(x)`) evaluates to [`application_value`], a smooth nonlinear function of its arguments
//! drawn per name and per round, so symbolic comparison treats it as a variable that equals
//! only itself. Every step ticks the [`Budget`].
//!
//! Knows nothing of LaTeX text: it walks trees.

use num_bigint::BigInt;
use num_complex::Complex64;
use num_rational::BigRational;
use num_traits::{One, Signed, ToPrimitive, Zero};

use super::expr::{Fun, Node};
use super::types::Budget;

/// Largest integer exponent evaluated exactly.
pub const MAX_EXACT_EXPONENT: u64 = 4096;
/// Largest estimated size (bits) of an exact power.
pub const MAX_EXACT_BITS: u64 = 1 << 15;

/// Names of the variables in `n`, sorted and deduplicated.
pub fn variables(n: &Node, out: &mut Vec<String>) {
    match n {
        Node::Var(v) => {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
        Node::Num(_) | Node::Pi | Node::E | Node::I | Node::Infinity => {}
        Node::Neg(a) | Node::Func(_, a) | Node::Abs(a) | Node::Fact(a) => variables(a, out),
        Node::App(name, args) => {
            let symbol = format!("{name}()");
            if !out.contains(&symbol) {
                out.push(symbol);
            }
            for a in args {
                variables(a, out);
            }
        }
        Node::Add(a, b)
        | Node::Mul(a, b)
        | Node::Div(a, b)
        | Node::Pow(a, b)
        | Node::Root(a, b)
        | Node::Binom(a, b) => {
            variables(a, out);
            variables(b, out);
        }
    }
}

/// Exact rational value, when the expression is rational and small enough.
pub fn exact(n: &Node, b: &mut Budget) -> Option<BigRational> {
    if !b.tick() {
        return None;
    }
    match n {
        Node::Num(r) => Some(r.clone()),
        Node::Neg(a) => Some(-exact(a, b)?),
        Node::Add(x, y) => Some(exact(x, b)? + exact(y, b)?),
        Node::Mul(x, y) => Some(exact(x, b)? * exact(y, b)?),
        Node::Div(x, y) => {
            let d = exact(y, b)?;
            if d.is_zero() {
                return None;
            }
            Some(exact(x, b)? / d)
        }
        Node::Pow(x, y) => exact_pow(&exact(x, b)?, &exact(y, b)?),
        Node::Root(idx, x) => {
            let k = exact(idx, b)?;
            if !k.is_integer() {
                return None;
            }
            let k = k.to_integer().to_u32().filter(|k| (2..=64).contains(k))?;
            exact_root(&exact(x, b)?, k)
        }
        Node::Abs(a) => Some(exact(a, b)?.abs()),
        Node::Fact(a) => {
            let v = small_int(&exact(a, b)?, 300)?;
            Some(BigRational::from_integer(
                (1..=v).fold(BigInt::one(), |acc, k| acc * k),
            ))
        }
        Node::Binom(x, y) => {
            let n = small_int(&exact(x, b)?, 100_000)?;
            let k = small_int(&exact(y, b)?, 1000)?;
            if k > n {
                return Some(BigRational::zero());
            }
            let mut acc = BigInt::one();
            for j in 0..k {
                acc = acc * (n - j) / (j + 1);
            }
            Some(BigRational::from_integer(acc))
        }
        Node::Var(_)
        | Node::Pi
        | Node::E
        | Node::I
        | Node::Infinity
        | Node::Func(..)
        | Node::App(..) => None,
    }
}

/// A nonnegative integer value no larger than `max`.
fn small_int(r: &BigRational, max: u64) -> Option<u64> {
    if !r.is_integer() {
        return None;
    }
    r.to_integer().to_u64().filter(|v| *v <= max)
}

/// `base^exp` for an integer exponent, or a rational exponent whose root is exact.
fn exact_pow(base: &BigRational, exp: &BigRational) -> Option<BigRational> {
    let q = exp.denom().to_u32().filter(|q| (1..=64).contains(q))?;
    let p = exp.numer();
    let p_abs = p.abs().to_u64().filter(|p| *p <= MAX_EXACT_EXPONENT)?;
    let bits = base.numer().bits().saturating_add(base.denom().bits());
    if bits.saturating_mul(p_abs) > MAX_EXACT_BITS {
        return None;
    }
    let root = if q == 1 {
        base.clone()
    } else {
        exact_root(base, q)?
    };
    let e = u32::try_from(p_abs).ok()?;
    let powered = BigRational::new(root.numer().pow(e), root.denom().pow(e));
    if p.is_negative() {
        if powered.is_zero() {
            return None;
        }
        Some(powered.recip())
    } else {
        Some(powered)
    }
}

/// The exact `k`-th root of `x`, when it is rational.
fn exact_root(x: &BigRational, k: u32) -> Option<BigRational> {
    if x.is_negative() {
        if k.is_multiple_of(2) {
            return None;
        }
        return exact_root(&-x, k).map(|r| -r);
    }
    let n = x.numer().nth_root(k);
    let d = x.denom().nth_root(k);
    if n.pow(k) == *x.numer() && d.pow(k) == *x.denom() {
        Some(BigRational::new(n, d))
    } else {
        None
    }
}

/// A rational as `f64` (non-finite when out of range).
pub fn rational_to_f64(r: &BigRational) -> f64 {
    r.to_f64().unwrap_or(f64::NAN)
}

/// Numeric value with variables taken from `env`. `None` when time runs out.
pub fn numeric(n: &Node, env: &dyn Fn(&str) -> f64, b: &mut Budget) -> Option<Complex64> {
    if !b.tick() {
        return None;
    }
    let re = |x: f64| Complex64::new(x, 0.0);
    Some(match n {
        Node::Num(r) => re(rational_to_f64(r)),
        Node::Var(v) => re(env(v)),
        Node::Pi => re(std::f64::consts::PI),
        Node::E => re(std::f64::consts::E),
        Node::I => Complex64::new(0.0, 1.0),
        Node::Infinity => re(f64::INFINITY),
        Node::Neg(a) => -numeric(a, env, b)?,
        Node::Add(x, y) => numeric(x, env, b)? + numeric(y, env, b)?,
        Node::Mul(x, y) => numeric(x, env, b)? * numeric(y, env, b)?,
        Node::Div(x, y) => numeric(x, env, b)? / numeric(y, env, b)?,
        Node::Pow(x, y) => complex_pow(numeric(x, env, b)?, numeric(y, env, b)?),
        Node::Root(k, x) => complex_root(numeric(k, env, b)?, numeric(x, env, b)?),
        Node::Func(f, a) => apply(*f, numeric(a, env, b)?),
        Node::Abs(a) => re(numeric(a, env, b)?.norm()),
        Node::Fact(a) => re(factorial_f64(numeric(a, env, b)?)),
        Node::Binom(x, y) => re(binom_f64(numeric(x, env, b)?, numeric(y, env, b)?)),
        Node::App(name, args) => {
            let mut values = Vec::with_capacity(args.len());
            for a in args {
                values.push(numeric(a, env, b)?);
            }
            application_value(name, &values, env)
        }
    })
}

/// The value of the application `name(args)`: a smooth, nonlinear function of the
/// argument values whose shape is drawn from `env` under names no variable can have
/// (`f#0`, `f#1`, ...). Equal arguments give equal values (`f(1+1)` is `f(2)`); other
/// arguments, other names and other rounds of `env` give unrelated values, so an
/// application behaves like a variable that no simplification removes.
pub fn application_value(name: &str, args: &[Complex64], env: &dyn Fn(&str) -> f64) -> Complex64 {
    let p = |k: usize| env(&format!("{name}#{k}"));
    let mut s = Complex64::new(0.0, 0.0);
    for (j, a) in args.iter().enumerate() {
        s += a * p(4 + j);
    }
    Complex64::new(p(0), 0.0) + (s * p(1) + p(2)).sin() * p(3)
}

/// Turn a negative zero into a positive one so branch cuts do not depend on it.
fn unsign_zero(z: Complex64) -> Complex64 {
    Complex64::new(z.re + 0.0, z.im + 0.0)
}

fn complex_pow(base: Complex64, exp: Complex64) -> Complex64 {
    let base = unsign_zero(base);
    if exp.im == 0.0 && exp.re.fract() == 0.0 && exp.re.abs() <= 1024.0 {
        // The guard above makes the cast exact.
        return base.powi(exp.re as i32);
    }
    if base == Complex64::new(0.0, 0.0) && exp.re > 0.0 {
        return base;
    }
    if base.im == 0.0 && base.re > 0.0 && exp.im == 0.0 {
        return Complex64::new(base.re.powf(exp.re), 0.0);
    }
    base.powc(exp)
}

/// The real odd root of a negative real, otherwise the principal root.
fn complex_root(k: Complex64, x: Complex64) -> Complex64 {
    let x = unsign_zero(x);
    if k.im == 0.0 && k.re == 2.0 {
        if x.im == 0.0 && x.re >= 0.0 {
            return Complex64::new(x.re.sqrt(), 0.0);
        }
        return x.sqrt();
    }
    if k.im == 0.0 && x.im == 0.0 && x.re < 0.0 && k.re.fract() == 0.0 && (k.re as i64) % 2 == 1 {
        return Complex64::new(-(-x.re).powf(1.0 / k.re), 0.0);
    }
    complex_pow(x, Complex64::new(1.0, 0.0) / k)
}

fn apply(f: Fun, z: Complex64) -> Complex64 {
    let z = unsign_zero(z);
    let one = Complex64::new(1.0, 0.0);
    match f {
        Fun::Sin => z.sin(),
        Fun::Cos => z.cos(),
        Fun::Tan => z.tan(),
        Fun::Cot => one / z.tan(),
        Fun::Sec => one / z.cos(),
        Fun::Csc => one / z.sin(),
        Fun::Asin => z.asin(),
        Fun::Acos => z.acos(),
        Fun::Atan => z.atan(),
        Fun::Sinh => z.sinh(),
        Fun::Cosh => z.cosh(),
        Fun::Tanh => z.tanh(),
        Fun::Ln => z.ln(),
        Fun::Log10 => z.ln() / std::f64::consts::LN_10,
        Fun::Exp => z.exp(),
    }
}

fn factorial_f64(z: Complex64) -> f64 {
    if z.im != 0.0 || z.re < 0.0 || z.re.fract() != 0.0 || z.re > 170.0 {
        return f64::NAN;
    }
    (1..=(z.re as u32)).fold(1.0, |acc, k| acc * f64::from(k))
}

fn binom_f64(n: Complex64, k: Complex64) -> f64 {
    if n.im != 0.0 || k.im != 0.0 || k.re < 0.0 || k.re.fract() != 0.0 || k.re > 1000.0 {
        return f64::NAN;
    }
    (0..(k.re as u32)).fold(1.0, |acc, j| acc * (n.re - f64::from(j)) / f64::from(j + 1))
}

#[cfg(test)]
mod tests {
    use super::super::expr::parse;
    use super::*;
    use std::time::Duration;

    fn ex(s: &str) -> Option<BigRational> {
        let mut b = Budget::new(Duration::from_secs(1));
        let n = parse(s, &mut b)?;
        exact(&n, &mut b)
    }

    fn r(n: i64, d: i64) -> Option<BigRational> {
        Some(BigRational::new(BigInt::from(n), BigInt::from(d)))
    }

    #[test]
    fn exact_values() {
        assert_eq!(ex("\\frac{1}{2}"), r(1, 2));
        assert_eq!(ex("\\frac12"), r(1, 2));
        assert_eq!(ex("\\frac{270}7"), r(270, 7));
        assert_eq!(ex("2\\frac{1}{2}"), r(5, 2));
        assert_eq!(ex("-2\\frac12"), r(-5, 2));
        assert_eq!(ex("137\\frac{1}{2}"), r(275, 2));
        assert_eq!(ex("3\\times10^{5}"), r(300_000, 1));
        assert_eq!(ex("1.5e3"), r(1500, 1));
        assert_eq!(ex("2^-1"), r(1, 2));
        assert_eq!(ex("\\sqrt{16}"), r(4, 1));
        assert_eq!(ex("\\sqrt[3]{-8}"), r(-2, 1));
        assert_eq!(ex("5!"), r(120, 1));
        assert_eq!(ex("\\binom{5}{2}"), r(10, 1));
        assert_eq!(ex("|-3|"), r(3, 1));
        assert_eq!(ex("0.0000672"), r(672, 10_000_000));
        assert_eq!(ex("\\sqrt{2}"), None);
        assert_eq!(ex("10^{10^{10^{10}}}"), None);
    }

    #[test]
    fn parse_failures_are_none() {
        let mut b = Budget::new(Duration::from_secs(1));
        for s in [
            "",
            "(",
            "1+",
            "\\frac{1}",
            "x_",
            "\\unknown",
            "1,2",
            "\\\\",
            "a=b",
        ] {
            assert!(parse(s, &mut b).is_none(), "{s}");
        }
        let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(parse(&deep, &mut b).is_none());
    }

    #[test]
    fn applications_and_products() {
        let mut b = Budget::new(Duration::from_secs(1));
        let mut app = |s: &str| matches!(parse(s, &mut b), Some(Node::App(..)));
        for s in [
            "f(x)",
            "f(x+1)",
            "h(2t)",
            "I(0)",
            "x(t)",
            "V(-1)",
            "\\phi(t_0)",
            "y'(0)",
            "f^{-1}(x)",
            "\\operatorname{Var}(X)",
            "P(1,6)",
            "t(g(16))",
            "\\gcd(12,18)",
            "x_1(t)",
        ] {
            assert!(app(s), "{s} should be an application");
        }
        for s in [
            "x(x+1)",
            "2(x+1)",
            "(a)(b)",
            "c(2b-a)",
            "i(2)",
            "e(1)",
            "\\mu(m+M)",
            "\\sin(x)",
            "x^2(x+1)",
            "\\pi(2)",
        ] {
            assert!(!app(s), "{s} should not be an application");
        }
        assert!(parse("x'", &mut b).is_none());
    }

    #[test]
    fn numeric_functions() {
        let mut b = Budget::new(Duration::from_secs(1));
        let n = parse("\\sin^2 x+\\cos^2x", &mut b).unwrap();
        let v = numeric(&n, &|_| 0.7, &mut b).unwrap();
        assert!((v.re - 1.0).abs() < 1e-12);
        let n = parse("\\log_2 8", &mut b).unwrap();
        assert!((numeric(&n, &|_| 0.0, &mut b).unwrap().re - 3.0).abs() < 1e-12);
        let n = parse("10^{10^{10^{10}}}", &mut b).unwrap();
        assert!(!numeric(&n, &|_| 0.0, &mut b).unwrap().re.is_finite());
    }
}

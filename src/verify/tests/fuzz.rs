//! Adversarial inputs that must stay fast, and the randomised run over the grammar of
//! applications and times (`grammar_fuzz`, ignored by default).

use super::*;

#[track_caller]
fn quick(completion: &str, gold: &str) {
    let start = Instant::now();
    let v = grade(completion, gold, &GradeOptions::default());
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "took {took:?}, verdict {v:?}"
    );
}

#[test]
fn adversarial_inputs_are_fast() {
    let deep = format!("\\boxed{{{}1{}}}", "{".repeat(100_000), "}".repeat(100_000));
    quick(&deep, "1");
    let deep_parens = format!("\\boxed{{{}1{}}}", "(".repeat(100_000), ")".repeat(100_000));
    quick(&deep_parens, "1");
    let open_only = "{".repeat(100_000);
    quick(&format!("\\boxed{{{open_only}"), "1");
    quick("\\boxed{10^{10^{10^{10}}}}", "10^{10^{10^{10}}}");
    quick("\\boxed{10^{10^{10^{10}}}}", "1");
    quick("\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}", "4");
    quick("\\boxed{9999999999999999999!}", "1");
    quick("\\boxed{\\binom{10^{9}}{10^{8}}}", "1");
    quick("\\boxed{1e999999999}", "1");
    let mb = "word 12 \\frac{1}{2} ".repeat(60_000);
    quick(&mb, "1");
    quick(&format!("{mb}\\boxed{{{mb}}}"), "1");
    let long_sum = format!("\\boxed{{{}}}", vec!["x"; 5000].join("+"));
    quick(&long_sum, "5000x");
    let long_list = format!("\\boxed{{{}}}", vec!["1"; 5000].join(","));
    quick(&long_list, &vec!["1"; 5000].join(","));
    let sets = format!(
        "\\boxed{{{}1{}}}",
        "\\{".repeat(10_000),
        "\\}".repeat(10_000)
    );
    quick(&sets, "1");
    quick(&format!("\\boxed{{{}}}", "\\sqrt".repeat(50_000)), "1");
    quick(&format!("\\boxed{{{}}}", "-".repeat(100_000)), "1");
    quick(&format!("\\boxed{{{}}}", "\\text{".repeat(1000)), "1");
    quick(&format!("\\boxed{{{}}}", "(1,".repeat(1000)), "1");
    quick(&"</think>".repeat(100_000), "1");
}

/// Randomised run over the grammar of applications and times: no panics, bounded time,
/// symmetric verdicts on well-formed pairs, `f(X)` equal to `f(Y)` exactly when `X`
/// equals `Y`, and times equal exactly when they mean the same clock reading.
/// `VERIFY_FUZZ_SECS` sets the duration (default 10 s), `VERIFY_FUZZ_SEED` the seed.
#[test]
#[ignore = "long randomised run; cargo test --lib verify::tests::fuzz::grammar_fuzz -- --ignored"]
fn grammar_fuzz() {
    let secs: f64 = std::env::var("VERIFY_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let seed: u64 = std::env::var("VERIFY_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001);
    let mut g = Gen(seed | 1);
    let opts = GradeOptions::default();
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let (mut pairs, mut accepted) = (0u64, 0u64);
    let mut b = Budget::new(Duration::from_secs(3600));
    while Instant::now() < deadline {
        // 1. Expressions: symmetric verdicts, and no panic on mutated forms.
        let (p, q) = (g.expr(0), g.expr(0));
        let q = if g.below(3) == 0 {
            p.replace("(", " (")
        } else {
            q
        };
        let start = Instant::now();
        let pq = is_equivalent(&p, &q, &opts);
        let qp = is_equivalent(&q, &p, &opts);
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{p:?} vs {q:?} slow"
        );
        if pq != Reason::Timeout && qp != Reason::Timeout {
            assert_eq!(
                pq.is_correct(),
                qp.is_correct(),
                "asymmetric: {p:?} vs {q:?}"
            );
        }
        assert!(eq(&p, &p).is_correct(), "not reflexive: {p:?}");
        let (mp, mq) = (g.mutate(&p), g.mutate(&q));
        let _ = is_equivalent(&mp, &q, &opts);
        let _ = grade(&format!("\\boxed{{{mp}}}"), &mq, &opts);
        // 2. Applications compare by their argument's value.
        let (x, y) = (g.constant(0), g.constant(0));
        let same = {
            let vx =
                expr::parse(&normalize_answer(&x), &mut b).and_then(|n| eval::exact(&n, &mut b));
            let vy =
                expr::parse(&normalize_answer(&y), &mut b).and_then(|n| eval::exact(&n, &mut b));
            vx.is_some() && vx == vy
        };
        let head = g.pick(&["f", "I", "x", "\\phi", "\\operatorname{Var}"]);
        let (fx, fy) = (format!("{head}({x})"), format!("{head}({y})"));
        let r = eq(&fx, &fy);
        // A weak head (`x`, `I`) applied to a compound argument is a product, so only
        // the function name `f` and the operator name are held to this.
        if matches!(head, "f" | "\\operatorname{Var}") {
            assert_eq!(r.is_correct(), same, "{fx:?} vs {fy:?}: {r:?}");
        }
        // 3. Times.
        let ((t1, m1), (t2, m2)) = (g.time(), g.time());
        let r = eq(&t1, &t2);
        assert_eq!(
            r.is_correct(),
            m1 == m2,
            "{t1:?} {m1:?} vs {t2:?} {m2:?}: {r:?}"
        );
        pairs += 3;
        accepted += u64::from(pq.is_correct()) + u64::from(r.is_correct());
    }
    println!("grammar fuzz: {pairs} pairs in {secs} s, {accepted} accepted");
}

/// A tiny deterministic generator (xorshift64*) for the grammar fuzz below.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs.get(self.below(xs.len())).copied().unwrap_or("")
    }

    /// A constant argument (for `f(X)` vs `f(Y)`), as text.
    fn constant(&mut self, depth: usize) -> String {
        let n = self.below(6);
        match self.below(if depth > 2 { 1 } else { 5 }) {
            0 => n.to_string(),
            1 => format!("{}+{}", self.constant(depth + 1), self.constant(depth + 1)),
            2 => format!("\\frac{{{}}}{{{}}}", self.constant(depth + 1), n + 1),
            3 => format!("{}\\cdot{}", self.constant(depth + 1), n),
            _ => format!("-{n}"),
        }
    }

    /// An expression of the application grammar.
    fn expr(&mut self, depth: usize) -> String {
        let atoms = [
            "x", "t", "n", "a", "R", "L", "2", "0", "1", "\\theta", "\\omega", "x_1",
        ];
        let heads = [
            "f",
            "g",
            "h",
            "I",
            "P",
            "x",
            "y",
            "V",
            "\\phi",
            "\\mathrm{Var}",
            "\\operatorname{Var}",
            "f'",
            "y''",
            "f^{-1}",
            "\\gcd",
            "\\sin",
            "\\ln",
        ];
        if depth > 3 {
            return self.pick(&atoms).to_string();
        }
        match self.below(9) {
            0 | 1 => {
                let head = self.pick(&heads);
                let arg = if self.below(3) == 0 {
                    self.expr(depth + 1)
                } else {
                    self.pick(&atoms).to_string()
                };
                if self.below(5) == 0 {
                    format!("{head}({arg},{})", self.pick(&atoms))
                } else {
                    format!("{head}({arg})")
                }
            }
            2 => format!("{}{}", self.expr(depth + 1), self.expr(depth + 1)),
            3 => format!("{}+{}", self.expr(depth + 1), self.expr(depth + 1)),
            4 => format!("{}({})", self.pick(&atoms), self.expr(depth + 1)),
            5 => format!("e^{{-\\frac{{{}}}{{RC}}}}", self.expr(depth + 1)),
            6 => format!(
                "\\frac{{{}}}{{{}}}",
                self.expr(depth + 1),
                self.expr(depth + 1)
            ),
            7 => format!("({})({})", self.expr(depth + 1), self.expr(depth + 1)),
            _ => self.pick(&atoms).to_string(),
        }
    }

    /// A time of day in a random spelling, with its meaning `(minute of the day or
    /// minute of the half-day, half: 0 none, 1 a.m., 2 p.m.)`.
    fn time(&mut self) -> (String, (u32, u32, u8)) {
        let hour = 1 + self.below(12) as u32;
        let minute = [0u32, 5, 30, 45][self.below(4)];
        let half = self.below(3) as u8;
        let suffix = match half {
            0 => "",
            1 => self.pick(&[" a.m.", "\\text{ a.m.}", " AM", "am", "\\,\\mathrm{am}"]),
            _ => self.pick(&[" p.m.", "\\text{ p.m.}", " PM", "pm", "\\,\\mathrm{pm}"]),
        };
        let clock = if self.below(2) == 0 {
            format!("{hour}:{minute:02}")
        } else {
            format!("{hour:02}:{minute:02}")
        };
        let text = match self.below(3) {
            0 if half != 0 && !suffix.contains('\\') => format!("\\text{{{clock}{suffix}}}"),
            1 if half == 2 && hour != 12 => format!("{}:{minute:02}", hour + 12),
            1 if half == 2 => format!("12:{minute:02}"),
            1 if half == 1 && hour == 12 => format!("0:{minute:02}"),
            _ => format!("{clock}{suffix}"),
        };
        // A 24-hour `16:30` is p.m. and `0:30` is a.m.; `12:30` without a suffix is bare.
        let meaning = match (
            half,
            text.contains(':') && !text.contains('m') && !text.contains('M'),
        ) {
            (2, true) if hour != 12 => (hour, minute, 2),
            (2, true) => (hour, minute, 0),
            (1, true) if hour == 12 => (hour, minute, 1),
            _ => (hour, minute, half),
        };
        (text, meaning)
    }

    /// `s` with a few random grammar characters inserted or removed.
    fn mutate(&mut self, s: &str) -> String {
        let mut chars: Vec<char> = s.chars().collect();
        for _ in 0..1 + self.below(3) {
            let at = self.below(chars.len() + 1);
            if self.below(2) == 0 && at < chars.len() {
                chars.remove(at);
            } else {
                let c =
                    ['(', ')', '\'', '^', '{', '}', ',', ':', '.', '-', '_', '\\'][self.below(12)];
                chars.insert(at, c);
            }
        }
        chars.into_iter().collect()
    }
}

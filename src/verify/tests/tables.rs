//! Tables of pairs that must be equal and pairs that must differ, by kind (`probe_table`), and
//! answers with units (`units_table`).

use super::*;

/// Probes of the answer forms from the verifier issue, by kind: each kind has pairs that
/// must be equal and pairs that must differ. Extraction cases go through [`grade`] with
/// the default options (`(completion, gold, correct)`); the others through
/// [`is_equivalent`] (`(pred, gold, equal)`).
#[test]
fn probe_table() {
    let o = GradeOptions::default();
    // 1. Several boxes in one completion.
    let boxes: &[(&str, &str, bool)] = &[
        ("So $x=\\boxed{4}, \\boxed{9}$.", "4, 9", true),
        ("The roots are $\\boxed{4}$ and $\\boxed{9}$.", "4, 9", true),
        (
            "The roots are $\\boxed{9}$, $\\boxed{4}$",
            "\\{4, 9\\}",
            true,
        ),
        ("\\boxed{(1,2)}, \\boxed{(3,4)}", "(1,2),(3,4)", true),
        ("\\boxed{3} or \\boxed{5}", "3, 5", true),
        (
            "First \\boxed{210}, then more work. So the final answer is $2,310$.",
            "2310",
            true,
        ),
        ("We get \\boxed{12}.\n\nAnswer: 15", "15", true),
        ("\\boxed{7}\n#### 8", "8", true),
        ("\\boxed{4}, \\boxed{9}", "9", true),
        (
            "\\boxed{5}. We check it: so our answer is correct.",
            "5",
            true,
        ),
        ("\\boxed{4}, \\boxed{9}", "4", false),
        ("\\boxed{4}, \\boxed{9}", "4, 9, 16", false),
        ("\\boxed{4}, \\boxed{8}", "4, 9", false),
        ("\\boxed{4} is wrong, redo: \\boxed{9}", "4, 9", false),
        (
            "First \\boxed{210}, then more work. So the final answer is $2,310$.",
            "210",
            false,
        ),
        ("\\boxed{(1,2)}, \\boxed{(3,4)}", "(1,2),(3,5)", false),
        ("We get \\boxed{12}.\n\nAnswer: 15", "12", false),
    ];
    // 5. Free-text answers with no box: the closing sentence's value.
    let statements: &[(&str, &str, bool)] = &[
        ("So the smallest $k$ is 12.", "12", true),
        (
            "Thus the number of ways is $\\frac{5}{2}$.",
            "\\frac52",
            true,
        ),
        ("Therefore, $x = 5$.", "5", true),
        ("Adding up, the total equals 42.", "42", true),
        ("The possible values are $3$ and $5$.", "3, 5", true),
        ("The answer is $3$ or $5$.", "3, 5", true),
        ("First we find that $a = 3$. Then the sum is 7.", "7", true),
        ("So the smallest $k$ is 12.", "13", false),
        ("First we find that $a = 3$. Then the sum is 7.", "3", false),
        ("The sum is 7. Hence we are done.", "7", false),
        ("we get 12 and 13", "12", false),
        ("So $2x = 10$.", "10", false),
        ("The value is at least 12.", "12", false),
    ];
    let mut wrong = Vec::new();
    for (kind, table) in [("boxes", boxes), ("statements", statements)] {
        for (completion, gold, want) in table {
            let v = grade(completion, gold, &o);
            if v.correct != *want {
                wrong.push((kind, *completion, *gold, v.reason, v.extracted));
            }
        }
    }
    // 2. Labelled gold or prediction.
    let labels: &[(&str, &str, bool)] = &[
        ("(a,b)=(5,1)", "(5,1)", true),
        ("(5,1)", "(a,b)=(5,1)", true),
        ("(a, b) = (5, 1)", "(a,b)=(5,1)", true),
        ("AB:CD=3:7", "3:7", true),
        ("3:7", "AB:CD = 3:7", true),
        ("|PQ|=2", "2", true),
        ("|PQ| = 2", "2", true),
        ("y\\approx 7", "7", true),
        ("y \\approx 7", "y=7", true),
        ("f(x)=1", "1", true),
        ("\\angle ABC = 30^\\circ", "30", true),
        ("\\pi\\approx 3.14", "\\pi", true),
        ("(a,b)=(5,1)", "(1,5)", false),
        ("AB:CD=3:7", "7:3", false),
        ("|PQ|=2", "3", false),
        ("y\\approx 7", "8", false),
        ("x=5", "y=5", false),
        ("2x=10", "10", false),
        ("2x = 10", "5", false),
        ("x^2=4", "4", false),
    ];
    // 3. Inequalities and intervals.
    let inequalities: &[(&str, &str, bool)] = &[
        ("t<3", "-t>-3", true),
        ("-t>-3", "t<3", true),
        ("-t>-3", "(-\\infty,3)", true),
        ("0<g(t)<2", "(0,2)", true),
        ("2\\le|w|\\le 5", "[-5,-2]\\cup[2,5]", true),
        ("|x|<2", "(-2,2)", true),
        ("|x|\\ge 3", "(-\\infty,-3]\\cup[3,\\infty)", true),
        ("x_1 > 0", "(0,\\infty)", true),
        ("\\theta\\le\\pi", "(-\\infty,\\pi]", true),
        ("t<3", "t\\le 3", false),
        ("t<3", "t>3", false),
        ("(0,2)", "[0,2]", false),
        ("-t>-3", "t>3", false),
        ("0<g(t)<2", "[0,2]", false),
        ("2\\le|w|\\le 5", "[2,5]", false),
        ("2\\le|w|\\le 5", "[-5,-2]\\cup(2,5]", false),
    ];
    // 4. Set and list notation, percent words.
    let sets: &[(&str, &str, bool)] = &[
        ("\\{1,1,2\\}", "\\{1,2\\}", true),
        ("\\{1,2\\}", "\\{2,2,1\\}", true),
        ("(1;4;-3)", "(1,4,-3)", true),
        ("(1; 4; -3)", "(1,4,-3)", true),
        ("3 or 5", "3, 5", true),
        ("3 \\text{ or } 5", "3, 5", true),
        ("\\pm 7", "{-7, 7}", true),
        ("{-7, 7}", "\\pm 7", true),
        ("15 percent", "15\\%", true),
        ("15 percent", "15", true),
        ("15\\%", "15 per cent", true),
        ("\\{1,1,2\\}", "\\{1,2,3\\}", false),
        ("1, 1, 2", "1, 2", false),
        ("(1;4;-3)", "(1,-3,4)", false),
        ("(1;4;-3)", "(1,4,3)", false),
        ("3 or 5", "3, 6", false),
        ("\\pm 7", "{-7, 8}", false),
        ("15 percent", "16\\%", false),
    ];
    // 6. Trailing punctuation and stray backslashes.
    let punctuation: &[(&str, &str, bool)] = &[
        ("B", "\\boxed{B}.", true),
        ("42\\", "42", true),
        ("42", "42\\", true),
        ("42.", "42", true),
        ("42\\\\", "42", true),
        ("$42$.", "42", true),
        ("42\\", "43", false),
        ("C", "\\boxed{B}.", false),
    ];
    // 7. False accepts: list commas, units.
    let commas: &[(&str, &str, bool)] = &[
        ("300,400", "300400", true),
        ("2,310", "2310", true),
        ("300, 400", "400, 300", true),
        ("300, 400", "300400", false),
        ("300400", "300, 400", false),
    ];
    let units: &[(&str, &str, bool)] = &[
        ("20^\\circ", "20^\\circ C", true),
        ("20^{\\circ}\\text{C}", "20", true),
        ("20^\\circ C", "20 degrees Celsius", true),
        ("20^\\circ\\mathrm{C}", "20^{\\circ} C", true),
        ("20 degrees", "20^\\circ F", true),
        ("3 pears", "3", true),
        ("3 pears", "3 pear", true),
        ("3 \\text{ pears}", "3 pears", true),
        ("\\$7", "7", true),
        ("\\$7", "7 dollars", true),
        ("7 cents", "7", true),
        ("20^{\\circ}\\text{C}", "20^{\\circ}\\text{F}", false),
        ("20^\\circ C", "20^\\circ F", false),
        ("20 °C", "20 °F", false),
        ("3 pears", "3 plums", false),
        ("7 \\text{ apples}", "7 \\text{ oranges}", false),
        ("\\$7", "7 cents", false),
        ("7 cents", "\\$7", false),
    ];
    for (kind, table) in [
        ("labels", labels),
        ("inequalities", inequalities),
        ("sets", sets),
        ("punctuation", punctuation),
        ("commas", commas),
        ("units", units),
    ] {
        for (pred, gold, want) in table {
            let r = eq(pred, gold);
            if r.is_correct() != *want {
                wrong.push((kind, *pred, *gold, r, None));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // extraction details: the method and the joined boxes
    let e = extract_answer("So the smallest $k$ is 12.", &o).unwrap();
    assert_eq!(
        (e.answer.as_str(), e.method),
        ("12", ExtractMethod::Statement)
    );
    let e = extract_answer("$\\boxed{4}$ and $\\boxed{9}$", &o).unwrap();
    assert_eq!(
        (e.answer.as_str(), e.list_alternative.as_deref()),
        ("9", Some("4, 9"))
    );
    let v = grade("$\\boxed{4}$ and $\\boxed{9}$", "4, 9", &o);
    assert_eq!(v.extracted.as_deref(), Some("4, 9"));
    let v = grade(
        "\\boxed{1}, \\boxed{2}. So the final answer is $3$.",
        "3",
        &o,
    );
    assert_eq!((v.correct, v.extracted.as_deref()), (true, Some("3")));
}

/// Answers with units: a number with a unit equals the bare number (either side); two answers
/// that both carry units are equal only in the same unit, however it is written (Minerva's
/// `\mathrm{~cm}`, `\text{ cm}`, `cm`, `centimeters`); different units are a rejection, and
/// units are never converted.
#[test]
fn units_table() {
    let same = [
        ("1.6 \\mathrm{~cm}", "1.6"),
        ("1.6", "1.6 \\mathrm{~cm}"),
        ("1.6 \\mathrm{~cm}", "1.6\\text{ cm}"),
        ("1.6\\text{ cm}", "1.6 cm"),
        ("1.6 centimeters", "1.6 \\mathrm{~cm}"),
        ("5\\text{ m}", "5 meters"),
        ("5 meters", "5 metres"),
        ("5\\,\\mathrm{m}", "5\\text{ m}"),
        ("3 \\mathrm{~m/s}", "3"),
        ("3 \\mathrm{~m/s}", "3\\text{ m/s}"),
        ("2 \\mathrm{~km} \\mathrm{~s}^{-1}", "2"),
        (
            "2 \\mathrm{~km} \\mathrm{~s}^{-1}",
            "2 \\mathrm{~km} \\mathrm{~s}^{-1}",
        ),
        ("4 \\mu\\mathrm{m}", "4"),
        ("4 \\mu\\mathrm{m}", "4\\mu \\mathrm{m}"),
        ("2\\AA", "2"),
        ("2 \\AA", "2\\AA"),
        ("7 \\mathrm{~s}", "7 seconds"),
        ("2 hours", "2 \\text{ hr}"),
        ("2 hours", "2 h"),
        ("30 minutes", "30\\text{ min}"),
        ("12 \\text{ kg}", "12 kilograms"),
        ("9.8 \\mathrm{~m} \\mathrm{~s}^{-2}", "9.8"),
        ("300 \\mathrm{~K}", "300"),
        ("300 \\mathrm{~K}", "300 kelvin"),
        ("6 \\text{ in}", "6 inches"),
        ("3 feet", "3 \\text{ ft}"),
        ("12 square feet", "12"),
        ("12 square feet", "12 \\text{ ft}^2"),
        ("10\\text{ cm}^2", "10"),
        ("10\\text{ cm}^2", "10 \\mathrm{~cm}^{2}"),
        ("\\frac{1}{2} \\mathrm{~J}", "0.5"),
        ("\\frac{1}{2} \\mathrm{~J}", "\\frac12 joules"),
        ("18 dollars", "18"),
        ("2.5 \\times 10^{3} \\mathrm{~eV}", "2500"),
        ("4.5 \\mathrm{~GeV}", "4.5"),
        ("1.2 \\mathrm{~Mpc}", "1.2 \\text{ Mpc}"),
        ("45 degrees", "45"),
        ("5 \\mathrm{~N}", "5 newtons"),
        ("100 \\mathrm{~Hz}", "100"),
        ("7.5 \\mathrm{~kJ}", "7.5"),
    ];
    for (pred, gold) in same {
        yes(pred, gold);
    }
    let different = [
        ("5\\text{ m}", "5\\text{ cm}"),
        ("5 km", "5 kg"),
        ("3 minutes", "3 hours"),
        ("3\\text{ min}", "3\\text{ h}"),
        ("10\\text{ cm}^2", "10\\text{ cm}^3"),
        ("1.6 \\mathrm{~m}", "1.6 \\mathrm{~cm}"),
        ("2 \\mathrm{~km} \\mathrm{~s}^{-1}", "2 \\mathrm{~km}"),
        ("3 \\mathrm{~m/s}", "3 \\mathrm{~km/s}"),
        ("4 \\mu\\mathrm{m}", "4 \\mathrm{~mm}"),
        ("2\\AA", "2 \\mathrm{~nm}"),
        ("7 seconds", "7 minutes"),
        ("12 kilograms", "12 grams"),
        ("300 \\mathrm{~K}", "300 \\mathrm{~J}"),
        ("6 inches", "6 feet"),
        ("100 cm", "1 m"),
        ("1 m", "100 cm"),
        ("5 \\mathrm{~N}", "5 \\mathrm{~J}"),
        ("4.5 \\mathrm{~GeV}", "4.5 \\mathrm{~MeV}"),
        ("1.2 \\mathrm{~Mpc}", "1.2 \\mathrm{~kpc}"),
        ("100 \\mathrm{~Hz}", "100 \\mathrm{~kHz}"),
        (
            "9.8 \\mathrm{~m} \\mathrm{~s}^{-2}",
            "9.8 \\mathrm{~m} \\mathrm{~s}^{-1}",
        ),
        ("18 dollars", "18 cents"),
        ("12 square feet", "12 feet"),
        ("2 \\text{ hr}", "2 \\text{ day}"),
    ];
    for (pred, gold) in different {
        no(pred, gold);
    }
    // a letter that is a variable is not a unit
    for (pred, gold) in [("x\\text{ and }y", "x"), ("3x", "3"), ("2 h", "2 x")] {
        no(pred, gold);
    }
    assert!(same.len() + different.len() >= 60);
}

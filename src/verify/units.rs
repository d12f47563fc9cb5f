//! Units at the end of an answer: `5\text{ cm}`, `1.6 \mathrm{~cm}` (Minerva's house style),
//! `3\,\mathrm{m/s}`, `2 \mathrm{~km} \mathrm{~s}^{-1}`, `4\mu\mathrm{m}`, `2\AA`, `7 meters`.
//!
//! [`split_unit`] separates a value from the unit it ends with and names the unit canonically
//! (wrappers, `~`, `\,` and spaces dropped; spellings and plurals mapped to symbols: `meters`
//! and `m` are `m`, `hours` and `hr` are `h`). Only known units count, so a letter that is a
//! variable or a constant (`2\mathrm{e}`, `x\text{ and }y`) is never read as one. A degree
//! sign followed by a scale is a temperature (`20^\circ\text{C}`, `20 °F`, `20 degrees
//! Celsius` are `°C` / `°F`); a bare `20^\circ` carries no unit. No conversions: `100 cm` and
//! `1 m` are different units, and so are `\$7` and `7 cents`.
//!
//! [`units_differ`] decides whether two answers carry different units: two known units
//! (including a leading `\$`, the unit `$`) that differ, where `deg` goes with either
//! temperature scale and `C` with `°C`; or two unknown words after a number
//! (`3 pears`, `3 plums`: lower case, singular) that differ. A unit on one side only, or
//! a known unit against an unknown word, is no difference.
//!
//! Knows nothing of extraction or equivalence; used by `normalize` (a value with a unit
//! equals the bare value) and `equiv` (two answers with different units are not equal).

/// Known units, by their canonical symbols; each also stands for the spellings in
/// [`SPELLINGS`].
const SYMBOLS: &[&str] = &[
    "m", "cm", "mm", "km", "nm", "µm", "Å", "s", "ms", "µs", "ns", "min", "h", "day", "year", "g",
    "kg", "mg", "N", "J", "kJ", "eV", "keV", "MeV", "GeV", "W", "kW", "MW", "V", "kV", "A", "mA",
    "K", "Hz", "kHz", "MHz", "GHz", "Pa", "kPa", "atm", "mol", "L", "mL", "C", "T", "Ω", "pc",
    "kpc", "Mpc", "AU", "ly", "in", "ft", "yd", "mi", "lb", "oz", "mph", "deg", "rad", "$", "cent",
    "arcsec", "arcmin", "erg", "dyn", "M_sun", "R_sun", "L_sun",
];

/// Words and other spellings (lower case) of the symbols.
const SPELLINGS: &[(&str, &str)] = &[
    ("meter", "m"),
    ("meters", "m"),
    ("metre", "m"),
    ("metres", "m"),
    ("centimeter", "cm"),
    ("centimeters", "cm"),
    ("millimeter", "mm"),
    ("millimeters", "mm"),
    ("kilometer", "km"),
    ("kilometers", "km"),
    ("nanometer", "nm"),
    ("nanometers", "nm"),
    ("angstrom", "Å"),
    ("angstroms", "Å"),
    ("second", "s"),
    ("seconds", "s"),
    ("sec", "s"),
    ("secs", "s"),
    ("minute", "min"),
    ("minutes", "min"),
    ("mins", "min"),
    ("hour", "h"),
    ("hours", "h"),
    ("hr", "h"),
    ("hrs", "h"),
    ("days", "day"),
    ("years", "year"),
    ("yr", "year"),
    ("gram", "g"),
    ("grams", "g"),
    ("kilogram", "kg"),
    ("kilograms", "kg"),
    ("milligram", "mg"),
    ("milligrams", "mg"),
    ("newton", "N"),
    ("newtons", "N"),
    ("joule", "J"),
    ("joules", "J"),
    ("watt", "W"),
    ("watts", "W"),
    ("volt", "V"),
    ("volts", "V"),
    ("kelvin", "K"),
    ("hertz", "Hz"),
    ("pascal", "Pa"),
    ("pascals", "Pa"),
    ("liter", "L"),
    ("liters", "L"),
    ("litre", "L"),
    ("litres", "L"),
    ("inch", "in"),
    ("inches", "in"),
    ("foot", "ft"),
    ("feet", "ft"),
    ("yard", "yd"),
    ("yards", "yd"),
    ("mile", "mi"),
    ("miles", "mi"),
    ("pound", "lb"),
    ("pounds", "lb"),
    ("lbs", "lb"),
    ("ounce", "oz"),
    ("ounces", "oz"),
    ("degree", "deg"),
    ("degrees", "deg"),
    ("radian", "rad"),
    ("radians", "rad"),
    ("dollar", "$"),
    ("dollars", "$"),
    ("cents", "cent"),
    ("parsec", "pc"),
    ("parsecs", "pc"),
    ("ergs", "erg"),
    ("mu m", "µm"),
    ("mum", "µm"),
    ("aa", "Å"),
    ("centimetre", "cm"),
    ("centimetres", "cm"),
    ("millimetre", "mm"),
    ("millimetres", "mm"),
    ("kilometre", "km"),
    ("kilometres", "km"),
    ("celsius", "°C"),
    ("centigrade", "°C"),
    ("fahrenheit", "°F"),
];

/// Degree marks, longest first, as they end a value (`20^\circ`) or open a scale
/// (`\text{°C}`, `degrees Celsius`).
const DEGREE_MARKS: &[&str] = &[
    "{}^{\\circ}",
    "{}^\\circ",
    "^{\\circ}",
    "^{\\circ }",
    "^\\circ",
    "^{\\degree}",
    "^\\degree",
    "\\circ",
    "\\degree",
    "°",
    "degrees",
    "degree",
    "deg",
];

/// Words after a number that are not units (`3 or 5`, `7 pm`, `15 percent`, `2 \pi`).
const NOT_UNITS: &[&str] = &[
    "and",
    "or",
    "to",
    "of",
    "the",
    "per",
    "percent",
    "pct",
    "am",
    "pm",
    "pi",
    "infty",
    "inf",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "log",
    "ln",
    "exp",
    "sqrt",
    "only",
    "total",
    "exactly",
    "approximately",
    "approx",
    "about",
    "roughly",
    "each",
    "in",
    "is",
];

/// One unit factor as written (`cm`, `meters`, `km/s`, `s^{-1}`, `\mu m`), canonical, or `None`
/// when it is not made of known units.
fn canonical(text: &str) -> Option<String> {
    let t = text
        .replace("\\mu", "µ ")
        .replace("\\AA", "Å")
        .replace("\\Omega", "Ω")
        .replace("\\odot", "sun")
        .replace(['{', '}'], "")
        .replace('~', " ")
        .replace("\\,", " ")
        .replace("\\;", " ")
        .replace("\\ ", " ")
        .replace("\\cdot", " ");
    // `km/s`, `m s^-1`: each factor canonical, the separators kept
    let mut out = String::new();
    for (i, part) in t.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        let words: Vec<&str> = part.split_whitespace().collect();
        if words.is_empty() {
            return None;
        }
        let mut first = true;
        let mut k = 0;
        while k < words.len() {
            let w = words[k];
            // `µ m` from `\mu\mathrm{m}`: the prefix joins the next word
            let (w, used) = if w == "µ" && k + 1 < words.len() {
                (format!("µ{}", words[k + 1]), 2)
            } else {
                (w.to_string(), 1)
            };
            k += used;
            let (base, power) = match w.split_once('^') {
                Some((b, p)) => (b.to_string(), format!("^{p}")),
                None => (w, String::new()),
            };
            let power = power.replace(' ', "");
            let sym = if SYMBOLS.contains(&base.as_str()) {
                base
            } else {
                let lower = base.to_lowercase();
                SPELLINGS
                    .iter()
                    .find(|(s, _)| *s == lower)
                    .map(|(_, sym)| sym.to_string())?
            };
            if !first {
                out.push('·');
            }
            first = false;
            out.push_str(&sym);
            out.push_str(&power);
        }
    }
    Some(out)
}

/// Where a trailing `\cmd{…}` group starts, when `s` ends with one.
fn trailing_group(s: &str) -> Option<(usize, &str)> {
    if !s.ends_with('}') {
        return None;
    }
    let bytes = s.as_bytes();
    let mut depth = 0usize;
    for i in (0..bytes.len()).rev() {
        match bytes[i] {
            b'}' => depth += 1,
            b'{' => {
                depth -= 1;
                if depth == 0 {
                    for w in [
                        "\\mathrm",
                        "\\text",
                        "\\mbox",
                        "\\textrm",
                        "\\rm",
                        "\\textnormal",
                    ] {
                        let head = s.get(..i)?.trim_end();
                        if let Some(start) = head.strip_suffix(w).map(str::len) {
                            return Some((start, s.get(i + 1..s.len() - 1)?));
                        }
                    }
                    return None;
                }
            }
            _ => {}
        }
    }
    None
}

/// `(value, unit)` when `s` is a value followed by known units; the unit canonical.
pub fn split_unit(s: &str) -> Option<(String, String)> {
    if let Some(found) = degree_scale(s) {
        return Some(found);
    }
    let mut rest = s.trim().trim_end_matches('.').trim_end().to_string();
    let mut parts: Vec<String> = Vec::new();
    for _ in 0..8 {
        let t = rest.trim_end();
        // a power on the unit before it: `\mathrm{~s}^{-1}`, `\text{ cm}^2`
        let (body, power) = match t.rfind('^') {
            Some(p) if p > 0 && is_power(&t[p + 1..]) && t[..p].ends_with('}') => {
                (&t[..p], t[p..].to_string())
            }
            _ => (t, String::new()),
        };
        if let Some((start, content)) = trailing_group(body) {
            // `\mu\mathrm{m}`: the prefix before the group
            let mut start = start;
            let mut content = content.to_string();
            if body[..start].trim_end().ends_with("\\mu") {
                start = body[..start].trim_end().len() - 3;
                content = format!("\\mu {content}");
            }
            if canonical(&content).is_some() {
                parts.push(format!("{content}{power}"));
                rest = body[..start].to_string();
                continue;
            }
            break;
        }
        if power.is_empty() {
            if let Some(head) = t.strip_suffix("\\AA") {
                parts.push("\\AA".into());
                rest = head.to_string();
                continue;
            }
            // bare unit words after a space: `7 meters`, `5 cm`, `12 square feet`
            if let Some(sp) = t.rfind(' ') {
                let word = &t[sp + 1..];
                let lower = word.to_lowercase();
                let qualifier =
                    !parts.is_empty() && ["square", "sq", "cubic"].contains(&lower.as_str());
                if !word.is_empty()
                    && word.chars().all(|c| c.is_ascii_alphabetic())
                    && (canonical(word).is_some() || qualifier)
                {
                    parts.push(word.to_string());
                    rest = t[..sp].to_string();
                    continue;
                }
            }
        }
        break;
    }
    if parts.is_empty() {
        return None;
    }
    let mut value = rest.trim_end().to_string();
    // spacing between the value and its unit
    loop {
        let before = value.len();
        for sp in ["\\,", "\\;", "\\:", "\\!", "\\ ", "~"] {
            if let Some(v) = value.strip_suffix(sp) {
                value = v.trim_end().to_string();
            }
        }
        if value.len() == before {
            break;
        }
    }
    // `square feet`, `cubic cm`
    let mut unit_parts: Vec<String> = parts.iter().rev().cloned().collect();
    if let Some(first) = unit_parts.first().cloned() {
        let square = ["square", "sq"].contains(&first.to_lowercase().as_str());
        let cubic = first.to_lowercase() == "cubic";
        if (square || cubic) && unit_parts.len() > 1 {
            unit_parts.remove(0);
            let p = if square { "^2" } else { "^3" };
            unit_parts[0].push_str(p);
        }
    }
    let unit = unit_parts
        .iter()
        .map(|p| canonical(p))
        .collect::<Option<Vec<_>>>()?
        .join("·");
    // `degrees Celsius` is the scale
    let unit = match unit.strip_prefix("deg·") {
        Some(t) if t == "°C" || t == "°F" => t.to_string(),
        _ => unit,
    };
    let ends_like_a_value = value
        .trim_end()
        .ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')' || c == '%');
    // a unit follows a number: `\frac{1}{3}\pi r^2 h` ends with a variable, not hours
    if value.trim().is_empty() || !ends_like_a_value || has_free_letters(&value) {
        return None;
    }
    Some((value, unit))
}

/// Whether `s` has a letter outside its `\commands` (`\frac`, `\times`, `\pi` are commands;
/// the `x` of `3x` and the `r` of `\pi r^2` are not).
fn has_free_letters(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            i += 1;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            continue;
        }
        if b[i].is_ascii_alphabetic() {
            return true;
        }
        i += 1;
    }
    false
}

/// `{-1}`, `{2}`, `2`, `3`: a power a unit can carry.
fn is_power(p: &str) -> bool {
    let inner = p
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .unwrap_or(p);
    let inner = inner.trim().strip_prefix('-').unwrap_or(inner.trim());
    !inner.is_empty() && inner.len() <= 2 && inner.chars().all(|c| c.is_ascii_digit())
}

/// The canonical unit `s` ends with, if any (see [`split_unit`]).
pub fn unit_of(s: &str) -> Option<String> {
    split_unit(s).map(|(_, u)| u)
}

/// `20^\circ\text{C}`, `20^{\circ} F`, `20 °C`, `20\,^\circ\mathrm{C}`, `20\text{ °F}`,
/// `20 degrees Celsius`: `(value, "°C" | "°F")`. A scale needs a degree mark before it (or,
/// spelled out, is a unit by itself: see [`SPELLINGS`]); `20 C` stays coulombs.
fn degree_scale(s: &str) -> Option<(String, String)> {
    if !(s.contains("circ") || s.contains('°') || s.contains("deg")) {
        return None;
    }
    let t = s.trim().trim_end_matches('.').trim_end();
    let (head, scale) = match trailing_group(t) {
        Some((start, content)) => (t.get(..start)?, content.trim().trim_start_matches('~')),
        None => {
            let head = t.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            (head, t.get(head.len()..)?)
        }
    };
    let scale = scale.trim();
    let (scale, marked) = match DEGREE_MARKS.iter().find_map(|m| scale.strip_prefix(*m)) {
        Some(rest) => (rest.trim_start_matches('~').trim(), true),
        None => (scale, false),
    };
    let unit = match scale.to_ascii_lowercase().as_str() {
        "c" | "celsius" | "centigrade" => "°C",
        "f" | "fahrenheit" => "°F",
        _ => return None,
    };
    let mut value = trim_spacing(head);
    if !marked {
        let marked_value = value;
        let bare = DEGREE_MARKS
            .iter()
            .find_map(|m| marked_value.strip_suffix(*m))?;
        value = trim_spacing(bare);
    }
    let ends_like_a_value = value.ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')');
    if value.is_empty() || !ends_like_a_value || has_free_letters(value) {
        return None;
    }
    Some((value.to_string(), unit.to_string()))
}

/// `s` without trailing spacing commands, `~`, `\text{ }` and empty groups `{}`.
fn trim_spacing(s: &str) -> &str {
    let mut v = s.trim_end();
    loop {
        let before = v.len();
        for sp in [
            "\\,",
            "\\;",
            "\\:",
            "\\!",
            "\\ ",
            "~",
            "\\text{ }",
            "\\mbox{ }",
            "{}",
            "\\",
        ] {
            if let Some(x) = v.strip_suffix(sp) {
                v = x.trim_end();
            }
        }
        if v.len() == before {
            return v;
        }
    }
}

/// `\$7`, `-\$7`, `\$ 18.90`: a dollar amount written with a leading sign (the unit `$`).
fn currency(s: &str) -> Option<String> {
    let t = s.trim();
    let t = t.strip_prefix('-').unwrap_or(t).trim_start();
    let rest = t
        .strip_prefix("\\$")
        .or_else(|| t.strip_prefix("\\textdollar"))?;
    let v = trim_spacing(rest.trim());
    let number = v.bytes().any(|b| b.is_ascii_digit())
        && v.ends_with(|c: char| c.is_ascii_digit() || c == '}')
        && !has_free_letters(v);
    number.then(|| "$".to_string())
}

/// Unknown unit words after a number (`3 pears`, `3\text{ pears}`, `\text{3 pears}`):
/// lower case, the last word singular (`pear`). One to three words of letters, none of
/// them in [`NOT_UNITS`]; outside a `\text{}` the first word has at least three letters
/// and all of them at least four, so `2 xy` (a product) is no unit.
fn word_unit(s: &str) -> Option<String> {
    let mut t = s.trim().trim_end_matches('.').trim_end();
    if let Some((0, content)) = trailing_group(t) {
        t = content.trim();
    }
    let (value, words, wrapped) = match trailing_group(t) {
        Some((start, content)) => (t.get(..start)?, content, true),
        None => {
            let run = t
                .bytes()
                .rev()
                .take_while(|b| b.is_ascii_alphabetic() || *b == b' ')
                .count();
            let run_start = t.len() - run;
            let split = run_start + t.get(run_start..)?.find(' ')?;
            (t.get(..split)?, t.get(split..)?, false)
        }
    };
    let ws: Vec<&str> = words.split_whitespace().collect();
    if ws.is_empty()
        || ws.len() > 3
        || !ws
            .iter()
            .all(|w| w.len() >= 2 && w.bytes().all(|b| b.is_ascii_alphabetic()))
    {
        return None;
    }
    let letters: usize = ws.iter().map(|w| w.len()).sum();
    if !wrapped && (ws.first().is_some_and(|w| w.len() < 3) || letters < 4) {
        return None;
    }
    let mut lower: Vec<String> = ws.iter().map(|w| w.to_ascii_lowercase()).collect();
    if lower.iter().any(|w| NOT_UNITS.contains(&w.as_str())) {
        return None;
    }
    let v = trim_spacing(value);
    let number = v.bytes().any(|b| b.is_ascii_digit())
        && v.ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')' || c == '%')
        && !has_free_letters(v);
    if !number {
        return None;
    }
    if let Some(last) = lower.last_mut() {
        *last = singular(last);
    }
    Some(lower.join(" "))
}

/// `pears` → `pear`, `boxes` → `box`, `pennies` → `penny`, `glasses` → `glass`.
fn singular(w: &str) -> String {
    if let Some(stem) = w.strip_suffix("ies").filter(|s| s.len() >= 2) {
        return format!("{stem}y");
    }
    for es in ["sses", "xes", "ches", "shes"] {
        if w.ends_with(es) {
            return w.get(..w.len() - 2).unwrap_or(w).to_string();
        }
    }
    match w.strip_suffix('s') {
        Some(stem) if !stem.ends_with('s') && stem.len() >= 2 => stem.to_string(),
        _ => w.to_string(),
    }
}

/// What an answer says about its unit, for [`units_differ`].
enum UnitTag {
    /// A known unit, canonical (`cm`, `°C`, `$`).
    Known(String),
    /// Unknown words after a number (`pear`).
    Word(String),
}

fn unit_tag(s: &str) -> Option<UnitTag> {
    if !s
        .bytes()
        .any(|b| b.is_ascii_alphabetic() || b == b'$' || !b.is_ascii())
    {
        return None;
    }
    if let Some(u) = unit_of(s) {
        return Some(UnitTag::Known(u));
    }
    if let Some(u) = currency(s) {
        return Some(UnitTag::Known(u));
    }
    word_unit(s).map(UnitTag::Word)
}

/// Whether two known units name the same thing: equal, or `deg` against a temperature, or
/// coulombs' `C` against `°C` (a bare `C` after a temperature is Celsius).
fn compatible(x: &str, y: &str) -> bool {
    let temperature = |u: &str| u == "°C" || u == "°F";
    x == y
        || (x == "deg" && temperature(y))
        || (y == "deg" && temperature(x))
        || (x == "C" && y == "°C")
        || (y == "C" && x == "°C")
}

/// Whether `a` and `b` carry units that differ (see the module documentation): two known
/// units that are not compatible (equal, or `deg` against a temperature, or `C` against
/// `°C`), or two unknown unit words that differ.
pub fn units_differ(a: &str, b: &str) -> bool {
    let Some(ua) = unit_tag(a) else {
        return false;
    };
    let Some(ub) = unit_tag(b) else {
        return false;
    };
    match (ua, ub) {
        (UnitTag::Known(x), UnitTag::Known(y)) => !compatible(&x, &y),
        (UnitTag::Word(x), UnitTag::Word(y)) => x != y,
        _ => false,
    }
}

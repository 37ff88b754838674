//! JSON read as Python's `json.loads` reads it and written as `json.dumps(…, sort_keys=True)`
//! writes it: what Ray's redaction does to a serialized runtime env, so that the text served is
//! byte for byte Ray's.
//!
//! serde_json cannot stand in for either side. Python writes `", "` and `": "` between items,
//! escapes everything outside printable ASCII as `\uXXXX` (a character past the Basic
//! Multilingual Plane as its UTF-16 pair), sorts keys by code point, and writes floats as its
//! `repr` does (`1e+16`, `1e-05`, `100.0`). It reads what serde_json refuses (`NaN`,
//! `Infinity`, lone surrogates such as `"\ud800"`) and keeps integers of any size exactly,
//! where serde_json would round them to a float. So a value here keeps integers as their text
//! and strings as code points, and both directions are written out below.
//!
//! Reading and writing use an explicit stack, never recursion, so the stack a request uses
//! does not grow with the nesting; the nesting itself is capped at [`MAX_DEPTH`], past
//! Python's own limit, which keeps the recursive drop of a value shallow.

use std::collections::{BTreeMap, btree_map};

/// Most containers nested in one another: Python's decoder raises `RecursionError` at about
/// 990, so whatever Ray can re-serialize is read here.
const MAX_DEPTH: usize = 1000;

/// A value as Python's `json.loads` makes it.
#[derive(Debug)]
pub(super) enum PyValue {
    /// `null` (`None`).
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer, as the decimal text Python writes for it: Python's integers have no size
    /// limit, and `-0` reads as `0`.
    Int(String),
    /// A number with a fraction or an exponent, and `NaN`, `Infinity` and `-Infinity`.
    Float(f64),
    /// A string, as code points: a Python string may hold a lone surrogate, which a Rust
    /// string cannot.
    Str(Vec<u32>),
    /// A list.
    List(Vec<PyValue>),
    /// A dict. Keys are ordered as Python orders strings (by code point), the order
    /// `sort_keys` writes them in; a key given twice keeps its last value, as a dict does.
    Dict(BTreeMap<Vec<u32>, PyValue>),
}

/// `text`'s code points.
pub(super) fn code_points(text: &str) -> Vec<u32> {
    text.chars().map(u32::from).collect()
}

/// `text` read as Python's `json.loads(text)` reads it; `None` where Python raises
/// `JSONDecodeError`, or where nesting passes [`MAX_DEPTH`].
pub(super) fn loads(text: &str) -> Option<PyValue> {
    let mut reader = Reader { text, at: 0 };
    let mut open: Vec<Open> = Vec::new();
    reader.skip_whitespace();
    loop {
        // A value starts here: a scalar, an empty container, or the first member of one.
        let mut value = match reader.peek()? {
            // An empty container counts too: Python's decoder recurses into it all the same.
            b'[' | b'{' if open.len() >= MAX_DEPTH => return None,
            b'[' => {
                reader.at += 1;
                reader.skip_whitespace();
                if reader.eat("]") {
                    PyValue::List(Vec::new())
                } else {
                    open.push(Open::List(Vec::new()));
                    continue;
                }
            }
            b'{' => {
                reader.at += 1;
                reader.skip_whitespace();
                if reader.eat("}") {
                    PyValue::Dict(BTreeMap::new())
                } else {
                    let key = reader.key()?;
                    open.push(Open::Dict(BTreeMap::new(), key));
                    continue;
                }
            }
            _ => reader.scalar()?,
        };
        // The value is whole: it joins the innermost open container, which may close in turn.
        loop {
            let Some(container) = open.last_mut() else {
                reader.skip_whitespace();
                return (reader.at == text.len()).then_some(value);
            };
            match &mut *container {
                Open::List(items) => items.push(value),
                Open::Dict(members, key) => {
                    members.insert(std::mem::take(key), value);
                }
            }
            reader.skip_whitespace();
            let separator = reader.peek()?;
            reader.at += 1;
            match (&mut *container, separator) {
                (Open::List(_), b',') => {
                    reader.skip_whitespace();
                    break;
                }
                (Open::Dict(_, key), b',') => {
                    reader.skip_whitespace();
                    *key = reader.key()?;
                    break;
                }
                (Open::List(_), b']') | (Open::Dict(..), b'}') => {}
                _ => return None,
            }
            value = match open.pop()? {
                Open::List(items) => PyValue::List(items),
                Open::Dict(members, _) => PyValue::Dict(members),
            };
        }
    }
}

/// `value` as Python's `json.dumps(value, sort_keys=True)` writes it (default separators,
/// `ensure_ascii`, `allow_nan`).
pub(super) fn dumps_sorted(value: &PyValue) -> String {
    /// A container being written, and whether a member of it was written yet.
    enum Writing<'a> {
        List(std::slice::Iter<'a, PyValue>, bool),
        Dict(btree_map::Iter<'a, Vec<u32>, PyValue>, bool),
    }
    let mut out = String::new();
    let mut open: Vec<Writing<'_>> = Vec::new();
    let mut next = Some(value);
    loop {
        match next.take() {
            Some(PyValue::List(items)) => {
                out.push('[');
                open.push(Writing::List(items.iter(), false));
            }
            Some(PyValue::Dict(members)) => {
                out.push('{');
                open.push(Writing::Dict(members.iter(), false));
            }
            Some(scalar) => write_scalar(&mut out, scalar),
            None => {}
        }
        let member = match open.last_mut() {
            None => return out,
            Some(Writing::List(items, started)) => items
                .next()
                .map(|item| (std::mem::replace(started, true), None, item)),
            Some(Writing::Dict(members, started)) => members
                .next()
                .map(|(key, item)| (std::mem::replace(started, true), Some(key), item)),
        };
        match member {
            Some((started, key, item)) => {
                if started {
                    out.push_str(", ");
                }
                if let Some(key) = key {
                    write_string(&mut out, key);
                    out.push_str(": ");
                }
                next = Some(item);
            }
            None => match open.pop() {
                Some(Writing::List(..)) => out.push(']'),
                Some(Writing::Dict(..)) => out.push('}'),
                None => {}
            },
        }
    }
}

/// A container being read: its members so far and, for a dict, the key of the member being
/// read.
enum Open {
    List(Vec<PyValue>),
    Dict(BTreeMap<Vec<u32>, PyValue>, Vec<u32>),
}

/// A position in the text being read.
struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// Skips what Python's decoder takes for whitespace (JSON's four characters, no others).
    fn skip_whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// Moves past `literal` when the text continues with it.
    fn eat(&mut self, literal: &str) -> bool {
        let found = self
            .text
            .as_bytes()
            .get(self.at..)
            .is_some_and(|rest| rest.starts_with(literal.as_bytes()));
        if found {
            self.at += literal.len();
        }
        found
    }

    /// A dict's key and the colon after it, with the whitespace around the colon.
    fn key(&mut self) -> Option<Vec<u32>> {
        if self.peek()? != b'"' {
            return None;
        }
        let key = self.string()?;
        self.skip_whitespace();
        if !self.eat(":") {
            return None;
        }
        self.skip_whitespace();
        Some(key)
    }

    /// A value that is not a container. Python also reads `NaN`, `Infinity` and `-Infinity`.
    fn scalar(&mut self) -> Option<PyValue> {
        Some(match self.peek()? {
            b'"' => PyValue::Str(self.string()?),
            b'n' if self.eat("null") => PyValue::Null,
            b't' if self.eat("true") => PyValue::Bool(true),
            b'f' if self.eat("false") => PyValue::Bool(false),
            b'N' if self.eat("NaN") => PyValue::Float(f64::NAN),
            b'I' if self.eat("Infinity") => PyValue::Float(f64::INFINITY),
            b'-' if self.eat("-Infinity") => PyValue::Float(f64::NEG_INFINITY),
            _ => self.number()?,
        })
    }

    /// A number, by JSON's grammar (which Python's decoder keeps to): an integer unless it has
    /// a fraction or an exponent. A float is read correctly rounded, as Python reads it (past
    /// the largest double it is infinite, below the smallest zero).
    fn number(&mut self) -> Option<PyValue> {
        let whole = self.text;
        let bytes = whole.as_bytes();
        let digits = |at: &mut usize| {
            let from = *at;
            while bytes.get(*at).is_some_and(u8::is_ascii_digit) {
                *at += 1;
            }
            *at > from
        };
        let start = self.at;
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        match bytes.get(at)? {
            b'0' => at += 1,
            b'1'..=b'9' => {
                digits(&mut at);
            }
            _ => return None,
        }
        let mut float = false;
        if bytes.get(at) == Some(&b'.') {
            at += 1;
            if !digits(&mut at) {
                return None;
            }
            float = true;
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) {
            at += 1;
            if matches!(bytes.get(at), Some(b'+' | b'-')) {
                at += 1;
            }
            if !digits(&mut at) {
                return None;
            }
            float = true;
        }
        let text = whole.get(start..at)?;
        self.at = at;
        if float {
            text.parse::<f64>().ok().map(PyValue::Float)
        } else if text == "-0" {
            Some(PyValue::Int("0".to_owned()))
        } else {
            Some(PyValue::Int(text.to_owned()))
        }
    }

    /// A string, from its opening quote: escapes decoded, a control character refused (Python
    /// reads strictly), and a `\u` escape of a high surrogate joined with a `\u` escape of a
    /// low one right after it; any other surrogate stays alone, as Python keeps it.
    fn string(&mut self) -> Option<Vec<u32>> {
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let c = self.text.get(self.at..)?.chars().next()?;
            self.at += c.len_utf8();
            match c {
                '"' => return Some(out),
                '\\' => {
                    let escape = self.peek()?;
                    self.at += 1;
                    out.push(match escape {
                        b'"' | b'\\' | b'/' => u32::from(escape),
                        b'b' => 0x08,
                        b'f' => 0x0C,
                        b'n' => 0x0A,
                        b'r' => 0x0D,
                        b't' => 0x09,
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    });
                }
                c if u32::from(c) < 0x20 => return None,
                c => out.push(u32::from(c)),
            }
        }
    }

    /// The code point of a `\u` escape, after its `u`.
    fn unicode_escape(&mut self) -> Option<u32> {
        let unit = self.hex4()?;
        if !(0xD800..0xDC00).contains(&unit) || !self.eat("\\u") {
            return Some(unit);
        }
        // Python reads the next escape's digits now, so bad digits there fail here too.
        let low = self.hex4()?;
        if (0xDC00..0xE000).contains(&low) {
            Some(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))
        } else {
            // Not a pair: the next escape is read again on its own.
            self.at -= 6;
            Some(unit)
        }
    }

    /// Four hexadecimal digits.
    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.as_bytes().get(self.at..self.at.checked_add(4)?)?;
        let mut value = 0;
        for digit in digits {
            value = value * 16 + char::from(*digit).to_digit(16)?;
        }
        self.at += 4;
        Some(value)
    }
}

/// A value that is not a container, as Python writes it.
fn write_scalar(out: &mut String, value: &PyValue) {
    match value {
        PyValue::Null => out.push_str("null"),
        PyValue::Bool(true) => out.push_str("true"),
        PyValue::Bool(false) => out.push_str("false"),
        PyValue::Int(text) => out.push_str(text),
        PyValue::Float(number) => write_float(out, *number),
        PyValue::Str(text) => write_string(out, text),
        // Containers are opened by the caller.
        PyValue::List(_) | PyValue::Dict(_) => {}
    }
}

/// A string as `ensure_ascii` writes it: printable ASCII as it is, `"` and `\` and the five
/// short escapes (`\b \f \n \r \t`) escaped, and every other code point as `\uXXXX` in lower
/// case, past the Basic Multilingual Plane as its surrogate pair.
fn write_string(out: &mut String, text: &[u32]) {
    out.push('"');
    for &code in text {
        match code {
            0x22 => out.push_str("\\\""),
            0x5C => out.push_str("\\\\"),
            0x08 => out.push_str("\\b"),
            0x0C => out.push_str("\\f"),
            0x0A => out.push_str("\\n"),
            0x0D => out.push_str("\\r"),
            0x09 => out.push_str("\\t"),
            0x20..=0x7E => out.push(char::from_u32(code).unwrap_or('?')),
            0x10000.. => {
                let offset = code - 0x10000;
                write_unit(out, 0xD800 + (offset >> 10));
                write_unit(out, 0xDC00 + (offset & 0x3FF));
            }
            _ => write_unit(out, code),
        }
    }
    out.push('"');
}

/// `\uXXXX`, lower-case hexadecimal as Python writes it.
fn write_unit(out: &mut String, unit: u32) {
    out.push_str("\\u");
    for shift in [12, 8, 4, 0] {
        out.push(char::from_digit((unit >> shift) & 0xF, 16).unwrap_or('0'));
    }
}

/// A float as Python's `json.dumps` writes it: `NaN`, `Infinity`, `-Infinity`, else its
/// `repr`: the shortest digits that read back as the same double, in positional notation when
/// the decimal exponent is from -4 to 15 (`0.0001`, `1000000000000000.0`, always with a
/// fraction) and in scientific notation otherwise, the exponent signed and of at least two
/// digits (`1e-05`, `1e+16`, `1.5e+300`).
fn write_float(out: &mut String, number: f64) {
    if number.is_nan() {
        out.push_str("NaN");
        return;
    }
    if number.is_infinite() {
        out.push_str(if number > 0.0 {
            "Infinity"
        } else {
            "-Infinity"
        });
        return;
    }
    if number.is_sign_negative() {
        out.push('-');
    }
    // Rust's `{:e}` writes the same shortest digits as Python's `repr`; only the layout
    // differs: `1.5e-7`, `1e16`, `0e0`.
    let scientific = format!("{:e}", number.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let exponent: i64 = exponent.parse().unwrap_or(0);
    // The digits are 0.d1d2… × 10^point, as Python's formatter counts.
    let point = exponent + 1;
    if (-3..=16).contains(&point) {
        let length = i64::try_from(digits.len()).unwrap_or(i64::MAX);
        if point <= 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n(
                '0',
                usize::try_from(-point).unwrap_or(0),
            ));
            out.push_str(&digits);
        } else if let Some((whole, fraction)) = usize::try_from(point)
            .ok()
            .filter(|_| point < length)
            .and_then(|at| digits.split_at_checked(at))
        {
            out.push_str(whole);
            out.push('.');
            out.push_str(fraction);
        } else {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n(
                '0',
                usize::try_from(point - length).unwrap_or(0),
            ));
            out.push_str(".0");
        }
    } else {
        let (first, rest) = digits.split_at_checked(1).unwrap_or((digits.as_str(), ""));
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        let magnitude = exponent.unsigned_abs();
        if magnitude < 10 {
            out.push('0');
        }
        out.push_str(itoa::Buffer::new().format(magnitude));
    }
}

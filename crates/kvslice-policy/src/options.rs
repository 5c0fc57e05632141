//! Per-policy options on the command line: `name:key=value,key=value` (`snapkv:window=32,kernel=7`).
//!
//! Each registry entry declares its options ([`OptionSpec`]: name, default, kind and range, one
//! line of help). [`PolicySpec`] is the syntax only; [`crate::Entry::parse_options`] checks the
//! given options against the declaration (unknown, duplicate, unparsable or out-of-range values
//! are errors that list every option of the policy) and [`crate::Entry::build_with`] hands them
//! to the policy's constructors, which add their own checks (an odd pooling kernel, …).

use std::fmt;
use std::str::FromStr;

use crate::error::{PolicyError, Result};

/// One option a policy declares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptionSpec {
    /// The key on the command line.
    pub name: &'static str,
    /// The value when the option is not given, as it would be written.
    pub default: &'static str,
    /// One line on what it does.
    pub help: &'static str,
    /// Its type and range.
    pub kind: OptionKind,
}

/// The type and range of an option's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptionKind {
    /// A whole number in `min..=max`.
    Int {
        /// Smallest value accepted.
        min: i64,
        /// Largest value accepted.
        max: i64,
    },
    /// A finite number in `min..=max`.
    Float {
        /// Smallest value accepted.
        min: f64,
        /// Largest value accepted.
        max: f64,
    },
    /// `true` or `false`.
    Bool,
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// Any non-empty text without a comma (a file's path, a named set of built-in weights).
    Text,
}

impl OptionKind {
    /// The accepted values as written in listings: `1..=4096`, `0..=1`, `true|false`, `avg|max`.
    pub fn range(&self) -> String {
        match self {
            OptionKind::Int { min, max } => format!("{min}..={max}"),
            OptionKind::Float { min, max } => format!("{min}..={max}"),
            OptionKind::Bool => "true|false".to_string(),
            OptionKind::Choice(c) => c.join("|"),
            OptionKind::Text => "text".to_string(),
        }
    }

    fn word(&self) -> &'static str {
        match self {
            OptionKind::Int { .. } => "an integer",
            OptionKind::Float { .. } => "a number",
            OptionKind::Bool => "a boolean",
            OptionKind::Choice(_) => "a choice",
            OptionKind::Text => "text",
        }
    }

    /// Parses and range-checks `text`; the error is the reason.
    fn parse(&self, text: &str) -> std::result::Result<Value, String> {
        match *self {
            OptionKind::Int { min, max } => {
                let v: i64 = text.parse().map_err(|e: std::num::ParseIntError| match e.kind() {
                    std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                        format!("{text} lies outside {min}..={max}")
                    }
                    _ => format!("{text:?} is not a whole number"),
                })?;
                if !(min..=max).contains(&v) {
                    return Err(format!("{v} lies outside {min}..={max}"));
                }
                Ok(Value::Int(v))
            }
            OptionKind::Float { min, max } => {
                let v: f64 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
                if !v.is_finite() {
                    return Err(format!("{text:?} is not a finite number"));
                }
                if !(min..=max).contains(&v) {
                    return Err(format!("{v} lies outside {min}..={max}"));
                }
                // the f32 nearest the decimal, not the f64 rounded again
                let single: f32 = text.parse().map_err(|_| format!("{text:?} is not a number"))?;
                Ok(Value::Float(v, single))
            }
            OptionKind::Bool => match text {
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                _ => Err(format!("{text:?} is neither true nor false")),
            },
            OptionKind::Choice(choices) => choices
                .iter()
                .find(|&&c| c == text)
                .map(|&c| Value::Choice(c))
                .ok_or_else(|| format!("{text:?} is not one of {}", choices.join("|"))),
            OptionKind::Text if text.is_empty() || text.contains(',') => {
                Err(format!("{text:?}: text must be non-empty and hold no comma"))
            }
            OptionKind::Text => Ok(Value::Text(text.to_string())),
        }
    }
}

impl fmt::Display for OptionSpec {
    /// `name=default (range)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={} ({})", self.name, self.default, self.kind.range())
    }
}

/// A validated value.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Int(i64),
    /// The number as f64 and as the f32 nearest the written decimal.
    Float(f64, f32),
    Bool(bool),
    Choice(&'static str),
    Text(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v, _) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::Choice(v) => f.write_str(v),
            Value::Text(v) => f.write_str(v),
        }
    }
}

/// Every option of a policy, `name=default (range)`, comma-separated (`none` when it has none).
pub fn describe(specs: &[OptionSpec]) -> String {
    if specs.is_empty() {
        return "none".to_string();
    }
    specs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// A policy's options, validated against its declaration; an option not given reads as its
/// declared default.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    policy: String,
    specs: Vec<OptionSpec>,
    given: Vec<(&'static str, Value)>,
}

impl Options {
    /// Checks `given` (key, value) pairs against the options `specs` of `policy`: every key
    /// declared, none twice, every value of its kind and in its range.
    pub fn parse(policy: &str, specs: Vec<OptionSpec>, given: &[(String, String)]) -> Result<Options> {
        let mut out = Options { policy: policy.to_string(), specs, given: Vec::with_capacity(given.len()) };
        for (key, text) in given {
            let Some(spec) = out.specs.iter().find(|s| s.name == key) else {
                return Err(PolicyError::UnknownOption {
                    policy: out.policy.clone(),
                    option: key.clone(),
                    options: describe(&out.specs),
                });
            };
            let (name, kind) = (spec.name, spec.kind);
            if out.given.iter().any(|(n, _)| *n == name) {
                return Err(out.invalid(format!("{key}={text}"), format!("option {key} is given twice")));
            }
            let value = kind.parse(text).map_err(|reason| out.invalid(format!("{key}={text}"), reason))?;
            out.given.push((name, value));
        }
        Ok(out)
    }

    /// The policy these options belong to.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The declared options.
    pub fn specs(&self) -> &[OptionSpec] {
        &self.specs
    }

    /// Whether option `name` was given (rather than defaulted).
    pub fn is_given(&self, name: &str) -> bool {
        self.given.iter().any(|(n, _)| *n == name)
    }

    /// An [`PolicyError::InvalidOption`] for this policy.
    pub fn invalid(&self, option: impl Into<String>, reason: impl Into<String>) -> PolicyError {
        PolicyError::InvalidOption {
            policy: self.policy.clone(),
            option: option.into(),
            reason: reason.into(),
            options: describe(&self.specs),
        }
    }

    fn value(&self, name: &str) -> Result<(OptionKind, Value)> {
        let spec = self
            .specs
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| self.invalid(name, format!("{} declares no option {name}", self.policy)))?;
        if let Some((_, v)) = self.given.iter().find(|(n, _)| *n == name) {
            return Ok((spec.kind, v.clone()));
        }
        let v = spec
            .kind
            .parse(spec.default)
            .map_err(|reason| self.invalid(format!("{name}={}", spec.default), format!("bad default: {reason}")))?;
        Ok((spec.kind, v))
    }

    fn mismatch(&self, name: &str, kind: OptionKind, asked: &str) -> PolicyError {
        self.invalid(name, format!("is {}, read as {asked}", kind.word()))
    }

    /// An integer option as `i64`.
    pub fn get_i64(&self, name: &str) -> Result<i64> {
        match self.value(name)? {
            (_, Value::Int(v)) => Ok(v),
            (k, _) => Err(self.mismatch(name, k, "an integer")),
        }
    }

    /// An integer option as `usize` (an error when negative).
    pub fn get_usize(&self, name: &str) -> Result<usize> {
        let v = self.get_i64(name)?;
        usize::try_from(v).map_err(|_| self.invalid(format!("{name}={v}"), "must not be negative"))
    }

    /// A number option, the `f64` nearest the written value.
    pub fn get_f64(&self, name: &str) -> Result<f64> {
        match self.value(name)? {
            (_, Value::Float(v, _)) => Ok(v),
            (k, _) => Err(self.mismatch(name, k, "a number")),
        }
    }

    /// A number option, the `f32` nearest the written value.
    pub fn get_f32(&self, name: &str) -> Result<f32> {
        match self.value(name)? {
            (_, Value::Float(_, v)) => Ok(v),
            (k, _) => Err(self.mismatch(name, k, "a number")),
        }
    }

    /// A boolean option.
    pub fn get_bool(&self, name: &str) -> Result<bool> {
        match self.value(name)? {
            (_, Value::Bool(v)) => Ok(v),
            (k, _) => Err(self.mismatch(name, k, "a boolean")),
        }
    }

    /// A choice option: the chosen word.
    pub fn get_str(&self, name: &str) -> Result<&str> {
        match self.value(name)? {
            (_, Value::Choice(v)) => Ok(v),
            (k, _) => Err(self.mismatch(name, k, "a choice")),
        }
    }

    /// A text option.
    pub fn get_text(&self, name: &str) -> Result<String> {
        match self.value(name)? {
            (_, Value::Text(v)) => Ok(v),
            (k, _) => Err(self.mismatch(name, k, "text")),
        }
    }
}

impl fmt::Display for Options {
    /// The given options, canonical: `key=value,key=value` in the order given (empty when none).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (n, v)) in self.given.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{n}={v}")?;
        }
        Ok(())
    }
}

/// A policy as written on the command line: `name` or `name:key=value,key=value`.
///
/// Parsing checks the syntax and that the policy exists (an unknown name is
/// [`PolicyError::UnknownPolicy`]); the options themselves are checked by
/// [`crate::Entry::parse_options`]. Spaces around names, keys and values are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PolicySpec {
    /// The registered name.
    pub name: String,
    /// `(key, value)` pairs in the order given.
    pub options: Vec<(String, String)>,
}

impl FromStr for PolicySpec {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self> {
        let (name, rest) = match s.split_once(':') {
            Some((n, r)) => (n.trim(), Some(r)),
            None => (s.trim(), None),
        };
        let entry = crate::registry::lookup(name)?;
        let malformed = |option: &str, reason: &str| PolicyError::InvalidOption {
            policy: entry.name.to_string(),
            option: option.to_string(),
            reason: reason.to_string(),
            options: describe(&entry.options()),
        };
        let mut options = Vec::new();
        if let Some(rest) = rest {
            if rest.trim().is_empty() {
                return Err(malformed("", "expected key=value after ':'"));
            }
            for item in rest.split(',') {
                let item = item.trim();
                if item.is_empty() {
                    return Err(malformed(item, "empty option (two commas, or a comma at an end)"));
                }
                let Some((key, value)) = item.split_once('=') else {
                    return Err(malformed(item, "expected key=value"));
                };
                let (key, value) = (key.trim(), value.trim());
                if key.is_empty() {
                    return Err(malformed(item, "no option name before '='"));
                }
                if value.is_empty() {
                    return Err(malformed(item, "no value after '='"));
                }
                options.push((key.to_string(), value.to_string()));
            }
        }
        Ok(PolicySpec { name: entry.name.to_string(), options })
    }
}

impl fmt::Display for PolicySpec {
    /// `name`, or `name:key=value,…` in the order given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        for (i, (k, v)) in self.options.iter().enumerate() {
            f.write_str(if i == 0 { ":" } else { "," })?;
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[OptionSpec] = &[
        OptionSpec { name: "n", default: "3", help: "", kind: OptionKind::Int { min: 1, max: 9 } },
        OptionSpec { name: "x", default: "0.5", help: "", kind: OptionKind::Float { min: 0.0, max: 1.0 } },
        OptionSpec { name: "b", default: "false", help: "", kind: OptionKind::Bool },
        OptionSpec { name: "c", default: "avg", help: "", kind: OptionKind::Choice(&["avg", "max"]) },
    ];

    fn given(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn reason(r: Result<Options>) -> String {
        match r {
            Err(PolicyError::InvalidOption { reason, .. }) => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_and_given_values() {
        let o = Options::parse("t", SPECS.to_vec(), &[]).unwrap();
        assert_eq!(o.get_usize("n").unwrap(), 3);
        assert_eq!(o.get_f64("x").unwrap(), 0.5);
        assert!(!o.get_bool("b").unwrap());
        assert_eq!(o.get_str("c").unwrap(), "avg");
        assert_eq!(o.to_string(), "");
        let o = Options::parse("t", SPECS.to_vec(), &given(&[("c", "max"), ("n", "9"), ("x", "0.10"), ("b", "true")]))
            .unwrap();
        assert_eq!((o.get_usize("n").unwrap(), o.get_str("c").unwrap(), o.get_bool("b").unwrap()), (9, "max", true));
        // 0.1 as f32 is the nearest f32 to the decimal, not to the f64 0.1
        assert_eq!(o.get_f32("x").unwrap(), 0.1f32);
        assert_eq!(o.get_f64("x").unwrap(), 0.1f64);
        assert!(o.is_given("n") && !Options::parse("t", SPECS.to_vec(), &[]).unwrap().is_given("n"));
        // canonical: the order given, numbers rewritten
        assert_eq!(o.to_string(), "c=max,n=9,x=0.1,b=true");
    }

    #[test]
    fn bad_values() {
        let p = |k: &str, v: &str| Options::parse("t", SPECS.to_vec(), &given(&[(k, v)]));
        assert_eq!(reason(p("n", "0")), "0 lies outside 1..=9");
        assert_eq!(reason(p("n", "10")), "10 lies outside 1..=9");
        assert_eq!(reason(p("n", "99999999999999999999999")), "99999999999999999999999 lies outside 1..=9");
        assert_eq!(reason(p("n", "2.5")), "\"2.5\" is not a whole number");
        assert_eq!(reason(p("n", "٣")), "\"٣\" is not a whole number");
        assert_eq!(reason(p("x", "1.01")), "1.01 lies outside 0..=1");
        assert_eq!(reason(p("x", "-0.01")), "-0.01 lies outside 0..=1");
        assert_eq!(reason(p("x", "NaN")), "\"NaN\" is not a finite number");
        assert_eq!(reason(p("x", "1e999")), "\"1e999\" is not a finite number");
        assert_eq!(reason(p("x", "half")), "\"half\" is not a number");
        assert_eq!(reason(p("b", "yes")), "\"yes\" is neither true nor false");
        assert_eq!(reason(p("c", "min")), "\"min\" is not one of avg|max");
        let twice = Options::parse("t", SPECS.to_vec(), &given(&[("n", "2"), ("n", "2")]));
        assert_eq!(reason(twice), "option n is given twice");
        match p("m", "1") {
            Err(PolicyError::UnknownOption { policy, option, options }) => {
                assert_eq!((policy.as_str(), option.as_str()), ("t", "m"));
                assert_eq!(options, "n=3 (1..=9), x=0.5 (0..=1), b=false (true|false), c=avg (avg|max)");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reading_an_undeclared_option_or_another_kind_is_an_error() {
        let o = Options::parse("t", SPECS.to_vec(), &[]).unwrap();
        assert!(matches!(o.get_usize("zz"), Err(PolicyError::InvalidOption { .. })));
        assert!(matches!(o.get_f32("n"), Err(PolicyError::InvalidOption { .. })));
        assert!(matches!(o.get_usize("x"), Err(PolicyError::InvalidOption { .. })));
        assert!(matches!(o.get_bool("c"), Err(PolicyError::InvalidOption { .. })));
        assert!(matches!(o.get_str("b"), Err(PolicyError::InvalidOption { .. })));
        let neg = [OptionSpec { name: "k", default: "-1", help: "", kind: OptionKind::Int { min: -5, max: 5 } }];
        let o = Options::parse("t", neg.to_vec(), &[]).unwrap();
        assert_eq!(o.get_i64("k").unwrap(), -1);
        assert!(o.get_usize("k").is_err());
    }
}

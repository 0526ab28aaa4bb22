//! LMCache's `lmcache server` flags, and a reading of extra arguments that
//! follows Python's `argparse` as that command uses it, so that a command
//! line the server would reject is refused before anything starts.
//!
//! The tables (`lmcache-server-flags.json` of 0.5.6, the tested version,
//! and `lmcache-server-flags-0.5.7rc2.json` of the next) are generated from
//! an installed LMCache by `scripts/lmcache-server-flags.py`: each flag's
//! names, how many values it takes, their type and choices. The reading follows argparse
//! (Python 3.11, `allow_abbrev=True`, prefix `-`):
//!
//! - a token is an option when it starts with `-`, is not `-` alone, and does
//!   not look like a negative number (`-1`, `-.5`): `-x` is an option, so
//!   `--eviction-policy -x` lacks its value;
//! - `--flag=value` gives the value explicitly, whatever it looks like
//!   (`--lookup-hash-log-dir=-logs`);
//! - a unique prefix of a long flag is that flag (`--chunk` is
//!   `--chunk-size`); a prefix of several is ambiguous;
//! - a flag that takes one value takes the next token unless it is an
//!   option; one that takes any number takes every token up to the next
//!   option; a flag that takes none refuses `=value`;
//! - `int` and `float` values must parse as Python's `int()` and `float()`
//!   parse them, and a value with choices must be one of them;
//! - anything left over (a word that is no flag's value, an unknown flag)
//!   is an "unrecognized argument", as is `--` (the command takes no
//!   positional arguments).

use std::sync::OnceLock;

use lmcache_tier_spec::shown_value;
use serde::Deserialize;

/// How many values a flag takes (argparse's `nargs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Takes {
    /// `store_true`, `store_false`, `--x/--no-x`, `help` (`nargs=0`).
    None,
    /// Exactly one (`nargs=None`).
    One,
    /// Zero or one (`nargs='?'`).
    Optional,
    /// Zero or more (`nargs='*'`).
    Any,
    /// One or more (`nargs='+'`).
    Some,
}

/// The type argparse converts a value to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueType {
    /// Python's `int()`.
    Int,
    /// Python's `float()`.
    Float,
    /// Any text.
    Str,
}

/// One flag of `lmcache server`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Flag {
    /// Its spellings, e.g. `["-q", "--quiet"]`.
    pub names: Vec<String>,
    /// How many values it takes.
    pub takes: Takes,
    /// The type of its values (`None`: text).
    #[serde(rename = "type")]
    pub value_type: Option<ValueType>,
    /// The values it accepts, when restricted.
    pub choices: Option<Vec<String>>,
    /// `-h`/`--help`: prints the help and exits.
    pub help: bool,
}

impl Flag {
    /// The name the flag is known by: its first long spelling.
    pub fn name(&self) -> &str {
        self.names
            .iter()
            .find(|n| n.starts_with("--"))
            .unwrap_or(&self.names[0])
    }
}

/// The flag table of one LMCache version.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ServerFlags {
    /// The LMCache version the table was generated from.
    pub lmcache: String,
    /// Every flag of `lmcache server`.
    pub flags: Vec<Flag>,
}

/// The table of the LMCache version this project is tested against
/// (`lmcache-server-flags.json`).
pub fn server_flags() -> &'static ServerFlags {
    static TABLE: OnceLock<ServerFlags> = OnceLock::new();
    TABLE.get_or_init(|| {
        serde_json::from_str(include_str!("lmcache-server-flags.json"))
            .unwrap_or_else(|e| unreachable!("the built-in flag table does not parse: {e}"))
    })
}

/// The table of the next LMCache, 0.5.7rc2, a pre-release
/// (`lmcache-server-flags-0.5.7rc2.json`): the plan reads the extra
/// arguments with it when the server runs 0.5.7 or later.
pub fn next_server_flags() -> &'static ServerFlags {
    static TABLE: OnceLock<ServerFlags> = OnceLock::new();
    TABLE.get_or_init(|| {
        serde_json::from_str(include_str!("lmcache-server-flags-0.5.7rc2.json"))
            .unwrap_or_else(|e| unreachable!("the built-in flag table does not parse: {e}"))
    })
}

/// One flag as the server reads it from the arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    /// The flag, by [`Flag::name`] (an abbreviation resolved).
    pub flag: String,
    /// The argument it was written as.
    pub written: String,
    /// Its values, in order.
    pub values: Vec<String>,
    /// Written `--flag=value`.
    pub explicit: bool,
}

/// Why the server would reject the arguments; the message says what argparse
/// would say, in our words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A word of JSON on its own: a JSON value with whitespace in it, split
    /// apart (never quoted: it may hold a key).
    #[error("a JSON value holds whitespace, so it was split into words: write each --l2-adapter JSON without spaces")]
    JsonFragment,
    /// A word that is neither a flag nor a flag's value, or an unknown flag.
    #[error("{} is not a flag of `lmcache server` (LMCache {}) nor a flag's value", shown_value(.0), .1)]
    Unrecognized(String, String),
    /// A prefix of several flags.
    #[error(
        "{} abbreviates several flags ({candidates}): write one in full",
        shown_value(written)
    )]
    Ambiguous {
        /// The argument.
        written: String,
        /// The flags it could mean.
        candidates: String,
    },
    /// A flag without the value it needs.
    #[error(
        "{flag} needs a value after it (a value that starts with '-' is written {flag}=<value>)"
    )]
    MissingValue {
        /// The flag.
        flag: String,
    },
    /// `=value` on a flag that takes none.
    #[error("{flag} takes no value, but one is given with =")]
    UnexpectedValue {
        /// The flag.
        flag: String,
    },
    /// A value of the wrong type or outside the choices.
    #[error("{flag} {} is not valid: {expected}", shown_value(value))]
    BadValue {
        /// The flag.
        flag: String,
        /// The value.
        value: String,
        /// What the server accepts.
        expected: String,
    },
    /// A help request: the server would print its help and exit.
    #[error("{0} prints LMCache's help and exits, so the server would not start: remove it")]
    Help(String),
}

/// What one token is, to argparse.
enum Token<'a> {
    /// A value or stray word.
    Word,
    /// A flag of the table by the spelling it matched (`--no-x` and `--x`
    /// are one flag with two meanings), with an explicit `=value`.
    Flag(&'a Flag, &'a str, Option<String>),
    /// Short flags written together (`-qq`): each one, in order.
    Stacked(Vec<(&'a Flag, &'a str)>),
    /// Something that looks like a flag but is none.
    Unknown,
}

impl ServerFlags {
    /// Reads `args` (the extra arguments, as they follow the node's own) as
    /// LMCache's server parser would, returning each flag with its values in
    /// order. Errors: the first thing the server would reject.
    pub fn read(&self, args: &[&str]) -> Result<Vec<Occurrence>, ArgError> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let written = args[i];
            i += 1;
            let (flag, spelling, explicit) = match self.classify(written)? {
                Token::Flag(flag, spelling, explicit) => (flag, spelling, explicit),
                Token::Stacked(flags) => {
                    for (flag, spelling) in flags {
                        if flag.help {
                            return Err(ArgError::Help(written.into()));
                        }
                        out.push(Occurrence {
                            flag: spelling.into(),
                            written: written.into(),
                            values: Vec::new(),
                            explicit: false,
                        });
                    }
                    continue;
                }
                Token::Word | Token::Unknown if written.contains('"') => {
                    return Err(ArgError::JsonFragment)
                }
                Token::Word | Token::Unknown => {
                    return Err(ArgError::Unrecognized(written.into(), self.lmcache.clone()))
                }
            };
            if flag.help {
                return Err(ArgError::Help(written.into()));
            }
            let values = match explicit {
                Some(_) if flag.takes == Takes::None => {
                    return Err(ArgError::UnexpectedValue {
                        flag: flag.name().into(),
                    })
                }
                Some(value) => vec![value],
                None => {
                    let words = args[i..]
                        .iter()
                        .take_while(|a| matches!(self.classify(a), Ok(Token::Word)))
                        .count();
                    let taken = match flag.takes {
                        Takes::None => 0,
                        Takes::One | Takes::Optional => words.min(1),
                        Takes::Any | Takes::Some => words,
                    };
                    if taken == 0 && matches!(flag.takes, Takes::One | Takes::Some) {
                        return Err(ArgError::MissingValue {
                            flag: flag.name().into(),
                        });
                    }
                    i += taken;
                    args[i - taken..i].iter().map(|v| v.to_string()).collect()
                }
            };
            for value in &values {
                check_value(flag, value)?;
            }
            out.push(Occurrence {
                flag: spelling.into(),
                written: written.into(),
                explicit: written.contains('='),
                values,
            });
        }
        Ok(out)
    }

    /// The flag `name` (a full spelling).
    pub fn get(&self, name: &str) -> Option<&Flag> {
        self.spelled(name).map(|(flag, _)| flag)
    }

    /// The flag spelt exactly `name`, with the table's copy of the spelling.
    fn spelled(&self, name: &str) -> Option<(&Flag, &str)> {
        self.flags.iter().find_map(|f| {
            let spelling = f.names.iter().find(|n| *n == name)?;
            Some((f, spelling.as_str()))
        })
    }

    /// `-qq`: a single-dash token whose every letter is a short flag that
    /// takes no value, as argparse reads it; `None` when it is not that.
    fn stacked(&self, token: &str) -> Option<Vec<(&Flag, &str)>> {
        let letters = token.strip_prefix('-').filter(|l| !l.starts_with('-'))?;
        letters
            .chars()
            .map(|c| {
                let (flag, spelling) = self.spelled(&format!("-{c}"))?;
                (flag.takes == Takes::None).then_some((flag, spelling))
            })
            .collect()
    }

    fn classify<'a>(&'a self, token: &str) -> Result<Token<'a>, ArgError> {
        if !token.starts_with('-') || token == "-" {
            return Ok(Token::Word);
        }
        if token == "--" {
            return Ok(Token::Unknown);
        }
        if let Some((flag, spelling)) = self.spelled(token) {
            return Ok(Token::Flag(flag, spelling, None));
        }
        let (name, explicit) = match token.split_once('=') {
            Some((name, value)) => (name, Some(value.to_string())),
            None => (token, None),
        };
        if let Some((flag, spelling)) = self.spelled(name) {
            return Ok(Token::Flag(flag, spelling, explicit));
        }
        if name.starts_with("--") {
            // argparse compares the prefix with every spelling.
            let candidates: Vec<(&Flag, &str)> = self
                .flags
                .iter()
                .flat_map(|f| f.names.iter().map(move |n| (f, n.as_str())))
                .filter(|(_, n)| n.starts_with(name))
                .collect();
            match candidates[..] {
                [(flag, spelling)] => return Ok(Token::Flag(flag, spelling, explicit)),
                [] => {}
                _ => {
                    return Err(ArgError::Ambiguous {
                        written: name.into(),
                        candidates: candidates
                            .iter()
                            .map(|(_, n)| *n)
                            .collect::<Vec<_>>()
                            .join(", "),
                    })
                }
            }
        }
        if looks_negative(token) {
            return Ok(Token::Word);
        }
        if let Some(flags) = self.stacked(token) {
            return Ok(Token::Stacked(flags));
        }
        Ok(Token::Unknown)
    }
}

/// argparse's negative-number pattern, `^-\d+$|^-\d*\.\d+$`: such a token
/// is a value, not a flag (the server has no flag that looks like one).
/// Python's `\d` is any Unicode decimal digit (`-٥` is a value), read here
/// as `char::is_numeric`.
fn looks_negative(token: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.chars().all(char::is_numeric);
    match token.strip_prefix('-') {
        Some(rest) => match rest.split_once('.') {
            None => digits(rest),
            Some((whole, fraction)) => (whole.is_empty() || digits(whole)) && digits(fraction),
        },
        None => false,
    }
}

fn check_value(flag: &Flag, value: &str) -> Result<(), ArgError> {
    let bad = |expected: String| ArgError::BadValue {
        flag: flag.name().into(),
        value: value.into(),
        expected,
    };
    match flag.value_type {
        Some(ValueType::Int) if !python_int(value) => {
            return Err(bad("write a whole number, e.g. 256".into()))
        }
        Some(ValueType::Float) if !python_float(value) => {
            return Err(bad("write a number, e.g. 0.8".into()))
        }
        _ => {}
    }
    match &flag.choices {
        Some(choices) if !choices.iter().any(|c| c == value) => {
            Err(bad(format!("write one of {}", choices.join(", "))))
        }
        _ => Ok(()),
    }
}

/// A number as written for Python's `int()` or `float()` (already checked),
/// in the syntax Rust parses: trimmed, without `+` and underscores.
pub(crate) fn python_number(text: &str) -> String {
    let text = text.trim();
    text.strip_prefix('+').unwrap_or(text).replace('_', "")
}

/// Whether Python's `int()` takes `text`: surrounding whitespace, an
/// optional sign, ASCII digits with single underscores between them.
fn python_int(text: &str) -> bool {
    let text = text.trim();
    let digits = text.strip_prefix(['+', '-']).unwrap_or(text);
    !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.bytes().all(|b| b.is_ascii_digit() || b == b'_')
}

/// Whether Python's `float()` takes `text`: a decimal number with an
/// optional exponent, `inf`, `infinity` or `nan` (any case, signed),
/// underscores only between digits.
fn python_float(text: &str) -> bool {
    let text = text.trim();
    let bytes = text.as_bytes();
    let underscores_ok = bytes.iter().enumerate().all(|(i, b)| {
        *b != b'_'
            || (i > 0
                && bytes[i - 1].is_ascii_digit()
                && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
    });
    let plain = text.replace('_', "");
    let unsigned = plain.strip_prefix(['+', '-']).unwrap_or(&plain);
    let word = ["inf", "infinity", "nan"]
        .iter()
        .any(|w| unsigned.eq_ignore_ascii_case(w));
    let numeric = unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && plain.parse::<f64>().is_ok();
    underscores_ok && (word || numeric)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(args: &str) -> Result<Vec<(String, Vec<String>)>, ArgError> {
        let tokens: Vec<&str> = args.split_whitespace().collect();
        server_flags()
            .read(&tokens)
            .map(|o| o.into_iter().map(|o| (o.flag, o.values)).collect())
    }

    fn one(flag: &str, values: &[&str]) -> Vec<(String, Vec<String>)> {
        vec![(flag.into(), values.iter().map(|v| v.to_string()).collect())]
    }

    #[test]
    fn the_table_is_lmcache_0_5_6s() {
        let table = server_flags();
        assert_eq!(table.lmcache, "0.5.6");
        let policy = table.get("--eviction-policy").unwrap();
        assert_eq!(policy.takes, Takes::One);
        assert_eq!(
            policy.choices.as_deref().unwrap(),
            ["LRU", "ARC", "IsolatedLRU", "noop"]
        );
        assert!(table.get("-h").unwrap().help);
    }

    #[test]
    fn values_are_taken_as_argparse_takes_them() {
        assert_eq!(
            read("--lookup-hash-log-dir=-logs"),
            Ok(one("--lookup-hash-log-dir", &["-logs"]))
        );
        assert_eq!(read("--chunk 512"), Ok(one("--chunk-size", &["512"])));
        assert_eq!(read("--chunk=512"), Ok(one("--chunk-size", &["512"])));
        assert_eq!(read("--l1-size-gb 1_0"), Ok(one("--l1-size-gb", &["1_0"])));
        assert_eq!(
            read("--eviction-trigger-watermark -.5"),
            Ok(one("--eviction-trigger-watermark", &["-.5"]))
        );
        assert_eq!(read("--enable"), Ok(one("--enable", &[])));
        assert_eq!(read("--enable a b"), Ok(one("--enable", &["a", "b"])));
        assert_eq!(read("-q"), Ok(one("-q", &[])));
        assert_eq!(
            read("-qq"),
            Ok(vec![("-q".into(), vec![]), ("-q".into(), vec![])])
        );
        assert_eq!(read("--no-isolated-ipc"), Ok(one("--no-isolated-ipc", &[])));
        assert_eq!(read("--no-isol"), Ok(one("--no-isolated-ipc", &[])));
        assert_eq!(read("--isol"), Ok(one("--isolated-ipc", &[])));
        assert_eq!(read("--instance-id -٥"), Ok(one("--instance-id", &["-٥"])));
        assert_eq!(read(""), Ok(vec![]));
    }

    #[test]
    fn what_the_server_would_reject_is_an_error() {
        for (args, expected) in [
            ("--eviction-policy -x", "--eviction-policy needs a value"),
            ("--eviction-policy", "--eviction-policy needs a value"),
            (
                "--eviction-policy FIFO",
                "write one of LRU, ARC, IsolatedLRU, noop",
            ),
            ("--chunk-size 12.5", "write a whole number"),
            ("--chunk-size 1__0", "write a whole number"),
            ("--eviction-ratio half", "write a number"),
            ("--eviction-ratio 1_", "write a number"),
            ("--no-such-flag", "is not a flag of `lmcache server`"),
            ("-x", "is not a flag of `lmcache server`"),
            ("stray", "is not a flag of `lmcache server`"),
            ("--chunk-size 256 512", "\"512\" is not a flag"),
            ("--", "is not a flag of `lmcache server`"),
            ("--l2", "abbreviates several flags"),
            ("--quiet=yes", "--quiet takes no value"),
            (
                r#"--l2-adapter {"type": "s3"}"#,
                "write each --l2-adapter JSON without spaces",
            ),
            ("--help", "prints LMCache's help"),
            ("-h", "prints LMCache's help"),
            ("--he", "prints LMCache's help"),
            ("-qh", "prints LMCache's help"),
            ("-qx", "is not a flag of `lmcache server`"),
            ("--l1-use", "--l1-use-lazy"),
        ] {
            let e = read(args).unwrap_err().to_string();
            assert!(e.contains(expected), "{args}: {e}");
        }
    }

    #[test]
    fn numbers_parse_as_python_parses_them() {
        for good in ["1", "+1", "-1", " 7 ", "1_000", "0"] {
            assert!(python_int(good), "{good}");
        }
        for bad in ["", "1.0", "_1", "1_", "1__0", "0x10", "one", "+"] {
            assert!(!python_int(bad), "{bad}");
        }
        for good in [
            "1",
            "1.5",
            ".5",
            "5.",
            "1e3",
            "-1E-3",
            "inf",
            "-Infinity",
            "NaN",
            "1_0.5",
        ] {
            assert!(python_float(good), "{good}");
        }
        for bad in ["", "e3", "1.5.2", "infinit", "1_", "_1", "0x1p3", "."] {
            assert!(!python_float(bad), "{bad}");
        }
    }
}

//! Reader for `board.toml`: the small subset of TOML the board file uses
//! (`[section]` headers, `key = value` with integers in decimal or `0x`
//! hex with `_` separators, and `"strings"`, `#` comments). Std only, no
//! dependencies: `build.rs` and the xtask both include this file with
//! `#[path]`, so the firmware and its image read the same values the same
//! way. Anything outside the subset is an error with its line number.

use std::fmt;

/// A value of the board file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Int(u64),
    Str(String),
}

/// Why the board file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardError(pub String);

impl fmt::Display for BoardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The parsed board file: `section.key` to value, in file order.
#[derive(Debug, Clone, Default)]
pub struct BoardToml {
    entries: Vec<(String, Value)>,
}

impl BoardToml {
    /// Parses the text of a board file.
    pub fn parse(text: &str) -> Result<BoardToml, BoardError> {
        let mut section = String::new();
        let mut entries: Vec<(String, Value)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let err = |msg: &str| BoardError(format!("board.toml line {line_no}: {msg}"));
            let line = strip_comment(raw).trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('[') {
                let name = rest
                    .strip_suffix(']')
                    .ok_or_else(|| err("unterminated section header"))?
                    .trim();
                if name.is_empty() || !name.chars().all(is_key_char) {
                    return Err(err("bad section name"));
                }
                section = name.to_string();
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| err("expected `key = value`"))?;
            let key = key.trim();
            if key.is_empty() || !key.chars().all(is_key_char) {
                return Err(err("bad key"));
            }
            let full = if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            };
            if entries.iter().any(|(k, _)| *k == full) {
                return Err(err(&format!("`{full}` set twice")));
            }
            let value = parse_value(value.trim()).map_err(|m| err(&m))?;
            entries.push((full, value));
        }
        Ok(BoardToml { entries })
    }

    /// The value of `section.key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The integer `section.key`; an error if missing or not an integer.
    pub fn int(&self, key: &str) -> Result<u64, BoardError> {
        match self.get(key) {
            Some(Value::Int(v)) => Ok(*v),
            Some(Value::Str(_)) => Err(BoardError(format!(
                "board.toml: `{key}` must be an integer"
            ))),
            None => Err(BoardError(format!("board.toml: `{key}` is missing"))),
        }
    }

    /// The string `section.key`; an error if missing or not a string.
    pub fn string(&self, key: &str) -> Result<&str, BoardError> {
        match self.get(key) {
            Some(Value::Str(v)) => Ok(v),
            Some(Value::Int(_)) => Err(BoardError(format!("board.toml: `{key}` must be a string"))),
            None => Err(BoardError(format!("board.toml: `{key}` is missing"))),
        }
    }

    /// Every `section.key` in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// The line without a `#` comment (a `#` inside a string is kept).
fn strip_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

fn parse_value(text: &str) -> Result<Value, String> {
    if let Some(rest) = text.strip_prefix('"') {
        let body = rest
            .strip_suffix('"')
            .ok_or_else(|| "unterminated string".to_string())?;
        if body.contains('"') || body.contains('\\') {
            return Err("escapes and inner quotes are not supported".into());
        }
        return Ok(Value::Str(body.to_string()));
    }
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    if text.starts_with('_') || text.ends_with('_') || text.contains("__") || digits.is_empty() {
        return Err(format!("bad number `{text}`"));
    }
    let parsed = match digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => digits.parse::<u64>(),
    };
    parsed
        .map(Value::Int)
        .map_err(|_| format!("bad number `{text}` (unsigned decimal or 0x-hex)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_numbers_and_strings() {
        let b = BoardToml::parse(
            "# head\n[image]\nload_address = 0xC008_0000 # comment\nstack_pages = 256\n\n[net]\nmac = \"02:00#:00\"\nempty = \"\"\n",
        )
        .unwrap();
        assert_eq!(b.int("image.load_address").unwrap(), 0xC008_0000);
        assert_eq!(b.int("image.stack_pages").unwrap(), 256);
        assert_eq!(b.string("net.mac").unwrap(), "02:00#:00");
        assert_eq!(b.string("net.empty").unwrap(), "");
        assert!(b.int("net.mac").is_err());
        assert!(b.string("image.stack_pages").is_err());
        assert!(b.int("image.missing").is_err());
        assert_eq!(b.keys().count(), 4);
    }

    #[test]
    fn bad_lines_are_typed_errors_with_line_numbers() {
        for (text, line) in [
            ("[a\n", 1),
            ("[a]\nx = 0xZZ\n", 2),
            ("x = 1\nx = 2\n", 2),
            ("x 1\n", 1),
            ("x = \"open\n", 1),
            ("x = 1__0\n", 1),
            ("x = 99999999999999999999\n", 1),
            ("x = -1\n", 1),
            ("bad key = 1\n", 1),
        ] {
            let e = BoardToml::parse(text).unwrap_err();
            assert!(e.0.contains(&format!("line {line}:")), "{text:?} gave {e}");
        }
    }
}

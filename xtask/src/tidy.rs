//! Source rules that the compiler does not check, read from the text of the
//! Rust sources (comments and string literals are blanked first, so prose
//! about `unsafe` or a `todo!()` inside a string does not count):
//!
//! * in the safe, allocation-free crates ([`SAFE_NO_ALLOC_CRATE_DIRS`]):
//!   no `unsafe` and no `extern crate alloc` under `src/`, and `src/lib.rs`
//!   declares `#![no_std]` and `#![forbid(unsafe_code)]`; the one
//!   exception, [`UNSAFE_MODULES`] (the shared-memory accessor in `abi/`),
//!   may hold `unsafe`, and its crate root then says
//!   `#![deny(unsafe_code)]` and `#![deny(clippy::undocumented_unsafe_blocks)]`;
//! * everywhere: no `todo!`, `unimplemented!` or `#[ignore]`.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use crate::project::{SAFE_NO_ALLOC_CRATE_DIRS, TIDY_SKIP_DIRS, UNSAFE_MODULES};
use crate::util::{project_root, Error};

/// One broken rule at a place in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: PathBuf,
    pub line: usize,
    pub rule: &'static str,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.rule)
    }
}

/// Runs every tidy rule over the project; fails listing each violation.
pub fn run() -> Result<(), Error> {
    let root = project_root();
    let mut files = Vec::new();
    collect_rust_files(&root, &root, &mut files)?;
    files.sort();
    let mut violations = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(&root).unwrap_or(file).to_path_buf();
        let text = fs::read_to_string(file)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", file.display())))?;
        let code = strip_comments_and_strings(&text);
        violations.extend(check_everywhere(&rel, &code));
        let must_be_safe = SAFE_NO_ALLOC_CRATE_DIRS
            .iter()
            .any(|dir| rel.starts_with(Path::new(dir).join("src")));
        let unsafe_module = UNSAFE_MODULES.iter().any(|m| rel == Path::new(m));
        if must_be_safe {
            violations.extend(
                check_safe_no_alloc(&rel, &code)
                    .into_iter()
                    .filter(|v| !(unsafe_module && v.rule == UNSAFE_RULE)),
            );
        }
    }
    for dir in SAFE_NO_ALLOC_CRATE_DIRS {
        let lib = Path::new(dir).join("src/lib.rs");
        let text = fs::read_to_string(root.join(&lib))
            .map_err(|e| Error::new(format!("cannot read {}: {e}", lib.display())))?;
        let has_unsafe_module = UNSAFE_MODULES
            .iter()
            .any(|m| Path::new(m).starts_with(Path::new(dir).join("src")));
        violations.extend(check_crate_attributes(
            &lib,
            &strip_comments_and_strings(&text),
            has_unsafe_module,
        ));
    }
    println!(
        "tidy: read {} Rust files; safe, allocation-free crates: {}",
        files.len(),
        SAFE_NO_ALLOC_CRATE_DIRS.join(", ")
    );
    if violations.is_empty() {
        return Ok(());
    }
    for v in &violations {
        eprintln!("tidy: {v}");
    }
    Err(Error::new(format!(
        "tidy found {} violation(s)",
        violations.len()
    )))
}

fn collect_rust_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let entries =
        fs::read_dir(dir).map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let file_type = entry.file_type()?;
        if file_type.is_dir() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let skipped =
                name.starts_with('.') || TIDY_SKIP_DIRS.iter().any(|d| rel == Path::new(d));
            if !skipped {
                collect_rust_files(root, &path, out)?;
            }
        } else if file_type.is_file() && name.ends_with(".rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// Rules for every Rust file: no unfinished code, no skipped tests.
pub fn check_everywhere(path: &Path, code: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    for (i, line) in code.lines().enumerate() {
        let squeezed: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        let mut report = |rule| {
            out.push(Violation {
                path: path.to_path_buf(),
                line: i + 1,
                rule,
            })
        };
        if has_macro_call(line, "todo") {
            report("`todo!` left in the code");
        }
        if has_macro_call(line, "unimplemented") {
            report("`unimplemented!` left in the code");
        }
        if squeezed.contains("#[ignore]") || squeezed.contains("#[ignore=") {
            report("`#[ignore]` test: fix or delete it");
        }
    }
    out
}

/// Rules for the safe, allocation-free crates' sources. One exception:
/// `extern crate alloc` right under `#[cfg(feature = "alloc")]`, the
/// opt-in with which a host program hands the core heap storage (the core
/// never allocates itself; firmware never enables the feature, and the
/// `no-alloc` step proves no allocator is linked).
pub fn check_safe_no_alloc(path: &Path, code: &str) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut previous = "";
    for (i, line) in code.lines().enumerate() {
        // String literals are blanked: match the attribute's shape.
        let gated = previous
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect::<String>()
            .starts_with("#[cfg(feature=");
        if !line.trim().is_empty() {
            previous = line;
        }
        let words: Vec<&str> = words(line).collect();
        let mut report = |rule| {
            out.push(Violation {
                path: path.to_path_buf(),
                line: i + 1,
                rule,
            })
        };
        if words.contains(&"unsafe") {
            report(UNSAFE_RULE);
        }
        if words.windows(3).any(|w| w == ["extern", "crate", "alloc"]) && !gated {
            report("`extern crate alloc` in a crate that must not allocate");
        }
    }
    out
}

/// What `check_safe_no_alloc` reports for `unsafe`.
const UNSAFE_RULE: &str =
    "`unsafe` in a crate that must be safe (it belongs in platform/ or boards/)";

/// The crate root of a safe, allocation-free crate states both promises;
/// one with an [`UNSAFE_MODULES`] entry denies `unsafe` (which that module
/// allows) and undocumented `unsafe` blocks instead of forbidding it.
pub fn check_crate_attributes(path: &Path, code: &str, unsafe_module: bool) -> Vec<Violation> {
    let squeezed: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    let mut out = Vec::new();
    let safe: &[(&str, &'static str)] = if unsafe_module {
        &[
            (
                "#![deny(unsafe_code)]",
                "crate root lacks `#![deny(unsafe_code)]`",
            ),
            (
                "#![deny(clippy::undocumented_unsafe_blocks)]",
                "crate root lacks `#![deny(clippy::undocumented_unsafe_blocks)]`",
            ),
        ]
    } else {
        &[(
            "#![forbid(unsafe_code)]",
            "crate root lacks `#![forbid(unsafe_code)]`",
        )]
    };
    let required = std::iter::once(&("#![no_std]", "crate root lacks `#![no_std]`")).chain(safe);
    for &(attribute, rule) in required {
        if !squeezed.contains(attribute) {
            out.push(Violation {
                path: path.to_path_buf(),
                line: 1,
                rule,
            });
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The identifiers and keywords of one line, in order.
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !is_ident_char(c))
        .filter(|w| !w.is_empty())
}

/// Whether `line` calls the macro `name!` (as a whole word).
fn has_macro_call(line: &str, name: &str) -> bool {
    let mut from = 0;
    while let Some(pos) = line[from..].find(name) {
        let start = from + pos;
        let end = start + name.len();
        let before_ok = !line[..start].chars().next_back().is_some_and(is_ident_char);
        let after = line[end..].trim_start();
        if before_ok && after.starts_with('!') {
            return true;
        }
        from = end;
    }
    false
}

/// Replaces comments, string literals and character literals with spaces,
/// keeping newlines so line numbers stay right. Handles nested block
/// comments, raw strings (`r#"..."#`), escapes, and tells a lifetime (`'a`)
/// from a character literal (`'a'`).
pub fn strip_comments_and_strings(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_is_ident = i > 0 && is_ident_char(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i, prev_is_ident) {
            // `r`, the hashes and the opening quote.
            let open = 1 + hashes + 1;
            for _ in 0..open {
                out.push(' ');
            }
            i += open;
            while i < chars.len() {
                let closes =
                    chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#'));
                if closes {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() {
                match chars[i] {
                    '\\' => {
                        out.push(' ');
                        if let Some(&escaped) = chars.get(i + 1) {
                            out.push(blank(escaped));
                        }
                        i += 2;
                    }
                    '"' => {
                        out.push(' ');
                        i += 1;
                        break;
                    }
                    other => {
                        out.push(blank(other));
                        i += 1;
                    }
                }
            }
        } else if c == '\'' {
            match char_literal_len(&chars, i) {
                Some(len) => {
                    for _ in 0..len {
                        out.push(' ');
                    }
                    i += len;
                }
                None => {
                    // A lifetime or loop label: keep it.
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// If a raw string (`r"`, `r#"`, `br##"`, ...) starts at `i`, the number of
/// hashes. The `b` of a raw byte string is plain text before the `r`.
fn raw_string_start(chars: &[char], i: usize, prev_is_ident: bool) -> Option<usize> {
    let after_b = i > 0 && chars[i - 1] == 'b' && !(i > 1 && is_ident_char(chars[i - 2]));
    if chars[i] != 'r' || (prev_is_ident && !after_b) {
        return None;
    }
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some(j - i - 1)
}

/// If a character literal starts at `i` (on its `'`), its length in chars.
fn char_literal_len(chars: &[char], i: usize) -> Option<usize> {
    match chars.get(i + 1)? {
        '\\' => {
            // An escape: `'\n'`, `'\''`, `'\x7f'`, `'\u{1F600}'`.
            let mut j = i + 3;
            while j < chars.len() && j < i + 12 {
                if chars[j] == '\'' {
                    return Some(j - i + 1);
                }
                j += 1;
            }
            None
        }
        _ => (chars.get(i + 2) == Some(&'\'')).then_some(3),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(s: &str) -> String {
        strip_comments_and_strings(s)
    }

    #[test]
    fn comments_and_strings_are_blanked_but_lines_kept() {
        let src = "a // unsafe\n/* x /* unsafe */ y */ b\n\"unsafe\\\" todo!()\" c\n";
        let out = strip(src);
        assert_eq!(out.lines().count(), 3);
        assert_eq!(out.len(), src.len());
        assert!(!out.contains("unsafe"));
        assert!(!out.contains("todo"));
        assert_eq!(words(&out).collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn raw_strings_and_char_literals_are_blanked() {
        let out = strip(r####"let s = r#"unsafe "quoted" "#; let b = br"unsafe"; x"####);
        assert!(!out.contains("unsafe"), "{out}");
        assert!(out.contains('x'));
        let out = strip(r#"let q = '"'; let e = '\''; unsafe_here"#);
        assert!(out.contains("unsafe_here"), "{out}");
    }

    #[test]
    fn lifetimes_are_not_char_literals() {
        let src = "fn f<'a>(x: &'a str) -> &'a str { unsafe { x } }";
        assert_eq!(strip(src), src);
    }

    #[test]
    fn alloc_behind_its_feature_gate_is_allowed() {
        let code = "#[cfg(feature = \"alloc\")]\nextern crate alloc;\nextern crate alloc;\n";
        let v = check_safe_no_alloc(Path::new("lib.rs"), &strip_comments_and_strings(code));
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].line, 3);
    }

    #[test]
    fn unsafe_and_alloc_are_found_in_code_only() {
        let path = Path::new("core/src/x.rs");
        let code = strip(
            "//! no `unsafe` here\n#![forbid(unsafe_code)]\nfn f() { unsafe { g() } }\nextern  crate alloc;\n",
        );
        let v = check_safe_no_alloc(path, &code);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].line, 3);
        assert_eq!(v[1].line, 4);
        assert!(v[1].rule.contains("alloc"));
    }

    #[test]
    fn unfinished_code_and_ignored_tests_are_found() {
        let path = Path::new("any.rs");
        let code = strip(
            "fn a() { todo!() }\nfn b() { unimplemented !() }\n#[ignore = \"slow\"]\n# [ ignore ]\nfn todo_list() {}\nlet s = \"todo!()\";\n",
        );
        let lines: Vec<usize> = check_everywhere(path, &code)
            .iter()
            .map(|v| v.line)
            .collect();
        assert_eq!(lines, [1, 2, 3, 4]);
    }

    #[test]
    fn crate_attributes_are_required() {
        let path = Path::new("core/src/lib.rs");
        let good = strip("//! doc\n#![no_std]\n#![forbid( unsafe_code )]\n");
        assert!(check_crate_attributes(path, &good, false).is_empty());
        let commented = strip("// #![no_std]\n#![forbid(unsafe_code)]\n");
        assert_eq!(check_crate_attributes(path, &commented, false).len(), 1);
        // A crate with the one unsafe module denies instead of forbidding,
        // and denies undocumented unsafe blocks.
        let path = Path::new("abi/src/lib.rs");
        let denied = strip(
            "#![no_std]\n#![deny(unsafe_code)]\n#![deny(clippy::undocumented_unsafe_blocks)]\n",
        );
        assert!(check_crate_attributes(path, &denied, true).is_empty());
        assert_eq!(check_crate_attributes(path, &good, true).len(), 2);
        let undocumented = strip("#![no_std]\n#![deny(unsafe_code)]\n");
        assert_eq!(check_crate_attributes(path, &undocumented, true).len(), 1);
    }
}

//! Running commands and reporting errors.

use std::fmt;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// An xtask failure: a message for the person at the terminal.
#[derive(Debug)]
pub struct Error(String);

impl Error {
    pub fn new(msg: impl Into<String>) -> Error {
        Error(msg.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error(e.to_string())
    }
}

/// The workspace root (the parent of this crate's folder). Every command
/// runs from here, so `cargo xtask` works from any subfolder.
pub fn project_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or(manifest_dir)
}

/// Cargo's target folder: `$CARGO_TARGET_DIR`, else `target/` in the root.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| project_root().join("target"))
}

/// A `cargo` command in the project root. Uses the `cargo` that started the
/// xtask (`$CARGO`), so the toolchain of `rust-toolchain.toml` is used.
pub fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args).current_dir(project_root());
    cmd
}

/// How a command is shown to the reader: program name and arguments.
pub fn display(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Flags the xtask added for the firmware target, shown as the
    // `RUSTFLAGS` a reader would type to build the same thing.
    let flags = cmd
        .get_envs()
        .find(|(key, _)| *key == "CARGO_ENCODED_RUSTFLAGS")
        .and_then(|(_, value)| value)
        .map(|v| v.to_string_lossy().replace('\x1f', " "));
    let mut s = match flags {
        Some(flags) if !flags.is_empty() => format!("RUSTFLAGS='{flags}' {program}"),
        _ => program,
    };
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs `cmd` with inherited output; fails if it cannot start or exits
/// non-zero.
pub fn run(cmd: &mut Command) -> Result<(), Error> {
    println!("$ {}", display(cmd));
    let status = cmd
        .status()
        .map_err(|e| Error::new(format!("cannot run `{}`: {e}", display(cmd))))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::new(format!("`{}` failed ({status})", display(cmd))))
    }
}

/// Runs `cmd` and returns its stdout; stderr is passed through.
pub fn output(cmd: &mut Command) -> Result<String, Error> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::new(format!("cannot run `{}`: {e}", display(cmd))))?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "`{}` failed ({})",
            display(cmd),
            out.status
        )));
    }
    String::from_utf8(out.stdout)
        .map_err(|_| Error::new(format!("`{}` printed non-UTF-8 output", display(cmd))))
}

/// Runs `cmd`, echoing its stdout line by line while handing each line to
/// `on_line` (so a step can read `test result:` lines as they pass).
/// Returns whether the command succeeded.
pub fn run_streaming(cmd: &mut Command, mut on_line: impl FnMut(&str)) -> Result<bool, Error> {
    println!("$ {}", display(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| Error::new(format!("cannot run `{}`: {e}", display(cmd))))?;
    if let Some(stdout) = child.stdout.take() {
        let out = std::io::stdout();
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            on_line(&line);
            let mut out = out.lock();
            writeln!(out, "{line}")?;
            out.flush()?;
        }
    }
    Ok(child.wait()?.success())
}

/// Extracts the string value of `"key":"..."` from one JSON text. Enough
/// for cargo's machine-readable messages without a JSON dependency.
pub fn json_string_field(json: &str, key: &str) -> Option<String> {
    let pattern = format!("\"{key}\":\"");
    let start = json.find(&pattern)? + pattern.len();
    parse_json_string(&json[start..]).map(|(value, _)| value)
}

/// Extracts the strings of `"key":["...", ...]` from one JSON text.
pub fn json_string_array(json: &str, key: &str) -> Option<Vec<String>> {
    let pattern = format!("\"{key}\":[");
    let mut rest = &json[json.find(&pattern)? + pattern.len()..];
    let mut values = Vec::new();
    loop {
        rest = rest.trim_start_matches([' ', ',', '\n', '\t']);
        if rest.starts_with(']') {
            return Some(values);
        }
        let (value, used) = parse_json_string(rest.strip_prefix('"')?)?;
        values.push(value);
        rest = &rest[1 + used..];
    }
}

/// Parses a JSON string body that starts right after its opening quote;
/// returns the value and the bytes consumed including the closing quote.
fn parse_json_string(text: &str) -> Option<(String, usize)> {
    let mut value = String::new();
    let mut chars = text.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, i + 1)),
            '\\' => match chars.next()?.1 {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                other => value.push(other),
            },
            other => value.push(other),
        }
    }
    None
}

/// A duration as the reader wants it: `0.42 s`, `1 min 03 s`.
pub fn fmt_duration(d: std::time::Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.2} s")
    } else {
        let whole = d.as_secs();
        format!("{} min {:02} s", whole / 60, whole % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn json_field_is_found_and_unescaped() {
        let json = r#"{"packages":[],"target_directory":"/a/b \"c\"\\d","version":1}"#;
        assert_eq!(
            json_string_field(json, "target_directory").as_deref(),
            Some("/a/b \"c\"\\d")
        );
        assert_eq!(json_string_field(json, "missing"), None);
        assert_eq!(json_string_field(r#"{"k":"unterminated"#, "k"), None);
    }

    #[test]
    fn json_array_is_found() {
        let json = r#"{"reason":"compiler-artifact","filenames":["/t/a.rlib", "/t/b \"x\".rmeta"],"fresh":true}"#;
        assert_eq!(
            json_string_array(json, "filenames"),
            Some(vec![
                "/t/a.rlib".to_string(),
                "/t/b \"x\".rmeta".to_string()
            ])
        );
        assert_eq!(
            json_string_array(r#"{"filenames":[]}"#, "filenames"),
            Some(vec![])
        );
        assert_eq!(
            json_string_array(r#"{"filenames":["/t/a"#, "filenames"),
            None
        );
        assert_eq!(json_string_array(r#"{"other":[]}"#, "filenames"), None);
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(fmt_duration(Duration::from_millis(420)), "0.42 s");
        assert_eq!(fmt_duration(Duration::from_secs(63)), "1 min 03 s");
    }

    #[test]
    fn commands_display_without_program_path() {
        let mut cmd = Command::new("/usr/bin/cargo");
        cmd.args(["fmt", "--all"]);
        assert_eq!(display(&cmd), "cargo fmt --all");
    }
}

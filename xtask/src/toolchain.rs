//! The Rust toolchain's targets and components, installed by the xtask
//! itself: `rust-toolchain.toml` lists what the project needs (the
//! firmware target `aarch64-unknown-none`, `rustfmt`, `clippy`,
//! `llvm-tools`, `rust-src`), but a toolchain installed before that file
//! was read (or by hand) may lack some, and then `cargo xtask qemu` failed
//! with "can't find crate for `core`". Every xtask command first compares
//! the file with `rustup target list --installed` and
//! `rustup component list --installed` ([`missing_commands`], a pure
//! function with unit tests) and runs the `rustup target add` /
//! `rustup component add` it finds missing, as it installs QEMU when that
//! is missing. Without rustup it says what is needed instead.

use std::process::Command;

use crate::system;
use crate::util::{self, Error};

/// What `rust-toolchain.toml` asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolchainFile {
    pub targets: Vec<String>,
    pub components: Vec<String>,
}

/// Reads the `targets` and `components` arrays of a `rust-toolchain.toml`
/// (single- or multi-line arrays of strings; the rest of TOML is not
/// needed here).
pub fn parse_toolchain_file(text: &str) -> ToolchainFile {
    ToolchainFile {
        targets: string_array(text, "targets"),
        components: string_array(text, "components"),
    }
}

/// The strings of `key = ["a", "b"]`, or none when the key is absent.
fn string_array(text: &str, key: &str) -> Vec<String> {
    // Comments end at the line's end; drop them before joining lines.
    let text: String = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let Some(start) = text
        .lines()
        .scan(0, |offset, line| {
            let at = *offset;
            *offset += line.len() + 1;
            Some((at, line))
        })
        .find_map(|(at, line)| {
            let (k, _) = line.split_once('=')?;
            (k.trim() == key).then_some(at)
        })
    else {
        return Vec::new();
    };
    let rest = &text[start..];
    let Some(open) = rest.find('[') else {
        return Vec::new();
    };
    let Some(close) = rest[open..].find(']') else {
        return Vec::new();
    };
    rest[open + 1..open + close]
        .split(',')
        .map(|item| {
            item.trim()
                .trim_matches(|c| c == '"' || c == '\'')
                .to_string()
        })
        .filter(|item| !item.is_empty())
        .collect()
}

/// Whether `rustup component list --installed` shows `component`: rustup
/// prints host components with the host's triple (`clippy-x86_64-...`)
/// and target-independent ones bare (`rust-src`).
fn component_installed(installed: &str, component: &str, host: &str) -> bool {
    installed.lines().map(str::trim).any(|line| {
        line == component
            || line
                .strip_prefix(component)
                .and_then(|rest| rest.strip_prefix('-'))
                == Some(host)
    })
}

/// The `rustup` commands that install what `wanted` lists and the
/// `installed_*` listings lack (each command as its arguments; none when
/// nothing is missing). `host` is the host triple (`rustc -vV`).
pub fn missing_commands(
    wanted: &ToolchainFile,
    installed_targets: &str,
    installed_components: &str,
    host: &str,
) -> Vec<Vec<String>> {
    let missing_targets: Vec<&String> = wanted
        .targets
        .iter()
        .filter(|t| {
            !installed_targets
                .lines()
                .any(|line| line.trim() == t.as_str())
        })
        .collect();
    let missing_components: Vec<&String> = wanted
        .components
        .iter()
        .filter(|c| !component_installed(installed_components, c, host))
        .collect();
    let mut commands = Vec::new();
    if !missing_targets.is_empty() {
        let mut cmd = vec!["target".to_string(), "add".into()];
        cmd.extend(missing_targets.into_iter().cloned());
        commands.push(cmd);
    }
    if !missing_components.is_empty() {
        let mut cmd = vec!["component".to_string(), "add".into()];
        cmd.extend(missing_components.into_iter().cloned());
        commands.push(cmd);
    }
    commands
}

/// The host triple of the `rustc` that runs the build.
fn host_triple() -> Result<String, Error> {
    let text = util::output(
        Command::new("rustc")
            .arg("-vV")
            .current_dir(util::project_root()),
    )?;
    text.lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .ok_or_else(|| Error::new("`rustc -vV` printed no host line"))
}

fn rustup(args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    // In the project root, so rustup picks the toolchain of
    // `rust-toolchain.toml` (also named by `RUSTUP_TOOLCHAIN`, which
    // rustup's cargo proxy sets for the xtask).
    cmd.args(args).current_dir(util::project_root());
    cmd
}

/// What is missing now: the commands [`missing_commands`] returns for this
/// machine.
pub fn missing_on_this_machine() -> Result<Vec<Vec<String>>, Error> {
    let path = util::project_root().join("rust-toolchain.toml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::new(format!("reading {}: {e}", path.display())))?;
    let wanted = parse_toolchain_file(&text);
    let targets = util::output(&mut rustup(&["target", "list", "--installed"]))?;
    let components = util::output(&mut rustup(&["component", "list", "--installed"]))?;
    Ok(missing_commands(
        &wanted,
        &targets,
        &components,
        &host_triple()?,
    ))
}

/// Installs the targets and components of `rust-toolchain.toml` that the
/// toolchain lacks. Silent when nothing is missing. Without rustup it only
/// checks that the firmware target can be found, and says what to do.
pub fn ensure() -> Result<(), Error> {
    if system::find_on_path("rustup").is_none() {
        eprintln!(
            "xtask: rustup not found; the toolchain must already have what rust-toolchain.toml lists"
        );
        return Ok(());
    }
    for args in missing_on_this_machine()? {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        println!("xtask: the toolchain lacks what rust-toolchain.toml lists; installing");
        util::run(&mut rustup(&args))?;
    }
    Ok(())
}

/// Test step `toolchain`: the real provisioning on this machine (a no-op
/// where everything is installed), then proof that nothing is missing.
/// What it would do on a machine without the firmware target is shown by
/// the unit tests, which feed [`missing_commands`] such listings.
pub fn test_step(ctx: &mut crate::test::Context) -> Result<(), Error> {
    ensure()?;
    if system::find_on_path("rustup").is_none() {
        println!("toolchain: no rustup; nothing to check");
        return Ok(());
    }
    let missing = missing_on_this_machine()?;
    let ok = missing.is_empty();
    println!(
        "toolchain: every target and component of rust-toolchain.toml installed ... {}",
        if ok { "ok" } else { "FAILED" }
    );
    ctx.ran_tests = true;
    if ok {
        ctx.tally.passed += 1;
        Ok(())
    } else {
        ctx.tally.failed += 1;
        Err(Error::new(format!(
            "still missing after provisioning: {missing:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "x86_64-unknown-linux-gnu";

    /// `rustup component list --installed` of a complete toolchain.
    const ALL_COMPONENTS: &str = "cargo-x86_64-unknown-linux-gnu
clippy-x86_64-unknown-linux-gnu
llvm-tools-x86_64-unknown-linux-gnu
rust-docs-x86_64-unknown-linux-gnu
rust-src
rust-std-aarch64-unknown-none
rust-std-x86_64-unknown-linux-gnu
rustc-x86_64-unknown-linux-gnu
rustfmt-x86_64-unknown-linux-gnu
";

    fn project_file() -> ToolchainFile {
        let text = std::fs::read_to_string(util::project_root().join("rust-toolchain.toml"))
            .expect("rust-toolchain.toml");
        parse_toolchain_file(&text)
    }

    #[test]
    fn the_project_file_lists_the_firmware_target_and_tools() {
        let file = project_file();
        assert_eq!(file.targets, [crate::project::FIRMWARE_TARGET]);
        for component in ["rustfmt", "clippy", "llvm-tools", "rust-src"] {
            assert!(
                file.components.iter().any(|c| c == component),
                "{component}"
            );
        }
    }

    #[test]
    fn a_toolchain_without_the_firmware_target_gets_it_added() {
        // A fresh machine's case: the pinned toolchain installed without
        // `aarch64-unknown-none`.
        let installed_targets = "x86_64-unknown-linux-gnu\n";
        let components = ALL_COMPONENTS.replace("rust-std-aarch64-unknown-none\n", "");
        assert_eq!(
            missing_commands(&project_file(), installed_targets, &components, HOST),
            [["target", "add", "aarch64-unknown-none"]]
        );
    }

    #[test]
    fn missing_components_are_added_in_one_command() {
        let installed_targets = "aarch64-unknown-none\nx86_64-unknown-linux-gnu\n";
        let components = "cargo-x86_64-unknown-linux-gnu\nrust-std-x86_64-unknown-linux-gnu\nrustc-x86_64-unknown-linux-gnu\n";
        let commands = missing_commands(&project_file(), installed_targets, components, HOST);
        assert_eq!(commands.len(), 1);
        assert_eq!(commands[0][..2], ["component", "add"]);
        let mut named: Vec<&str> = commands[0][2..].iter().map(String::as_str).collect();
        named.sort();
        assert_eq!(named, ["clippy", "llvm-tools", "rust-src", "rustfmt"]);
    }

    #[test]
    fn a_complete_toolchain_needs_nothing() {
        let installed_targets = "aarch64-unknown-none\nx86_64-unknown-linux-gnu\n";
        assert!(
            missing_commands(&project_file(), installed_targets, ALL_COMPONENTS, HOST).is_empty()
        );
    }

    #[test]
    fn component_names_are_not_matched_by_prefix() {
        // `rust-src` must not count as installed because of `rust-std-...`,
        // nor `llvm-tools` because of a component for another host.
        assert!(!component_installed(
            "rust-std-x86_64-unknown-linux-gnu\n",
            "rust-src",
            HOST
        ));
        assert!(!component_installed(
            "llvm-tools-aarch64-unknown-linux-gnu\n",
            "llvm-tools",
            HOST
        ));
        assert!(component_installed("rust-src\n", "rust-src", HOST));
        assert!(component_installed(
            "llvm-tools-x86_64-unknown-linux-gnu\n",
            "llvm-tools",
            HOST
        ));
    }

    #[test]
    fn toolchain_files_are_read_with_comments_and_multi_line_arrays() {
        let text = "[toolchain]\nchannel = \"1.95.0\" # pinned\ncomponents = [\n  \"rustfmt\", # formatting\n  'clippy',\n]\ntargets = [\"aarch64-unknown-none\", \"thumbv7em-none-eabihf\"]\n";
        assert_eq!(
            parse_toolchain_file(text),
            ToolchainFile {
                targets: vec![
                    "aarch64-unknown-none".into(),
                    "thumbv7em-none-eabihf".into()
                ],
                components: vec!["rustfmt".into(), "clippy".into()],
            }
        );
        assert_eq!(
            parse_toolchain_file("[toolchain]\n"),
            ToolchainFile::default()
        );
    }
}

//! The committed C header `include/metaroce_verbs.h` is exactly what
//! cbindgen generates from the C API today. `METAROCE_BLESS=1` rewrites it.

use std::path::Path;

#[test]
fn committed_header_matches_the_c_api() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen runs over the library")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/metaroce_verbs.h");
    if std::env::var_os("METAROCE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale: rerun with METAROCE_BLESS=1 and commit it",
        path.display()
    );
}

/// The C names: every function, type and constant of the header starts
/// with `metaroce_` (`METAROCE_` for constants), so nothing collides with
/// the ABI header's `mr_*` structures or stutters; no Rust type leaks as
/// an opaque struct but the three handles.
#[test]
fn every_c_name_has_one_prefix_and_only_the_handles_are_opaque() {
    let header = include_str!("../include/metaroce_verbs.h");
    let mut opaque = Vec::new();
    for line in header.lines().filter(|l| !l.starts_with("//")) {
        if let Some(name) = line.strip_prefix("#define ") {
            let name = name.split_whitespace().next().unwrap_or("");
            assert!(
                name.starts_with("METAROCE_"),
                "constant {name} lacks the prefix"
            );
        } else if let Some(rest) = line.strip_prefix("struct ") {
            let name = rest.trim_end_matches([';', ' ', '{']);
            assert!(name.starts_with("metaroce_"), "struct {name}");
            if rest.ends_with(';') {
                opaque.push(name.to_string());
            }
        } else if let Some(rest) = line.strip_prefix("typedef ") {
            let name = rest.trim_end_matches(';').rsplit(' ').next().unwrap_or("");
            assert!(name.starts_with("metaroce_"), "typedef {name}");
        } else if let Some(open) = line.find('(') {
            if line.ends_with(';') && !line.starts_with(' ') {
                let name = line[..open].rsplit([' ', '*']).next().unwrap_or("");
                assert!(name.starts_with("metaroce_"), "function {name}");
            }
        }
    }
    opaque.sort();
    assert_eq!(opaque, ["metaroce_cq", "metaroce_device", "metaroce_qp"]);
}

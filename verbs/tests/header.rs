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

//! Generates the libfabric bindings from the system's headers
//! (`libfabric-dev`; bindgen needs `libclang-dev`).

use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-link-lib=fabric");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        // Only libfabric's own names; libc's come from the `libc` crate.
        .allowlist_type("fi_.*|fid.*|fid_.*")
        .allowlist_var("FI_.*")
        .allowlist_function("fi_(dupinfo|allocinfo|freeinfo|strerror|tostr|version)")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "cannot generate the libfabric bindings from <rdma/fabric.h> ({e}); \
                 install them: apt-get install libfabric-dev libclang-dev"
            )
        });
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs");
}

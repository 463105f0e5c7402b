//! `metaroce-qemu`: command-line front end of the harness (work in progress).

fn main() {
    eprintln!("metaroce-qemu: not ready yet (issue 4)");
    std::process::exit(2);
}

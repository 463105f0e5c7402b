//! The example of `docs/guide/host-library.md` (`examples/guide.rs`) run
//! against two fake DPUs, so the guide's code is built and run by the
//! tests.

mod common;

#[path = "../examples/guide.rs"]
mod guide;

use common::{dpu_addr, FakeDpus};

#[test]
fn the_guides_example_writes_its_message() {
    let dpus = FakeDpus::start("guide");
    let shm = |i: usize| dpus.paths[i].to_str().unwrap().to_string();
    let got = guide::run(&shm(0), &shm(1), dpu_addr(1)).unwrap();
    assert_eq!(got, guide::MESSAGE);
}

//! # metaroce-compliance
//!
//! The MetaRoCE compliance suite (spec 5.2.3): it tests an implementation
//! from outside, over UDP, by playing its peer. Every packet is built by
//! hand with `metaroce_core::wire`, so the suite can reorder, duplicate,
//! drop and break them; the target's memory is checked through later READs.
//!
//! The target must run the *serve profile* of `metaroce serve` (see
//! `metaroce_host::app`): accept connections, answer an announcement SEND
//! with a SEND describing a fresh region pre-filled with a known pattern
//! and a small read-only region. It is **not** a load test or a fuzzer.
//!
//! The host-interface cases (`device`, spec chapter 6) play host
//! processes of a DPU through its shared memory instead.
//!
//! Usage: `metaroce-compliance --target ADDR:PORT` (or `cargo xtask
//! compliance --target host`), or `metaroce-compliance SHM0 ADDR0 SHM1
//! ADDR1` for two devices' host interfaces. Prints a pass/fail table; exit code 0 when
//! every case passed, 1 otherwise, 2 on a usage error.

pub mod cases;
pub mod device;
pub mod peer;
pub mod protect;
pub mod report;
pub mod secrets;

//! # metaroce-qemu
//!
//! Host harness for the QEMU firmware runs (work in progress: see issue 4).

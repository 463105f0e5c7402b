//! Facts about the project that several steps need, kept in one place.

/// The bare-metal target of the DPU firmware and of QEMU `virt`.
pub const FIRMWARE_TARGET: &str = "aarch64-unknown-none";

/// The cargo profile board firmware is built with (root `Cargo.toml`:
/// fat LTO, opt-level per crate, the engine loop for size), and the folder
/// under `target/aarch64-unknown-none/` it lands in.
pub const FIRMWARE_PROFILE: &str = "firmware";

/// [`FIRMWARE_PROFILE`] with the engine loop compiled for speed: for a
/// board whose code budget allows it (the Elba's).
pub const FIRMWARE_SPEED_PROFILE: &str = "firmware-speed";

/// Library crates that are `no_std` and must build for [`FIRMWARE_TARGET`]:
/// each is linted for that target. Add `metaroce-platform` etc. here.
pub const NO_STD_CRATES: &[&str] = &[
    "metaroce-core",
    "roce-baseline",
    "metaroce-platform",
    "metaroce-app",
    "metaroce-abi",
];

/// `no_std` crates built in release for [`FIRMWARE_TARGET`] whose compiled
/// code, dependencies included, must not reference an allocator.
pub const ALLOCATION_FREE_CRATES: &[&str] = &["metaroce-core", "metaroce-platform"];

/// Crate folders (relative to the root) whose `src/` must contain no
/// `unsafe` and no `alloc`, and whose `src/lib.rs` must declare `#![no_std]`
/// and `#![forbid(unsafe_code)]` (the tidy step). `unsafe` belongs in
/// `platform/` and `boards/` only.
pub const SAFE_NO_ALLOC_CRATE_DIRS: &[&str] = &["core", "abi", "boards/hal", "boards/node/engine"];

/// The one module of a safe crate allowed `unsafe`, each block with its
/// `SAFETY:` comment: the shared-memory accessor both the firmware and the
/// host library use (`metaroce_abi::shmem`). Its crate root says
/// `#![deny(unsafe_code)]` (so the module can allow it) and
/// `#![deny(clippy::undocumented_unsafe_blocks)]` instead of
/// `#![forbid(unsafe_code)]`.
pub const UNSAFE_MODULES: &[&str] = &["abi/src/shmem.rs"];

/// Folders the tidy step never reads (build output, fuzzing state).
pub const TIDY_SKIP_DIRS: &[&str] = &["target", "fuzz/target", "fuzz/corpus", "fuzz/artifacts"];

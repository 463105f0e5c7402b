//! # metaroce-fabric
//!
//! A libfabric provider named `metaroce`: applications written for
//! libfabric (MPI through Open MPI's `ofi` MTL, NCCL through aws-ofi-nccl,
//! libfabric's own tools) reach MetaRoCE without a line changed. libfabric
//! loads it as an external provider (`FI_PROVIDER_PATH`, entry point
//! [`fi_prov_ini`]); its structures come from the system's `rdma/*.h`
//! through bindgen ([`sys`]).
//!
//! It offers reliable datagram endpoints (`FI_EP_RDM`) with messages,
//! tagged messages (unexpected messages held by the provider, eager below
//! 16 KiB, READ-based rendezvous above) and RMA (WRITE, WRITE with remote
//! CQ data, READ), over the MetaRoCE host engine on UDP sockets
//! ([`transport`]): one engine per domain, progressed by the calls that
//! read completions and by a thread of its own when the application is
//! busy elsewhere (`FI_PROGRESS_AUTO`, `FI_THREAD_SAFE`).
//!
//! It is **not** a kernel-bypass path (every datagram is a system call, as
//! in `metaroce-host`), and it does not offer atomics, counters, scalable
//! endpoints, shared contexts or wait sets: those calls answer
//! `-FI_ENOSYS`. `docs/guide/libfabric.md` lists every limit.

pub mod av;
pub mod cq;
pub mod domain;
pub mod ep;
pub mod fabric;
pub mod flags;
pub mod info;
pub mod matching;
pub mod memory;
pub mod queues;
pub mod sys;
pub mod transport;
pub mod wire;

use std::cell::UnsafeCell;

/// The provider structure libfabric keeps a pointer to (it writes its own
/// bookkeeping into `context`, hence a cell).
struct Provider(UnsafeCell<sys::fi_provider>);

// SAFETY: libfabric reads the structure and writes `context` from the
// thread that runs `fi_ini`, under its own lock; Rust code never touches it
// after building it.
unsafe impl Sync for Provider {}

static PROVIDER: Provider = Provider(UnsafeCell::new(sys::fi_provider {
    version: flags::PROVIDER_VERSION,
    fi_version: flags::API_VERSION,
    // SAFETY: an all-zero `fi_context` is its initial state.
    context: unsafe { std::mem::zeroed() },
    name: info::NAME.as_ptr(),
    getinfo: Some(provider_getinfo),
    fabric: Some(fabric::open),
    cleanup: Some(provider_cleanup),
}));

unsafe extern "C" fn provider_getinfo(
    version: u32,
    node: *const std::ffi::c_char,
    service: *const std::ffi::c_char,
    flags: u64,
    hints: *const sys::fi_info,
    info: *mut *mut sys::fi_info,
) -> std::ffi::c_int {
    // SAFETY: libfabric's getinfo contract, passed through.
    guard(|| unsafe { info::getinfo(version, node, service, flags, hints, info) })
}

unsafe extern "C" fn provider_cleanup() {}

/// The entry point libfabric looks up in every `lib*-fi.so` of
/// `FI_PROVIDER_PATH`.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut sys::fi_provider {
    PROVIDER.0.get()
}

/// Runs an entry point's body; a panic (a bug) becomes `-FI_EOTHER`
/// instead of unwinding into C.
pub(crate) fn guard<R: From<i32>>(f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => R::from(-(sys::FI_EOTHER as i32)),
    }
}

/// The `ssize_t` form of [`guard`].
pub(crate) fn guard_isize(f: impl FnOnce() -> isize) -> isize {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => -(sys::FI_EOTHER as isize),
    }
}

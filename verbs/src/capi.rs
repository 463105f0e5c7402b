//! The C API: the objects of the Rust API for C programs, declared in
//! `include/metaroce_verbs.h` (generated from this file by cbindgen; a
//! test checks the committed header). Every name starts with `metaroce_`
//! (`METAROCE_` for constants); the ring entries, opcodes (`MR_OP_*`),
//! statuses (`MR_STATUS_*`) and access bits (`MR_ACCESS_*`) are the ABI's,
//! from `metaroce_abi.h`.
//!
//! | object | made by | freed by | threads |
//! |---|---|---|---|
//! | `struct metaroce_device` | `metaroce_open_device` | `metaroce_close_device` | one at a time |
//! | `struct metaroce_cq` | `metaroce_create_cq` (one per device) | `metaroce_destroy_cq` | one at a time |
//! | `struct metaroce_qp` | `metaroce_create_qp` (per connection) | `metaroce_destroy_qp` | any, at once |
//!
//! A completion queue and queue pairs may be used on other threads than
//! their device, and outlive it (they keep the mapping).
//!
//! Every function returns 0 (or a count) on success and a negative
//! `METAROCE_ERR_*` code on failure; a command the device refused returns
//! `METAROCE_ERR_REFUSED - status` (`MR_STATUS_*`). Null pointers and
//! invalid strings are refused with `METAROCE_ERR_INVALID_ARGUMENT`, never
//! dereferenced.
//!
//! This file and `mapping.rs` are the only places of the library with
//! `unsafe`: here, to read the caller's pointers.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use metaroce_abi as abi;

use crate::types::{Access, Conn, Error, PostError, Remote, SendOp, SendWr, Sge};
use crate::{CompletionQueue, Device, QueuePair, WorkCompletion};

/// Invalid argument: a null pointer, a bad string or opcode.
pub const METAROCE_ERR_INVALID_ARGUMENT: c_int = -1;
/// The shared-memory file could not be opened or mapped.
pub const METAROCE_ERR_IO: c_int = -2;
/// The memory is not a MetaRoCE host interface.
pub const METAROCE_ERR_NOT_A_DEVICE: c_int = -3;
/// The device speaks another major ABI version.
pub const METAROCE_ERR_VERSION: c_int = -4;
/// The device did not become ready, or failed.
pub const METAROCE_ERR_NOT_READY: c_int = -5;
/// No free queue set.
pub const METAROCE_ERR_NO_QUEUE_SET: c_int = -6;
/// The queue is full: poll completions and retry.
pub const METAROCE_ERR_QUEUE_FULL: c_int = -7;
/// The range is outside this queue set's window.
pub const METAROCE_ERR_OUT_OF_WINDOW: c_int = -8;
/// The device did not answer in time.
pub const METAROCE_ERR_TIMEOUT: c_int = -9;
/// The connection failed before it was up.
pub const METAROCE_ERR_CONNECTION_FAILED: c_int = -10;
/// The device's layout is inconsistent.
pub const METAROCE_ERR_BAD_LAYOUT: c_int = -11;
/// The device's completion queue is already created (one per device).
pub const METAROCE_ERR_IN_USE: c_int = -12;
/// Base of refusals: the device refused with status `s` gives
/// `METAROCE_ERR_REFUSED - s`.
pub const METAROCE_ERR_REFUSED: c_int = -1000;

/// Access rights of a region: `MR_ACCESS_*` bits of `metaroce_abi.h`.
pub type metaroce_access_flags = u32;

/// An open device (one claimed queue set): admin calls and memory. Opaque;
/// one thread at a time.
#[derive(Debug)]
pub struct metaroce_device {
    device: Device,
}

/// The device's completion queue. Opaque; one thread at a time (any one,
/// not necessarily the device's).
#[derive(Debug)]
pub struct metaroce_cq {
    cq: CompletionQueue,
}

/// Posting on one connection. Opaque; any number of threads at once
/// (posts take turns on the device's rings).
#[derive(Debug)]
pub struct metaroce_qp {
    qp: QueuePair,
}

/// A connection handle.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct metaroce_conn {
    pub index: u32,
    pub generation: u32,
}

/// A local buffer: I/O address, length, key.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct metaroce_sge {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
}

/// A send-queue work request. `opcode` is `MR_OP_WRITE`, `MR_OP_WRITE_IMM`,
/// `MR_OP_SEND`, `MR_OP_SEND_IMM` or `MR_OP_READ`; `remote_*` count for
/// WRITE and READ, `imm` for the `_IMM` opcodes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct metaroce_send_wr {
    pub wr_id: u64,
    pub opcode: u8,
    pub reserved: [u8; 3],
    pub imm: u32,
    pub local: metaroce_sge,
    pub remote_addr: u64,
    pub remote_key: u32,
    pub reserved2: u32,
}

/// A receive-queue work request.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct metaroce_recv_wr {
    pub wr_id: u64,
    pub local: metaroce_sge,
}

/// A work completion. `opcode` is an `MR_OP_*`, `status` an `MR_STATUS_*`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct metaroce_wc {
    pub wr_id: u64,
    pub conn: metaroce_conn,
    pub byte_len: u32,
    pub imm: u32,
    pub opcode: u8,
    pub status: u8,
    pub has_imm: u8,
    pub reserved: u8,
}

fn code(e: &Error) -> c_int {
    match e {
        Error::Io(_) => METAROCE_ERR_IO,
        Error::NotADevice => METAROCE_ERR_NOT_A_DEVICE,
        Error::Version { .. } => METAROCE_ERR_VERSION,
        Error::NotReady | Error::DeviceFailed => METAROCE_ERR_NOT_READY,
        Error::NoFreeQueueSet => METAROCE_ERR_NO_QUEUE_SET,
        Error::BadLayout(_) => METAROCE_ERR_BAD_LAYOUT,
        Error::QueueFull => METAROCE_ERR_QUEUE_FULL,
        Error::OutOfWindow { .. } => METAROCE_ERR_OUT_OF_WINDOW,
        Error::Refused(s) => METAROCE_ERR_REFUSED - c_int::from(s.code()),
        Error::Timeout => METAROCE_ERR_TIMEOUT,
        Error::ConnectionFailed(_) => METAROCE_ERR_CONNECTION_FAILED,
        Error::InUse => METAROCE_ERR_IN_USE,
    }
}

fn done(r: Result<(), Error>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => code(&e),
    }
}

/// The device behind `dev`, or `None` for a null pointer.
///
/// # Safety
/// `dev` is null or a pointer `metaroce_open_device` returned and
/// `metaroce_close_device` has not freed, used by one thread at a time.
unsafe fn device<'a>(dev: *mut metaroce_device) -> Option<&'a mut Device> {
    // SAFETY: by the caller's contract, a non-null `dev` points to a live
    // `metaroce_device` no one else is using.
    unsafe { dev.as_mut() }.map(|d| &mut d.device)
}

fn conn(c: metaroce_conn) -> Conn {
    Conn {
        index: c.index,
        generation: c.generation,
    }
}

fn c_conn(c: Conn) -> metaroce_conn {
    metaroce_conn {
        index: c.index,
        generation: c.generation,
    }
}

fn sge(s: metaroce_sge) -> Sge {
    Sge {
        addr: s.addr,
        len: s.len,
        key: s.key,
    }
}

/// Writes `value` to `out` if `out` is not null.
///
/// # Safety
/// `out` is null or writable.
unsafe fn put<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-null, writable by the caller's contract.
        unsafe { out.write(value) };
    }
}

/// Moves `value` to the heap and writes the pointer to `out`.
///
/// # Safety
/// `out` is non-null and writable.
unsafe fn hand_out<T>(out: *mut *mut T, value: T) -> c_int {
    // SAFETY: non-null and writable by the caller's contract.
    unsafe { out.write(Box::into_raw(Box::new(value))) };
    0
}

/// Frees what `hand_out` made (null is ignored).
///
/// # Safety
/// `p` is null or came from `hand_out` and is not used afterwards.
unsafe fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: `p` came from `Box::into_raw` in `hand_out` and is freed
        // once, here.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Opens the host interface in the file `path` and claims a queue set.
///
/// # Safety
/// `path` is null or a NUL-terminated string; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_open_device(
    path: *const c_char,
    out: *mut *mut metaroce_device,
) -> c_int {
    if path.is_null() || out.is_null() {
        return METAROCE_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let Ok(path) = unsafe { CStr::from_ptr(path) }.to_str() else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match Device::open(path) {
        // SAFETY: `out` is non-null and writable by the caller's contract.
        Ok(device) => unsafe { hand_out(out, metaroce_device { device }) },
        Err(e) => code(&e),
    }
}

/// Closes a device opened by `metaroce_open_device` (null is ignored). Its
/// completion queue and queue pairs stay usable until destroyed.
///
/// # Safety
/// `dev` is null or a live device, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn metaroce_close_device(dev: *mut metaroce_device) {
    // SAFETY: the caller's contract.
    unsafe { free(dev) }
}

/// This queue set's data window (I/O addresses) and protection domain.
///
/// # Safety
/// `dev` a live device; the out pointers null or writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_query_window(
    dev: *mut metaroce_device,
    addr: *mut u64,
    len: *mut u64,
    pd: *mut u32,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    let info = d.info();
    // SAFETY: each pointer is null (skipped) or writable.
    unsafe {
        put(addr, info.window_addr);
        put(len, info.window_len);
        put(pd, info.pd);
    }
    0
}

/// Carves `len` bytes aligned to `align` out of the window.
///
/// # Safety
/// `dev` a live device; `addr` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_alloc(
    dev: *mut metaroce_device,
    len: u64,
    align: u64,
    addr: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, addr.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.alloc(len, align) {
        // SAFETY: non-null, writable by the contract.
        Ok(a) => unsafe {
            put(addr, a);
            0
        },
        Err(e) => code(&e),
    }
}

/// Copies `len` bytes from `src` into the window at `addr`.
///
/// # Safety
/// `dev` a live device; `src` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn metaroce_write(
    dev: *mut metaroce_device,
    addr: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, src.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: readable for `len` bytes by the contract.
    let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) };
    done(d.write(addr, data))
}

/// Copies `len` bytes of the window at `addr` into `dst`.
///
/// # Safety
/// `dev` a live device; `dst` writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn metaroce_read(
    dev: *mut metaroce_device,
    addr: u64,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, dst.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: writable for `len` bytes by the contract, and not aliased.
    let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
    done(d.read(addr, out))
}

/// Registers `[addr, addr + len)` with `access` (`MR_ACCESS_*` bits); the
/// key goes to `*key`.
///
/// # Safety
/// `dev` a live device; `key` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_reg_mr(
    dev: *mut metaroce_device,
    addr: u64,
    len: u64,
    access: metaroce_access_flags,
    key: *mut u32,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, key.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.register(addr, len, Access::from_bits(access)) {
        // SAFETY: non-null, writable by the contract.
        Ok(mr) => unsafe {
            put(key, mr.key);
            0
        },
        Err(e) => code(&e),
    }
}

/// Deregisters the region with `key`.
///
/// # Safety
/// `dev` a live device.
#[no_mangle]
pub unsafe extern "C" fn metaroce_dereg_mr(dev: *mut metaroce_device, key: u32) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    done(d.deregister_key(key))
}

/// Connects to `ip` (dotted IPv4 or IPv6 text) and `port`; waits until the
/// connection is up.
///
/// # Safety
/// `dev` a live device; `ip` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_connect(
    dev: *mut metaroce_device,
    ip: *const c_char,
    port: u16,
    out: *mut metaroce_conn,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false, false) = (unsafe { device(dev) }, ip.is_null(), out.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: non-null and NUL-terminated by the contract.
    let Some(ip) = unsafe { CStr::from_ptr(ip) }
        .to_str()
        .ok()
        .and_then(|s| s.parse::<IpAddr>().ok())
    else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.connect(SocketAddr::new(ip, port)) {
        // SAFETY: non-null, writable by the contract.
        Ok(c) => unsafe {
            put(out, c_conn(c));
            0
        },
        Err(e) => code(&e),
    }
}

/// Asks for the device's incoming connections.
///
/// # Safety
/// `dev` a live device.
#[no_mangle]
pub unsafe extern "C" fn metaroce_listen(dev: *mut metaroce_device) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    done(d.listen())
}

/// Waits up to `timeout_ms` for an incoming connection and accepts it.
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_accept(
    dev: *mut metaroce_device,
    timeout_ms: u32,
    out: *mut metaroce_conn,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.accept(Duration::from_millis(u64::from(timeout_ms))) {
        // SAFETY: non-null, writable by the contract.
        Ok((c, _)) => unsafe {
            put(out, c_conn(c));
            0
        },
        Err(e) => code(&e),
    }
}

/// Closes a connection gracefully (its sends complete first).
///
/// # Safety
/// `dev` a live device.
#[no_mangle]
pub unsafe extern "C" fn metaroce_disconnect(dev: *mut metaroce_device, c: metaroce_conn) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    done(d.close(conn(c)))
}

/// Gives a closed or failed connection's handle back to the device.
///
/// # Safety
/// `dev` a live device.
#[no_mangle]
pub unsafe extern "C" fn metaroce_release_conn(
    dev: *mut metaroce_device,
    c: metaroce_conn,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    done(d.release(conn(c)))
}

/// The device's completion queue (one per device: a second while the
/// first lives is `METAROCE_ERR_IN_USE`).
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_create_cq(
    dev: *mut metaroce_device,
    out: *mut *mut metaroce_cq,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.completion_queue() {
        // SAFETY: non-null, writable by the contract.
        Ok(cq) => unsafe { hand_out(out, metaroce_cq { cq }) },
        Err(e) => code(&e),
    }
}

/// Destroys a completion queue (null is ignored); the device may create
/// it again, where this one left off.
///
/// # Safety
/// `cq` is null or a live completion queue, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn metaroce_destroy_cq(cq: *mut metaroce_cq) {
    // SAFETY: the caller's contract.
    unsafe { free(cq) }
}

/// A queue pair posting on connection `c`.
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_create_qp(
    dev: *mut metaroce_device,
    c: metaroce_conn,
    out: *mut *mut metaroce_qp,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    let qp = d.queue_pair(conn(c));
    // SAFETY: non-null, writable by the contract.
    unsafe { hand_out(out, metaroce_qp { qp }) }
}

/// Destroys a queue pair (null is ignored); the connection stays.
///
/// # Safety
/// `qp` is null or a live queue pair, not used afterwards (by any thread).
#[no_mangle]
pub unsafe extern "C" fn metaroce_destroy_qp(qp: *mut metaroce_qp) {
    // SAFETY: the caller's contract.
    unsafe { free(qp) }
}

/// The C answer to a batch post: 0, or the first error, with the number
/// posted in `*bad_wr`.
///
/// # Safety
/// `bad_wr` null or writable.
unsafe fn posted(r: Result<(), PostError>, num_wr: u32, bad_wr: *mut u32) -> c_int {
    let (n, rc) = match r {
        Ok(()) => (num_wr, 0),
        Err(e) => (e.posted as u32, code(&e.error)),
    };
    // SAFETY: the caller's contract.
    unsafe { put(bad_wr, n) };
    rc
}

/// Posts the `num_wr` send work requests at `wr` in order, with one
/// doorbell. Returns 0 when all were posted; else the error of the first
/// not posted (`METAROCE_ERR_QUEUE_FULL`: poll, then post the rest;
/// `METAROCE_ERR_INVALID_ARGUMENT`: a bad opcode), none after it being
/// posted. `*bad_wr` (if not null), as `ibv_post_send`'s `bad_wr`: the
/// index of the first request not posted, that is how many were
/// (`num_wr` when all were).
///
/// # Safety
/// `qp` a live queue pair; `wr` readable for `num_wr` entries; `bad_wr`
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_post_send(
    qp: *mut metaroce_qp,
    wr: *const metaroce_send_wr,
    num_wr: u32,
    bad_wr: *mut u32,
) -> c_int {
    // SAFETY: by the caller's contract; a queue pair is shared, not
    // mutated.
    let (Some(qp), false) = (unsafe { qp.as_ref() }, wr.is_null()) else {
        // SAFETY: the caller's contract.
        unsafe { put(bad_wr, 0) };
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: readable for `num_wr` entries by the contract.
    let wrs = unsafe { std::slice::from_raw_parts(wr, num_wr as usize) };
    let conn = qp.qp.conn();
    let valid = wrs
        .iter()
        .position(|w| send_op(w).is_none())
        .unwrap_or(wrs.len());
    let r = qp.qp.shared.post_send_with(valid, |i| {
        let w = &wrs[i];
        SendWr {
            wr_id: w.wr_id,
            op: send_op(w).unwrap_or(SendOp::Send),
            local: sge(w.local),
        }
        .entry(conn)
    });
    let r = match r {
        // The requests before the bad opcode went out; it did not.
        Ok(()) if valid < wrs.len() => Err(PostError {
            posted: valid,
            error: Error::Refused(crate::Status::BadOpcode),
        }),
        r => r,
    };
    match r {
        Err(e) if e.posted == valid && valid < wrs.len() => {
            // SAFETY: the caller's contract.
            unsafe { put(bad_wr, valid as u32) };
            METAROCE_ERR_INVALID_ARGUMENT
        }
        // SAFETY: the caller's contract.
        r => unsafe { posted(r, num_wr, bad_wr) },
    }
}

fn send_op(w: &metaroce_send_wr) -> Option<SendOp> {
    let remote = Remote {
        addr: w.remote_addr,
        key: w.remote_key,
    };
    Some(match w.opcode {
        abi::OP_WRITE => SendOp::Write(remote),
        abi::OP_WRITE_IMM => SendOp::WriteImm(remote, w.imm),
        abi::OP_SEND => SendOp::Send,
        abi::OP_SEND_IMM => SendOp::SendImm(w.imm),
        abi::OP_READ => SendOp::Read(remote),
        _ => return None,
    })
}

/// Posts the `num_wr` receive work requests at `wr` in order, with one
/// doorbell; answers as `metaroce_post_send`.
///
/// # Safety
/// `qp` a live queue pair; `wr` readable for `num_wr` entries; `bad_wr`
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_post_recv(
    qp: *mut metaroce_qp,
    wr: *const metaroce_recv_wr,
    num_wr: u32,
    bad_wr: *mut u32,
) -> c_int {
    // SAFETY: by the caller's contract.
    let (Some(qp), false) = (unsafe { qp.as_ref() }, wr.is_null()) else {
        // SAFETY: the caller's contract.
        unsafe { put(bad_wr, 0) };
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: readable for `num_wr` entries by the contract.
    let wrs = unsafe { std::slice::from_raw_parts(wr, num_wr as usize) };
    let conn = qp.qp.conn();
    let r = qp.qp.shared.post_recv_with(wrs.len(), |i| {
        crate::RecvWr {
            wr_id: wrs[i].wr_id,
            local: sge(wrs[i].local),
        }
        .entry(conn)
    });
    // SAFETY: the caller's contract.
    unsafe { posted(r, num_wr, bad_wr) }
}

/// Polls up to `num_entries` completions into `wc`, as
/// `ibv_poll_cq(cq, num_entries, wc)`; returns how many (0: none yet).
///
/// # Safety
/// `cq` a live completion queue, used by one thread at a time; `wc`
/// writable for `num_entries` entries.
#[no_mangle]
pub unsafe extern "C" fn metaroce_poll_cq(
    cq: *mut metaroce_cq,
    num_entries: c_int,
    wc: *mut metaroce_wc,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(cq), false, true) = (unsafe { cq.as_mut() }, wc.is_null(), num_entries >= 0) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    let mut batch = [WorkCompletion::default(); 16];
    let mut n = 0usize;
    while n < num_entries as usize {
        let want = (num_entries as usize - n).min(batch.len());
        let got = cq.cq.poll(&mut batch[..want]);
        for c in &batch[..got] {
            let entry = metaroce_wc {
                wr_id: c.wr_id,
                conn: c_conn(c.conn),
                byte_len: c.byte_len,
                imm: c.imm.unwrap_or(0),
                opcode: c.opcode.code(),
                status: c.status.code(),
                has_imm: u8::from(c.imm.is_some()),
                reserved: 0,
            };
            // SAFETY: `n < num_entries` entries are writable by the
            // contract.
            unsafe { wc.add(n).write(entry) };
            n += 1;
        }
        if got < want {
            break;
        }
    }
    n as c_int
}

/// This queue set's counters (`struct mr_set_counters` of
/// `metaroce_abi.h`).
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_query_counters(
    dev: *mut metaroce_device,
    out: *mut abi::SetCounters,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.counters() {
        // SAFETY: non-null, writable by the contract.
        Ok(c) => unsafe {
            put(out, c);
            0
        },
        Err(e) => code(&e),
    }
}

/// This queue set's quota: limits in force, what it holds, refusals by
/// resource (`struct mr_set_quota` of `metaroce_abi.h`; spec 6.10).
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_query_quota(
    dev: *mut metaroce_device,
    out: *mut abi::SetQuota,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    match d.quota() {
        // SAFETY: non-null, writable by the contract.
        Ok(q) => unsafe {
            put(out, q);
            0
        },
        Err(e) => code(&e),
    }
}

/// Sets queue set `set`'s quota (only the management set, the device's
/// last, may): `limits` in the order of `struct mr_quota_values`
/// (`MR_QUOTA_DEFAULT`: the device's default share).
///
/// # Safety
/// `dev` a live device; `limits` readable.
#[no_mangle]
pub unsafe extern "C" fn metaroce_set_quota(
    dev: *mut metaroce_device,
    set: u32,
    limits: *const abi::QuotaValues,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, limits.is_null()) else {
        return METAROCE_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: non-null, readable by the contract.
    let limits = unsafe { limits.read() };
    done(d.set_quota(set, &limits))
}

/// A static description of a return code.
#[no_mangle]
pub extern "C" fn metaroce_strerror(code: c_int) -> *const c_char {
    let text: &'static CStr = match code {
        0 => c"success",
        METAROCE_ERR_INVALID_ARGUMENT => c"invalid argument",
        METAROCE_ERR_IO => c"cannot open or map the shared-memory file",
        METAROCE_ERR_NOT_A_DEVICE => c"not a MetaRoCE host interface",
        METAROCE_ERR_VERSION => c"unsupported ABI version",
        METAROCE_ERR_NOT_READY => c"device not ready or failed",
        METAROCE_ERR_NO_QUEUE_SET => c"no free queue set",
        METAROCE_ERR_QUEUE_FULL => c"queue full",
        METAROCE_ERR_OUT_OF_WINDOW => c"outside this queue set's memory window",
        METAROCE_ERR_TIMEOUT => c"the device did not answer in time",
        METAROCE_ERR_CONNECTION_FAILED => c"connection failed",
        METAROCE_ERR_BAD_LAYOUT => c"inconsistent device layout",
        METAROCE_ERR_IN_USE => c"the completion queue is already created",
        c if c <= METAROCE_ERR_REFUSED => {
            c"refused by the device (status = METAROCE_ERR_REFUSED - code)"
        }
        _ => c"unknown error",
    };
    text.as_ptr()
}

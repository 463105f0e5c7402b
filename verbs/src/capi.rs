//! The C API: the same calls as [`crate::Device`] for C programs, declared
//! in `include/metaroce_verbs.h` (generated from this file by cbindgen; a
//! test checks the committed header). Every function returns 0 (or a
//! count) on success and a negative `MR_ERR_*` code on failure; a command
//! the device refused returns `MR_ERR_REFUSED - status` (`MR_STATUS_*` of
//! `metaroce_abi.h`). Null pointers and invalid strings are refused with
//! `MR_ERR_INVALID_ARGUMENT`, never dereferenced.
//!
//! This file and `mapping.rs` are the only places of the library with
//! `unsafe`: here, to read the caller's pointers.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use metaroce_abi as abi;

use crate::types::{Access, Conn, Error, RecvWr, Remote, SendOp, SendWr, Sge};
use crate::Device;

/// Invalid argument: a null pointer, a bad string or opcode.
pub const MR_ERR_INVALID_ARGUMENT: c_int = -1;
/// The shared-memory file could not be opened or mapped.
pub const MR_ERR_IO: c_int = -2;
/// The memory is not a MetaRoCE host interface.
pub const MR_ERR_NOT_A_DEVICE: c_int = -3;
/// The device speaks another major ABI version.
pub const MR_ERR_VERSION: c_int = -4;
/// The device did not become ready, or failed.
pub const MR_ERR_NOT_READY: c_int = -5;
/// No free queue set.
pub const MR_ERR_NO_QUEUE_SET: c_int = -6;
/// The queue is full: poll completions and retry.
pub const MR_ERR_QUEUE_FULL: c_int = -7;
/// The range is outside this queue set's window.
pub const MR_ERR_OUT_OF_WINDOW: c_int = -8;
/// The device did not answer in time.
pub const MR_ERR_TIMEOUT: c_int = -9;
/// The connection failed before it was up.
pub const MR_ERR_CONNECTION_FAILED: c_int = -10;
/// The device's layout is inconsistent.
pub const MR_ERR_BAD_LAYOUT: c_int = -11;
/// Base of refusals: the device refused with status `s` gives
/// `MR_ERR_REFUSED - s`.
pub const MR_ERR_REFUSED: c_int = -1000;

/// An open device (one claimed queue set). Opaque.
#[derive(Debug)]
pub struct mr_device {
    device: Device,
}

/// A connection handle.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mr_conn {
    pub index: u32,
    pub generation: u32,
}

/// A local buffer: I/O address, length, key.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mr_sge {
    pub addr: u64,
    pub len: u32,
    pub key: u32,
}

/// A send-queue work request. `opcode` is `MR_OP_WRITE`, `MR_OP_WRITE_IMM`,
/// `MR_OP_SEND`, `MR_OP_SEND_IMM` or `MR_OP_READ`; `remote_*` count for
/// WRITE and READ, `imm` for the `_IMM` opcodes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mr_send_wr {
    pub wr_id: u64,
    pub opcode: u8,
    pub reserved: [u8; 3],
    pub imm: u32,
    pub local: mr_sge,
    pub remote_addr: u64,
    pub remote_key: u32,
    pub reserved2: u32,
}

/// A receive-queue work request.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mr_recv_wr {
    pub wr_id: u64,
    pub local: mr_sge,
}

/// A work completion. `opcode` is an `MR_OP_*`, `status` an `MR_STATUS_*`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct mr_wc {
    pub wr_id: u64,
    pub conn: mr_conn,
    pub byte_len: u32,
    pub imm: u32,
    pub opcode: u8,
    pub status: u8,
    pub has_imm: u8,
    pub reserved: u8,
}

fn code(e: &Error) -> c_int {
    match e {
        Error::Io(_) => MR_ERR_IO,
        Error::NotADevice => MR_ERR_NOT_A_DEVICE,
        Error::Version { .. } => MR_ERR_VERSION,
        Error::NotReady | Error::DeviceFailed => MR_ERR_NOT_READY,
        Error::NoFreeQueueSet => MR_ERR_NO_QUEUE_SET,
        Error::BadLayout(_) => MR_ERR_BAD_LAYOUT,
        Error::QueueFull => MR_ERR_QUEUE_FULL,
        Error::OutOfWindow { .. } => MR_ERR_OUT_OF_WINDOW,
        Error::Refused(s) => MR_ERR_REFUSED - c_int::from(status_code(*s)),
        Error::Timeout => MR_ERR_TIMEOUT,
        Error::ConnectionFailed(_) => MR_ERR_CONNECTION_FAILED,
    }
}

fn status_code(s: crate::Status) -> u8 {
    use crate::Status as S;
    match s {
        S::Success => abi::STATUS_SUCCESS,
        S::LocalProtection => abi::STATUS_LOCAL_PROTECTION,
        S::RemoteInvalidKey => abi::STATUS_REMOTE_INVALID_KEY,
        S::RemoteAccess => abi::STATUS_REMOTE_ACCESS,
        S::RemoteBounds => abi::STATUS_REMOTE_BOUNDS,
        S::RemoteProtocol => abi::STATUS_REMOTE_PROTOCOL,
        S::ReceiveTooSmall => abi::STATUS_RECEIVE_TOO_SMALL,
        S::RetryExceeded => abi::STATUS_RETRY_EXCEEDED,
        S::RnrExceeded => abi::STATUS_RNR_EXCEEDED,
        S::Flushed => abi::STATUS_FLUSHED,
        S::BadOpcode => abi::STATUS_BAD_OPCODE,
        S::BadLength => abi::STATUS_BAD_LENGTH,
        S::BadConnection => abi::STATUS_BAD_CONNECTION,
        S::BadAddress => abi::STATUS_BAD_ADDRESS,
        S::NoResources => abi::STATUS_NO_RESOURCES,
        S::InvalidRequest => abi::STATUS_INVALID_REQUEST,
        S::NotPermitted => abi::STATUS_NOT_PERMITTED,
        S::BadKey => abi::STATUS_BAD_KEY,
        S::QuotaExceeded => abi::STATUS_QUOTA_EXCEEDED,
        S::Unknown(c) => c,
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
/// `dev` is null or a pointer `mr_open_device` returned and
/// `mr_close_device` has not freed, used by one thread at a time.
unsafe fn device<'a>(dev: *mut mr_device) -> Option<&'a mut Device> {
    // SAFETY: by the caller's contract, a non-null `dev` points to a live
    // `mr_device` no one else is using.
    unsafe { dev.as_mut() }.map(|d| &mut d.device)
}

fn conn(c: mr_conn) -> Conn {
    Conn {
        index: c.index,
        generation: c.generation,
    }
}

fn sge(s: mr_sge) -> Sge {
    Sge {
        addr: s.addr,
        len: s.len,
        key: s.key,
    }
}

/// Opens the host interface in the file `path` and claims a queue set.
///
/// # Safety
/// `path` is null or a NUL-terminated string; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn mr_open_device(path: *const c_char, out: *mut *mut mr_device) -> c_int {
    if path.is_null() || out.is_null() {
        return MR_ERR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let Ok(path) = unsafe { CStr::from_ptr(path) }.to_str() else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match Device::open(path) {
        Ok(device) => {
            let boxed = Box::into_raw(Box::new(mr_device { device }));
            // SAFETY: `out` is non-null and writable by the caller's contract.
            unsafe { out.write(boxed) };
            0
        }
        Err(e) => code(&e),
    }
}

/// Closes a device opened by `mr_open_device` (null is ignored).
///
/// # Safety
/// `dev` is null or a live device, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn mr_close_device(dev: *mut mr_device) {
    if !dev.is_null() {
        // SAFETY: `dev` came from `Box::into_raw` in `mr_open_device` and is
        // freed once, here.
        drop(unsafe { Box::from_raw(dev) });
    }
}

/// This queue set's data window (I/O addresses) and protection domain.
///
/// # Safety
/// `dev` as in `mr_close_device`; the out pointers null or writable.
#[no_mangle]
pub unsafe extern "C" fn mr_device_window(
    dev: *mut mr_device,
    addr: *mut u64,
    len: *mut u64,
    pd: *mut u32,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    let info = d.info();
    // SAFETY: each pointer is null (skipped) or writable.
    unsafe {
        if let Some(a) = addr.as_mut() {
            *a = info.window_addr;
        }
        if let Some(l) = len.as_mut() {
            *l = info.window_len;
        }
        if let Some(p) = pd.as_mut() {
            *p = info.pd;
        }
    }
    0
}

/// Carves `len` bytes aligned to `align` out of the window.
///
/// # Safety
/// `dev` a live device; `addr` writable.
#[no_mangle]
pub unsafe extern "C" fn mr_alloc(
    dev: *mut mr_device,
    len: u64,
    align: u64,
    addr: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, addr.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match d.alloc(len, align) {
        // SAFETY: non-null, writable by the contract.
        Ok(a) => unsafe {
            addr.write(a);
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
pub unsafe extern "C" fn mr_write(
    dev: *mut mr_device,
    addr: u64,
    src: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, src.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
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
pub unsafe extern "C" fn mr_read(
    dev: *mut mr_device,
    addr: u64,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, dst.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: writable for `len` bytes by the contract, and not aliased.
    let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) };
    done(d.read(addr, out))
}

/// Registers `[addr, addr + len)` with `access` (`MR_ACCESS_*`); the key
/// goes to `*key`.
///
/// # Safety
/// `dev` a live device; `key` writable.
#[no_mangle]
pub unsafe extern "C" fn mr_reg_mr(
    dev: *mut mr_device,
    addr: u64,
    len: u64,
    access: u32,
    key: *mut u32,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, key.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match d.register(addr, len, Access(access)) {
        // SAFETY: non-null, writable by the contract.
        Ok(mr) => unsafe {
            key.write(mr.key);
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
pub unsafe extern "C" fn mr_dereg_mr(dev: *mut mr_device, key: u32) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    done(d.deregister_key(key))
}

/// Connects to `ip` (dotted IPv4 or IPv6 text) and `port`; waits until the
/// connection is up.
///
/// # Safety
/// `dev` a live device; `ip` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn mr_connect(
    dev: *mut mr_device,
    ip: *const c_char,
    port: u16,
    out: *mut mr_conn,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false, false) = (unsafe { device(dev) }, ip.is_null(), out.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: non-null and NUL-terminated by the contract.
    let Some(ip) = unsafe { CStr::from_ptr(ip) }
        .to_str()
        .ok()
        .and_then(|s| s.parse::<IpAddr>().ok())
    else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match d.connect(SocketAddr::new(ip, port)) {
        // SAFETY: non-null, writable by the contract.
        Ok(c) => unsafe {
            out.write(mr_conn {
                index: c.index,
                generation: c.generation,
            });
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
pub unsafe extern "C" fn mr_listen(dev: *mut mr_device) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    done(d.listen())
}

/// Waits up to `timeout_ms` for an incoming connection and accepts it.
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn mr_accept(
    dev: *mut mr_device,
    timeout_ms: u32,
    out: *mut mr_conn,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match d.accept(Duration::from_millis(u64::from(timeout_ms))) {
        // SAFETY: non-null, writable by the contract.
        Ok((c, _)) => unsafe {
            out.write(mr_conn {
                index: c.index,
                generation: c.generation,
            });
            0
        },
        Err(e) => code(&e),
    }
}

/// Closes a connection gracefully.
///
/// # Safety
/// `dev` a live device.
#[no_mangle]
pub unsafe extern "C" fn mr_close_conn(dev: *mut mr_device, c: mr_conn) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { device(dev) }) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    done(d.close(conn(c)))
}

/// Posts a send-queue work request on `c`.
///
/// # Safety
/// `dev` a live device; `wr` readable.
#[no_mangle]
pub unsafe extern "C" fn mr_post_send(
    dev: *mut mr_device,
    c: mr_conn,
    wr: *const mr_send_wr,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), Some(wr)) = (unsafe { device(dev) }, unsafe { wr.as_ref() }) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    let remote = Remote {
        addr: wr.remote_addr,
        key: wr.remote_key,
    };
    let op = match wr.opcode {
        abi::OP_WRITE => SendOp::Write(remote),
        abi::OP_WRITE_IMM => SendOp::WriteImm(remote, wr.imm),
        abi::OP_SEND => SendOp::Send,
        abi::OP_SEND_IMM => SendOp::SendImm(wr.imm),
        abi::OP_READ => SendOp::Read(remote),
        _ => return MR_ERR_INVALID_ARGUMENT,
    };
    let wr = SendWr {
        wr_id: wr.wr_id,
        op,
        local: sge(wr.local),
    };
    done(d.post_send(conn(c), &wr))
}

/// Posts a receive buffer on `c`.
///
/// # Safety
/// `dev` a live device; `wr` readable.
#[no_mangle]
pub unsafe extern "C" fn mr_post_recv(
    dev: *mut mr_device,
    c: mr_conn,
    wr: *const mr_recv_wr,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), Some(wr)) = (unsafe { device(dev) }, unsafe { wr.as_ref() }) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    let wr = RecvWr {
        wr_id: wr.wr_id,
        local: sge(wr.local),
    };
    done(d.post_recv(conn(c), &wr))
}

/// Polls up to `max` completions into `out`; returns how many.
///
/// # Safety
/// `dev` a live device; `out` writable for `max` entries.
#[no_mangle]
pub unsafe extern "C" fn mr_poll_cq(dev: *mut mr_device, out: *mut mr_wc, max: c_int) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    let mut n = 0;
    while n < max {
        let Some(c) = d.poll_cq() else { break };
        let wc = mr_wc {
            wr_id: c.wr_id,
            conn: mr_conn {
                index: c.conn.index,
                generation: c.conn.generation,
            },
            byte_len: c.byte_len,
            imm: c.imm.unwrap_or(0),
            opcode: match c.opcode {
                crate::Opcode::Write => abi::OP_WRITE,
                crate::Opcode::WriteImm => abi::OP_WRITE_IMM,
                crate::Opcode::Send => abi::OP_SEND,
                crate::Opcode::Read => abi::OP_READ,
                crate::Opcode::Recv => abi::OP_RECV,
                crate::Opcode::RecvWriteImm => abi::OP_RECV_WRITE_IMM,
                crate::Opcode::Unknown(o) => o,
            },
            status: status_code(c.status),
            has_imm: u8::from(c.imm.is_some()),
            reserved: 0,
        };
        // SAFETY: `n < max` entries are writable by the contract.
        unsafe { out.add(n as usize).write(wc) };
        n += 1;
    }
    n
}

/// This queue set's counters (`struct mr_set_counters` of
/// `metaroce_abi.h`).
///
/// # Safety
/// `dev` a live device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn mr_query_counters(
    dev: *mut mr_device,
    out: *mut abi::SetCounters,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match d.counters() {
        // SAFETY: non-null, writable by the contract.
        Ok(c) => unsafe {
            out.write(c);
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
pub unsafe extern "C" fn mr_query_quota(dev: *mut mr_device, out: *mut abi::SetQuota) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, out.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    match d.quota() {
        // SAFETY: non-null, writable by the contract.
        Ok(q) => unsafe {
            out.write(q);
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
pub unsafe extern "C" fn mr_set_quota(
    dev: *mut mr_device,
    set: u32,
    limits: *const abi::QuotaValues,
) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(d), false) = (unsafe { device(dev) }, limits.is_null()) else {
        return MR_ERR_INVALID_ARGUMENT;
    };
    // SAFETY: non-null, readable by the contract.
    let limits = unsafe { limits.read() };
    match d.set_quota(set, &limits) {
        Ok(()) => 0,
        Err(e) => code(&e),
    }
}

/// A static description of a return code.
#[no_mangle]
pub extern "C" fn mr_strerror(code: c_int) -> *const c_char {
    let text: &'static CStr = match code {
        0 => c"success",
        MR_ERR_INVALID_ARGUMENT => c"invalid argument",
        MR_ERR_IO => c"cannot open or map the shared-memory file",
        MR_ERR_NOT_A_DEVICE => c"not a MetaRoCE host interface",
        MR_ERR_VERSION => c"unsupported ABI version",
        MR_ERR_NOT_READY => c"device not ready or failed",
        MR_ERR_NO_QUEUE_SET => c"no free queue set",
        MR_ERR_QUEUE_FULL => c"queue full",
        MR_ERR_OUT_OF_WINDOW => c"outside this queue set's memory window",
        MR_ERR_TIMEOUT => c"the device did not answer in time",
        MR_ERR_CONNECTION_FAILED => c"connection failed",
        MR_ERR_BAD_LAYOUT => c"inconsistent device layout",
        c if c <= MR_ERR_REFUSED => c"refused by the device (status = MR_ERR_REFUSED - code)",
        _ => c"unknown error",
    };
    text.as_ptr()
}

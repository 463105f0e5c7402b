//! The fabric object (`fi_fabric`) and event queues (`fi_eq_open`).
//!
//! Every object the provider hands out is a `#[repr(C)]` structure whose
//! first field is libfabric's (`fid_fabric`, `fid_eq`, ...), so the pointer
//! libfabric passes back is the provider's object. `fi_close` marks an
//! object closed and drops what it holds; the small shell stays allocated,
//! so a call on a closed object answers `-FI_EBADF` instead of touching
//! freed memory.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::flags::errno;
use crate::{guard, guard_isize, sys};

/// `fid` with every other field empty.
pub(crate) fn fid(class: u32, context: *mut c_void, ops: &'static sys::fi_ops) -> sys::fid {
    sys::fid {
        fclass: class as usize,
        context,
        ops: ops as *const sys::fi_ops as *mut sys::fi_ops,
    }
}

/// Leaks `obj` and returns its address (the object libfabric holds).
pub(crate) fn leak<T>(obj: T) -> *mut T {
    Box::into_raw(Box::new(obj))
}

/// Writes `msg` into `buf` of `len` bytes (NUL-terminated, cut to fit);
/// returns `buf`.
pub(crate) fn write_cstr(msg: &str, buf: *mut c_char, len: usize) -> *const c_char {
    if buf.is_null() || len == 0 {
        return std::ptr::null();
    }
    let n = msg.len().min(len - 1);
    // SAFETY: `buf` holds `len` bytes (caller's contract); `n < len`.
    unsafe {
        std::ptr::copy_nonoverlapping(msg.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    buf
}

/// The fabric.
#[repr(C)]
#[derive(Debug)]
pub struct Fabric {
    fid: sys::fid_fabric,
    closed: AtomicBool,
}

static FABRIC_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(fabric_close),
    // SAFETY: `None` for every other entry point (all-zero `Option<fn>`).
    ..unsafe { std::mem::zeroed() }
};

static FABRIC_OPS: sys::fi_ops_fabric = sys::fi_ops_fabric {
    size: std::mem::size_of::<sys::fi_ops_fabric>(),
    domain: Some(crate::domain::open),
    passive_ep: Some(fabric_no_pep),
    eq_open: Some(eq_open),
    wait_open: Some(fabric_no_wait),
    trywait: Some(fabric_trywait),
    // SAFETY: `None` for the entry points after 1.17's.
    ..unsafe { std::mem::zeroed() }
};

/// The provider's `fabric` entry point.
pub(crate) unsafe extern "C" fn open(
    attr: *mut sys::fi_fabric_attr,
    fabric: *mut *mut sys::fid_fabric,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if attr.is_null() || fabric.is_null() {
            return -errno::EINVAL;
        }
        let obj = leak(Fabric {
            fid: sys::fid_fabric {
                fid: fid(sys::FI_CLASS_FABRIC, context, &FABRIC_FI_OPS),
                ops: &FABRIC_OPS as *const _ as *mut _,
                api_version: crate::flags::API_VERSION,
            },
            closed: AtomicBool::new(false),
        });
        // SAFETY: `fabric` is writable (checked non-null).
        unsafe { *fabric = obj as *mut sys::fid_fabric };
        0
    })
}

unsafe extern "C" fn fabric_close(fid: *mut sys::fid) -> c_int {
    // SAFETY: libfabric passes the fabric this provider made.
    let Some(f) = (unsafe { (fid as *const Fabric).as_ref() }) else {
        return -errno::EINVAL;
    };
    if f.closed.swap(true, Ordering::AcqRel) {
        return -errno::EBADF;
    }
    0
}

/// Whether `fabric` is a live fabric of this provider.
pub(crate) fn is_open(fabric: *mut sys::fid_fabric) -> bool {
    // SAFETY: libfabric passes the fabric this provider made.
    unsafe { (fabric as *const Fabric).as_ref() }.is_some_and(|f| !f.closed.load(Ordering::Acquire))
}

unsafe extern "C" fn fabric_no_pep(
    _: *mut sys::fid_fabric,
    _: *mut sys::fi_info,
    _: *mut *mut sys::fid_pep,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn fabric_no_wait(
    _: *mut sys::fid_fabric,
    _: *mut sys::fi_wait_attr,
    _: *mut *mut sys::fid_wait,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn fabric_trywait(
    _: *mut sys::fid_fabric,
    _: *mut *mut sys::fid,
    _: c_int,
) -> c_int {
    // No wait objects are handed out: nothing to arm, never blocks.
    0
}

// ----- Event queue ------------------------------------------------------

/// One event: its kind and its bytes.
#[derive(Debug, Clone)]
struct EqItem {
    event: u32,
    bytes: Vec<u8>,
}

/// An event queue. The provider's endpoints are connectionless and report
/// nothing asynchronously, so only events the application writes itself
/// (`fi_eq_write`) ever appear.
#[repr(C)]
#[derive(Debug)]
pub struct EventQueue {
    fid: sys::fid_eq,
    closed: AtomicBool,
    items: Mutex<VecDeque<EqItem>>,
    ready: Condvar,
}

static EQ_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(eq_close),
    // SAFETY: `None` for every other entry point.
    ..unsafe { std::mem::zeroed() }
};

static EQ_OPS: sys::fi_ops_eq = sys::fi_ops_eq {
    size: std::mem::size_of::<sys::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};

unsafe extern "C" fn eq_open(
    fabric: *mut sys::fid_fabric,
    attr: *mut sys::fi_eq_attr,
    eq: *mut *mut sys::fid_eq,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if !is_open(fabric) || eq.is_null() {
            return -errno::EINVAL;
        }
        // SAFETY: `attr` is null or the application's attributes.
        if let Some(a) = unsafe { attr.as_ref() } {
            if a.wait_obj != sys::FI_WAIT_NONE && a.wait_obj != sys::FI_WAIT_UNSPEC {
                return -errno::ENOSYS;
            }
        }
        let obj = leak(EventQueue {
            fid: sys::fid_eq {
                fid: fid(sys::FI_CLASS_EQ, context, &EQ_FI_OPS),
                ops: &EQ_OPS as *const _ as *mut _,
            },
            closed: AtomicBool::new(false),
            items: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
        });
        // SAFETY: `eq` is writable (checked non-null).
        unsafe { *eq = obj as *mut sys::fid_eq };
        0
    })
}

fn eq_of<'a>(eq: *mut sys::fid_eq) -> Result<&'a EventQueue, isize> {
    // SAFETY: libfabric passes an event queue this provider made.
    match unsafe { (eq as *const EventQueue).as_ref() } {
        Some(q) if !q.closed.load(Ordering::Acquire) => Ok(q),
        Some(_) => Err(-(errno::EBADF as isize)),
        None => Err(-(errno::EINVAL as isize)),
    }
}

unsafe extern "C" fn eq_close(fid: *mut sys::fid) -> c_int {
    match eq_of(fid as *mut sys::fid_eq) {
        Ok(q) => {
            q.closed.store(true, Ordering::Release);
            q.items
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            0
        }
        Err(e) => e as c_int,
    }
}

unsafe extern "C" fn eq_read(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    flags: u64,
) -> isize {
    guard_isize(|| {
        let q = match eq_of(eq) {
            Ok(q) => q,
            Err(e) => return e,
        };
        let mut items = q.items.lock().unwrap_or_else(PoisonError::into_inner);
        match items.front() {
            None => -(errno::EAGAIN as isize),
            Some(EqItem { event: kind, bytes }) => {
                if len < bytes.len() || (buf.is_null() && !bytes.is_empty()) {
                    return -(errno::ETOOSMALL as isize);
                }
                if !event.is_null() {
                    // SAFETY: `event` is writable (checked non-null).
                    unsafe { *event = *kind };
                }
                // SAFETY: `buf` holds `len >= bytes.len()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len())
                };
                let n = bytes.len() as isize;
                if flags & crate::flags::PEEK == 0 {
                    items.pop_front();
                }
                n
            }
        }
    })
}

unsafe extern "C" fn eq_readerr(
    eq: *mut sys::fid_eq,
    buf: *mut sys::fi_eq_err_entry,
    _flags: u64,
) -> isize {
    guard_isize(|| {
        let q = match eq_of(eq) {
            Ok(q) => q,
            Err(e) => return e,
        };
        if buf.is_null() {
            return -(errno::EINVAL as isize);
        }
        // Nothing the provider does fails asynchronously on an event queue.
        let _ = q;
        -(errno::EAGAIN as isize)
    })
}

unsafe extern "C" fn eq_write(
    eq: *mut sys::fid_eq,
    event: u32,
    buf: *const c_void,
    len: usize,
    flags: u64,
) -> isize {
    guard_isize(|| {
        let q = match eq_of(eq) {
            Ok(q) => q,
            Err(e) => return e,
        };
        if buf.is_null() && len > 0 {
            return -(errno::EINVAL as isize);
        }
        let item = if flags & crate::flags::PEEK != 0 {
            return -(errno::EINVAL as isize);
        } else if len > 0 {
            // SAFETY: `buf` holds `len` bytes (checked non-null).
            let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, len) }.to_vec();
            EqItem { event, bytes }
        } else {
            EqItem {
                event,
                bytes: Vec::new(),
            }
        };
        q.items
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(item);
        q.ready.notify_all();
        len as isize
    })
}

unsafe extern "C" fn eq_sread(
    eq: *mut sys::fid_eq,
    event: *mut u32,
    buf: *mut c_void,
    len: usize,
    timeout: c_int,
    flags: u64,
) -> isize {
    guard_isize(|| {
        let q = match eq_of(eq) {
            Ok(q) => q,
            Err(e) => return e,
        };
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            // SAFETY: forwarded arguments of the same contract.
            let n = unsafe { eq_read(eq, event, buf, len, flags) };
            if n != -(errno::EAGAIN as isize) {
                return n;
            }
            let wait = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(w) if !w.is_zero() => w,
                    _ => return -(errno::EAGAIN as isize),
                },
                None => Duration::from_secs(1),
            };
            let items = q.items.lock().unwrap_or_else(PoisonError::into_inner);
            if items.is_empty() {
                let _ = q.ready.wait_timeout(items, wait);
            }
        }
    })
}

unsafe extern "C" fn eq_strerror(
    _eq: *mut sys::fid_eq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    let msg = crate::cq::describe_prov_errno(prov_errno);
    if buf.is_null() {
        return crate::cq::static_description(prov_errno);
    }
    write_cstr(msg, buf, len)
}

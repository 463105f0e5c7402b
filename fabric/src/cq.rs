//! Completion queues (`fi_cq_open`): `read`, `readfrom`, `readerr`,
//! `sread` / `sreadfrom` (a real wait: the reading thread sleeps on the
//! transport's socket until a datagram arrives or a timer is due), and
//! `strerror`, in the context, msg, data and tagged formats.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::domain::{domain_of, DomainShared};
use crate::fabric::{fid, leak, write_cstr};
use crate::flags::{errno, fi_version};
use crate::queues::{CompletionQueue, CqEntry};
use crate::{guard, guard_isize, sys};

/// Empty reads in a row after which a read yields the CPU once.
const IDLE_READS_PER_YIELD: u32 = 16;

/// A completion queue.
#[repr(C)]
#[derive(Debug)]
pub struct Cq {
    fid: sys::fid_cq,
    closed: AtomicBool,
    pub queue: Arc<CompletionQueue>,
    pub domain: Arc<DomainShared>,
    format: u32,
    api_version: u32,
    signaled: AtomicBool,
    /// Reads in a row that found nothing (see [`Cq::read`]).
    idle_reads: std::sync::atomic::AtomicU32,
}

static CQ_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(cq_close),
    control: Some(cq_control),
    // SAFETY: `None` for every other entry point.
    ..unsafe { std::mem::zeroed() }
};

static CQ_OPS: sys::fi_ops_cq = sys::fi_ops_cq {
    size: std::mem::size_of::<sys::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
};

/// The domain's `cq_open` entry point.
pub(crate) unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cq_attr,
    cq: *mut *mut sys::fid_cq,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        let d = match domain_of(domain) {
            Ok(d) => d,
            Err(e) => return -e,
        };
        if cq.is_null() {
            return -errno::EINVAL;
        }
        // SAFETY: `attr` is null or the application's attributes.
        let (format, wait_obj) = match unsafe { attr.as_ref() } {
            Some(a) => (a.format, a.wait_obj),
            None => (sys::FI_CQ_FORMAT_UNSPEC, sys::FI_WAIT_NONE),
        };
        let format = match format {
            sys::FI_CQ_FORMAT_UNSPEC => sys::FI_CQ_FORMAT_CONTEXT,
            f @ (sys::FI_CQ_FORMAT_CONTEXT
            | sys::FI_CQ_FORMAT_MSG
            | sys::FI_CQ_FORMAT_DATA
            | sys::FI_CQ_FORMAT_TAGGED) => f,
            _ => return -errno::ENOSYS,
        };
        match wait_obj {
            sys::FI_WAIT_NONE | sys::FI_WAIT_UNSPEC => {}
            _ => return -errno::ENOSYS,
        }
        let obj = leak(Cq {
            fid: sys::fid_cq {
                fid: fid(sys::FI_CLASS_CQ, context, &CQ_FI_OPS),
                ops: &CQ_OPS as *const _ as *mut _,
            },
            closed: AtomicBool::new(false),
            queue: Arc::new(CompletionQueue::default()),
            domain: Arc::clone(&d.shared),
            format,
            api_version: d.info.api_version,
            signaled: AtomicBool::new(false),
            idle_reads: std::sync::atomic::AtomicU32::new(0),
        });
        // SAFETY: `cq` is writable (checked non-null).
        unsafe { *cq = obj as *mut sys::fid_cq };
        0
    })
}

/// The open completion queue behind `cq`.
pub(crate) fn cq_of<'a>(cq: *mut sys::fid_cq) -> Result<&'a Cq, i32> {
    // SAFETY: libfabric passes a completion queue this provider made (or
    // an endpoint binding passes a fid whose class was checked).
    match unsafe { (cq as *const Cq).as_ref() } {
        Some(q) if !q.closed.load(Ordering::Acquire) => Ok(q),
        Some(_) => Err(errno::EBADF),
        None => Err(errno::EINVAL),
    }
}

unsafe extern "C" fn cq_close(fid: *mut sys::fid) -> c_int {
    guard(|| match cq_of(fid as *mut sys::fid_cq) {
        Ok(q) => {
            q.closed.store(true, Ordering::Release);
            0
        }
        Err(e) => -e,
    })
}

unsafe extern "C" fn cq_control(_: *mut sys::fid, _: c_int, _: *mut c_void) -> c_int {
    // No wait object to hand out (FI_GETWAIT).
    -errno::ENOSYS
}

impl Cq {
    /// Bytes of one entry in this queue's format.
    fn entry_size(&self) -> usize {
        match self.format {
            sys::FI_CQ_FORMAT_CONTEXT => std::mem::size_of::<sys::fi_cq_entry>(),
            sys::FI_CQ_FORMAT_MSG => std::mem::size_of::<sys::fi_cq_msg_entry>(),
            sys::FI_CQ_FORMAT_DATA => std::mem::size_of::<sys::fi_cq_data_entry>(),
            _ => std::mem::size_of::<sys::fi_cq_tagged_entry>(),
        }
    }

    /// Writes `e` as entry `i` of `buf` in this queue's format.
    ///
    /// # Safety
    /// `buf` holds at least `i + 1` entries of this format.
    unsafe fn write_entry(&self, buf: *mut c_void, i: usize, e: &CqEntry) {
        let at = (buf as *mut u8).wrapping_add(i * self.entry_size());
        let tagged = sys::fi_cq_tagged_entry {
            op_context: e.context as *mut c_void,
            flags: e.flags,
            len: e.len,
            buf: e.buf as *mut c_void,
            data: e.data,
            tag: e.tag,
        };
        // SAFETY: each format is a prefix of the tagged entry, and `at`
        // holds one entry of the format (caller's contract); unaligned
        // writes because the application's buffer may be any bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                &tagged as *const sys::fi_cq_tagged_entry as *const u8,
                at,
                self.entry_size(),
            )
        };
    }

    fn read(&self, buf: *mut c_void, count: usize, src: *mut u64) -> isize {
        if buf.is_null() || count == 0 {
            return -(errno::EINVAL as isize);
        }
        let take = |this: &Cq| {
            this.queue.read(count, |i, e| {
                // SAFETY: `buf` holds `count` entries and `i < count`;
                // `src`, when given, holds `count` addresses.
                unsafe {
                    this.write_entry(buf, i, e);
                    if !src.is_null() {
                        *src.add(i) = e.src;
                    }
                }
            })
        };
        let result = match take(self) {
            Err(e) if e == errno::EAGAIN => {
                self.domain.progress();
                take(self)
            }
            other => other,
        };
        match result {
            Ok(n) => {
                self.idle_reads.store(0, Ordering::Relaxed);
                n as isize
            }
            Err(e) => {
                // An application spinning on an empty queue holds a core
                // its peer (another process on this machine, or this
                // domain's progress thread) may need to answer: every so
                // many empty reads, let it run.
                if e == errno::EAGAIN
                    && self.idle_reads.fetch_add(1, Ordering::Relaxed) % IDLE_READS_PER_YIELD
                        == IDLE_READS_PER_YIELD - 1
                {
                    std::thread::yield_now();
                }
                -(e as isize)
            }
        }
    }

    fn sread(&self, buf: *mut c_void, count: usize, src: *mut u64, timeout: c_int) -> isize {
        let deadline =
            (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            let n = self.read(buf, count, src);
            if n != -(errno::EAGAIN as isize) {
                return n;
            }
            if self.signaled.swap(false, Ordering::AcqRel) {
                return -(errno::EAGAIN as isize);
            }
            let wait = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(w) if !w.is_zero() => w.min(Duration::from_millis(50)),
                    _ => return -(errno::EAGAIN as isize),
                },
                None => Duration::from_millis(50),
            };
            self.domain.progress_and_wait(wait);
        }
    }
}

unsafe extern "C" fn cq_read(cq: *mut sys::fid_cq, buf: *mut c_void, count: usize) -> isize {
    guard_isize(|| match cq_of(cq) {
        Ok(q) => q.read(buf, count, std::ptr::null_mut()),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn cq_readfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut sys::fi_addr_t,
) -> isize {
    guard_isize(|| match cq_of(cq) {
        Ok(q) => q.read(buf, count, src_addr),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn cq_readerr(
    cq: *mut sys::fid_cq,
    buf: *mut sys::fi_cq_err_entry,
    _flags: u64,
) -> isize {
    guard_isize(|| {
        let q = match cq_of(cq) {
            Ok(q) => q,
            Err(e) => return -(e as isize),
        };
        if buf.is_null() {
            return -(errno::EINVAL as isize);
        }
        let Some(err) = q.queue.read_error() else {
            return -(errno::EAGAIN as isize);
        };
        // SAFETY: `buf` is the application's error entry (checked
        // non-null); before API 1.5 it ends before `err_data_size`, which
        // is written only from 1.5 on.
        unsafe {
            let b = &mut *buf;
            b.op_context = err.entry.context as *mut c_void;
            b.flags = err.entry.flags;
            b.len = err.entry.len;
            b.buf = err.entry.buf as *mut c_void;
            b.data = err.entry.data;
            b.tag = err.entry.tag;
            b.olen = err.olen;
            b.err = err.err;
            b.prov_errno = err.prov_errno;
            if q.api_version >= fi_version(1, 5) {
                // No provider-specific error data: the status is in
                // `prov_errno`.
                b.err_data_size = 0;
            } else {
                b.err_data = std::ptr::null_mut();
            }
        }
        1
    })
}

unsafe extern "C" fn cq_sread(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    guard_isize(|| match cq_of(cq) {
        Ok(q) => q.sread(buf, count, std::ptr::null_mut(), timeout),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn cq_sreadfrom(
    cq: *mut sys::fid_cq,
    buf: *mut c_void,
    count: usize,
    src_addr: *mut sys::fi_addr_t,
    _cond: *const c_void,
    timeout: c_int,
) -> isize {
    guard_isize(|| match cq_of(cq) {
        Ok(q) => q.sread(buf, count, src_addr, timeout),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn cq_signal(cq: *mut sys::fid_cq) -> c_int {
    guard(|| match cq_of(cq) {
        Ok(q) => {
            q.signaled.store(true, Ordering::Release);
            q.queue.signal();
            0
        }
        Err(e) => -e,
    })
}

/// What a `prov_errno` (a MetaRoCE completion status) means.
pub fn describe_prov_errno(prov_errno: c_int) -> &'static str {
    DESCRIPTIONS
        .get(prov_errno as usize)
        .map_or("unknown MetaRoCE status", |d| d.to_str().unwrap_or(""))
}

const DESCRIPTIONS: [&std::ffi::CStr; 10] = [
    // 0: the provider failed the operation itself (truncation, a
    // cancelled receive): `err` says why.
    c"no MetaRoCE transport error: see err (truncated, cancelled or refused by the provider)",
    c"MetaRoCE: local protection error (key, bounds or rights of the local buffer)",
    c"MetaRoCE: the peer rejected the memory key",
    c"MetaRoCE: the peer's region does not grant this access",
    c"MetaRoCE: the address range is outside the peer's region",
    c"MetaRoCE: the peer reported a protocol error",
    c"MetaRoCE: the peer's receive buffer is smaller than the message",
    c"MetaRoCE: retransmissions exhausted without an acknowledgment",
    c"MetaRoCE: the peer had no receive posted for too long",
    c"MetaRoCE: the connection failed or closed before the operation completed",
];

/// A static string for `prov_errno` (when the caller gives no buffer).
pub fn static_description(prov_errno: c_int) -> *const c_char {
    DESCRIPTIONS
        .get(prov_errno as usize)
        .map_or(c"unknown MetaRoCE status".as_ptr(), |d| d.as_ptr())
}

unsafe extern "C" fn cq_strerror(
    _cq: *mut sys::fid_cq,
    prov_errno: c_int,
    _err_data: *const c_void,
    buf: *mut c_char,
    len: usize,
) -> *const c_char {
    if buf.is_null() || len == 0 {
        return static_description(prov_errno);
    }
    write_cstr(describe_prov_errno(prov_errno), buf, len)
}

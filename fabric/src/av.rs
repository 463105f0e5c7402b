//! Address vectors (`fi_av_open`): `insert` (socket addresses, as
//! `fi_getname` gives them), `insertsvc`, `remove`, `lookup`, `straddr`.
//! Inserting an address opens nothing: a peer's connection is opened by
//! the first operation towards it. Insertion is synchronous.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::domain::domain_of;
use crate::fabric::{fid, leak, write_cstr};
use crate::flags::{errno, ADDR_NOTAVAIL};
use crate::info::{read_sockaddr, sockaddr_bytes};
use crate::queues::AddressVector;
use crate::{guard, sys};

/// An address vector.
#[repr(C)]
#[derive(Debug)]
pub struct Av {
    fid: sys::fid_av,
    closed: AtomicBool,
    pub table: Arc<AddressVector>,
    /// `FI_SOCKADDR_IN` or `FI_SOCKADDR_IN6`: the size of each address.
    addr_format: u32,
}

static AV_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(av_close),
    bind: Some(av_bind),
    // SAFETY: `None` for every other entry point.
    ..unsafe { std::mem::zeroed() }
};

static AV_OPS: sys::fi_ops_av = sys::fi_ops_av {
    size: std::mem::size_of::<sys::fi_ops_av>(),
    insert: Some(av_insert),
    insertsvc: Some(av_insertsvc),
    insertsym: Some(av_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(av_set),
};

/// The domain's `av_open` entry point.
pub(crate) unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_av_attr,
    av: *mut *mut sys::fid_av,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        let d = match domain_of(domain) {
            Ok(d) => d,
            Err(e) => return -e,
        };
        if av.is_null() {
            return -errno::EINVAL;
        }
        // SAFETY: `attr` is null or the application's attributes.
        if let Some(a) = unsafe { attr.as_ref() } {
            match a.type_ {
                sys::FI_AV_UNSPEC | sys::FI_AV_MAP | sys::FI_AV_TABLE => {}
                _ => return -errno::EINVAL,
            }
            // Named (shared) address vectors and asynchronous insertion
            // are not offered.
            if !a.name.is_null() || a.flags & crate::flags::EVENT != 0 {
                return -errno::ENOSYS;
            }
        }
        let obj = leak(Av {
            fid: sys::fid_av {
                fid: fid(sys::FI_CLASS_AV, context, &AV_FI_OPS),
                ops: &AV_OPS as *const _ as *mut _,
            },
            closed: AtomicBool::new(false),
            table: Arc::new(AddressVector::default()),
            addr_format: d.info.addr_format,
        });
        // SAFETY: `av` is writable (checked non-null).
        unsafe { *av = obj as *mut sys::fid_av };
        0
    })
}

/// The open address vector behind `av`.
pub(crate) fn av_of<'a>(av: *mut sys::fid_av) -> Result<&'a Av, i32> {
    // SAFETY: libfabric passes an address vector this provider made.
    match unsafe { (av as *const Av).as_ref() } {
        Some(a) if !a.closed.load(Ordering::Acquire) => Ok(a),
        Some(_) => Err(errno::EBADF),
        None => Err(errno::EINVAL),
    }
}

impl Av {
    fn addr_len(&self) -> usize {
        if self.addr_format == sys::FI_SOCKADDR_IN6 {
            std::mem::size_of::<libc::sockaddr_in6>()
        } else {
            std::mem::size_of::<libc::sockaddr_in>()
        }
    }
}

unsafe extern "C" fn av_close(fid: *mut sys::fid) -> c_int {
    guard(|| match av_of(fid as *mut sys::fid_av) {
        Ok(a) => {
            a.closed.store(true, Ordering::Release);
            0
        }
        Err(e) => -e,
    })
}

unsafe extern "C" fn av_bind(_: *mut sys::fid, _: *mut sys::fid, _: u64) -> c_int {
    // Insertion is synchronous: no event queue to report to.
    -errno::ENOSYS
}

/// Writes the result of inserting address `i`.
fn note(fi_addr: *mut sys::fi_addr_t, i: usize, value: u64) {
    if !fi_addr.is_null() {
        // SAFETY: the application passes room for `count` results.
        unsafe { *fi_addr.add(i) = value };
    }
}

unsafe extern "C" fn av_insert(
    av: *mut sys::fid_av,
    addr: *const c_void,
    count: usize,
    fi_addr: *mut sys::fi_addr_t,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    guard(|| {
        let a = match av_of(av) {
            Ok(a) => a,
            Err(e) => return -e,
        };
        if addr.is_null() && count > 0 {
            return -errno::EINVAL;
        }
        let len = a.addr_len();
        let mut inserted = 0;
        for i in 0..count {
            let at = (addr as *const u8).wrapping_add(i * len) as *const c_void;
            // SAFETY: the application passes `count` addresses of this
            // domain's format.
            match unsafe { read_sockaddr(at, len) } {
                Some(sa) if sa.port() != 0 && !sa.ip().is_unspecified() => {
                    note(fi_addr, i, a.table.insert(sa));
                    inserted += 1;
                }
                _ => note(fi_addr, i, ADDR_NOTAVAIL),
            }
        }
        inserted
    })
}

unsafe extern "C" fn av_insertsvc(
    av: *mut sys::fid_av,
    node: *const c_char,
    service: *const c_char,
    fi_addr: *mut sys::fi_addr_t,
    _flags: u64,
    _context: *mut c_void,
) -> c_int {
    guard(|| {
        let a = match av_of(av) {
            Ok(a) => a,
            Err(e) => return -e,
        };
        if node.is_null() || service.is_null() {
            return -errno::EINVAL;
        }
        // SAFETY: NUL-terminated strings (checked non-null).
        let (host, port) = unsafe {
            (
                CStr::from_ptr(node).to_string_lossy().into_owned(),
                CStr::from_ptr(service).to_string_lossy().into_owned(),
            )
        };
        let Ok(port) = port.parse::<u16>() else {
            return -errno::EINVAL;
        };
        let want_v6 = a.addr_format == sys::FI_SOCKADDR_IN6;
        let found: Option<SocketAddr> = (host.as_str(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.find(|s| s.is_ipv6() == want_v6));
        match found {
            Some(sa) => {
                note(fi_addr, 0, a.table.insert(sa));
                1
            }
            None => {
                note(fi_addr, 0, ADDR_NOTAVAIL);
                0
            }
        }
    })
}

unsafe extern "C" fn av_insertsym(
    _: *mut sys::fid_av,
    _: *const c_char,
    _: usize,
    _: *const c_char,
    _: usize,
    _: *mut sys::fi_addr_t,
    _: u64,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn av_remove(
    av: *mut sys::fid_av,
    fi_addr: *mut sys::fi_addr_t,
    count: usize,
    _flags: u64,
) -> c_int {
    guard(|| {
        let a = match av_of(av) {
            Ok(a) => a,
            Err(e) => return -e,
        };
        if fi_addr.is_null() && count > 0 {
            return -errno::EINVAL;
        }
        let mut result = 0;
        for i in 0..count {
            // SAFETY: the application passes `count` addresses.
            let f = unsafe { *fi_addr.add(i) };
            if !a.table.remove(f) {
                result = -errno::EINVAL;
            }
        }
        result
    })
}

unsafe extern "C" fn av_lookup(
    av: *mut sys::fid_av,
    fi_addr: sys::fi_addr_t,
    addr: *mut c_void,
    addrlen: *mut usize,
) -> c_int {
    guard(|| {
        let a = match av_of(av) {
            Ok(a) => a,
            Err(e) => return -e,
        };
        if addrlen.is_null() {
            return -errno::EINVAL;
        }
        let Some(sa) = a.table.lookup(fi_addr) else {
            return -errno::ENOENT;
        };
        copy_name(&sockaddr_bytes(sa), addr, addrlen)
    })
}

/// Copies a name into `(addr, *addrlen)`, as `fi_getname` and
/// `fi_av_lookup` do: `-FI_ETOOSMALL` with the needed length when it does
/// not fit.
pub(crate) fn copy_name(bytes: &[u8], addr: *mut c_void, addrlen: *mut usize) -> c_int {
    // SAFETY: `addrlen` is writable (callers check non-null).
    let room = unsafe { *addrlen };
    // SAFETY: as above.
    unsafe { *addrlen = bytes.len() };
    if addr.is_null() || room < bytes.len() {
        return -errno::ETOOSMALL;
    }
    // SAFETY: `addr` holds `room >= bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
    0
}

unsafe extern "C" fn av_straddr(
    av: *mut sys::fid_av,
    addr: *const c_void,
    buf: *mut c_char,
    len: *mut usize,
) -> *const c_char {
    let Ok(a) = av_of(av) else {
        return std::ptr::null();
    };
    // SAFETY: `addr` is one address of this domain's format.
    let text = match unsafe { read_sockaddr(addr, a.addr_len()) } {
        Some(SocketAddr::V4(v4)) => format!("fi_sockaddr_in://{v4}"),
        Some(SocketAddr::V6(v6)) => format!("fi_sockaddr_in6://{v6}"),
        None => "fi_addr_format_unspec://".to_string(),
    };
    if len.is_null() {
        return std::ptr::null();
    }
    // SAFETY: `len` is writable (checked non-null).
    let room = unsafe { *len };
    // SAFETY: as above; the length includes the terminating NUL.
    unsafe { *len = text.len() + 1 };
    write_cstr(&text, buf, room)
}

unsafe extern "C" fn av_set(
    _: *mut sys::fid_av,
    _: *mut sys::fi_av_set_attr,
    _: *mut *mut sys::fid_av_set,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

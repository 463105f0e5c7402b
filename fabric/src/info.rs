//! What the provider offers (`fi_getinfo`): its attributes, the checks of
//! an application's hints against them, and the `fi_info` it returns
//! (allocated by libfabric's `fi_dupinfo`, so `fi_freeinfo` frees it).

use std::ffi::{c_char, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use crate::flags::{self, errno};
use crate::sys;
use crate::transport::{EAGER_LIMIT, INJECT_LIMIT, MAX_MSG, TX_SLOTS};

/// The provider's name.
pub const NAME: &CStr = c"metaroce";
/// The fabric's and the domain's names.
pub const FABRIC_NAME: &CStr = c"metaroce";
pub const DOMAIN_NAME: &CStr = c"udp";

/// Primary capabilities.
pub const PRIMARY_CAPS: u64 = flags::MSG
    | flags::TAGGED
    | flags::RMA
    | flags::READ
    | flags::WRITE
    | flags::SEND
    | flags::RECV
    | flags::REMOTE_READ
    | flags::REMOTE_WRITE
    | flags::DIRECTED_RECV;
/// Secondary capabilities.
pub const SECONDARY_CAPS: u64 = flags::SOURCE | flags::LOCAL_COMM | flags::REMOTE_COMM;
/// Memory registration: remote addresses are virtual addresses, the
/// provider picks keys, only allocated memory is registered (the "basic"
/// map, which every application written for RMA supports; offset mode
/// would need a second translation per packet).
pub const MR_MODE: u32 = sys::FI_MR_VIRT_ADDR | sys::FI_MR_PROV_KEY | sys::FI_MR_ALLOCATED;
/// Message ordering on one connection: sends after sends.
pub const MSG_ORDER: u64 = sys::FI_ORDER_SAS as u64;
/// Remote CQ data: MetaRoCE's 32-bit immediate.
pub const CQ_DATA_SIZE: usize = 4;
/// Buffers per `iov` call.
pub const IOV_LIMIT: usize = 8;

/// The address the provider binds by default: `FI_METAROCE_ADDR`, else
/// loopback of the requested family.
pub fn default_address(ipv6: bool) -> Result<IpAddr, i32> {
    match std::env::var("FI_METAROCE_ADDR") {
        Ok(v) => v.trim().parse().map_err(|_| errno::EINVAL),
        Err(_) => Ok(if ipv6 {
            IpAddr::V6(Ipv6Addr::LOCALHOST)
        } else {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        }),
    }
}

/// Reads a `struct sockaddr` of `len` bytes.
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
pub unsafe fn read_sockaddr(addr: *const c_void, len: usize) -> Option<SocketAddr> {
    if addr.is_null() || len < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: `addr` holds at least a family field (checked above).
    let family = unsafe { (*(addr as *const libc::sockaddr)).sa_family };
    match i32::from(family) {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family and length say it is a `sockaddr_in`;
            // read unaligned, the application's buffer may be any bytes.
            let sin = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, a `sockaddr_in6`.
            let sin6 = unsafe { std::ptr::read_unaligned(addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(
                IpAddr::V6(ip),
                u16::from_be(sin6.sin6_port),
            ))
        }
        _ => None,
    }
}

/// `addr` as the bytes of its `struct sockaddr_in` / `sockaddr_in6`.
pub fn sockaddr_bytes(addr: SocketAddr) -> Vec<u8> {
    match addr {
        SocketAddr::V4(v4) => {
            // SAFETY: an all-zero `sockaddr_in` is valid.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            // SAFETY: a plain-data struct viewed as its bytes.
            unsafe {
                std::slice::from_raw_parts(
                    &sin as *const _ as *const u8,
                    std::mem::size_of::<libc::sockaddr_in>(),
                )
            }
            .to_vec()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: an all-zero `sockaddr_in6` is valid.
            let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            // SAFETY: as above.
            unsafe {
                std::slice::from_raw_parts(
                    &sin6 as *const _ as *const u8,
                    std::mem::size_of::<libc::sockaddr_in6>(),
                )
            }
            .to_vec()
        }
    }
}

/// The address format of `addr`.
pub fn format_of(addr: SocketAddr) -> u32 {
    if addr.is_ipv6() {
        sys::FI_SOCKADDR_IN6
    } else {
        sys::FI_SOCKADDR_IN
    }
}

/// A copy of `bytes` in memory from `malloc` (libfabric frees it).
fn malloc_copy(bytes: &[u8]) -> *mut c_void {
    // SAFETY: malloc of a non-zero size; checked for null.
    let p = unsafe { libc::malloc(bytes.len().max(1)) } as *mut u8;
    if !p.is_null() {
        // SAFETY: `p` holds `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    }
    p as *mut c_void
}

fn strdup(s: &CStr) -> *mut c_char {
    // SAFETY: `s` is NUL-terminated.
    unsafe { libc::strdup(s.as_ptr()) }
}

/// What the application asked for, read from its hints.
struct Request {
    caps: u64,
    ipv6: bool,
    src: Option<SocketAddr>,
    dest: Option<SocketAddr>,
}

/// Checks `hints` against what the provider offers.
///
/// # Safety
/// `hints` is null or a valid `fi_info` whose attribute pointers are null
/// or valid.
unsafe fn check_hints(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags_in: u64,
    hints: *const sys::fi_info,
) -> Result<Request, i32> {
    // A DPU reaches only its shared window: application memory cannot be
    // a remote target there, so RMA is not offered.
    let offered = if crate::transport::device_path().is_some() {
        (PRIMARY_CAPS | SECONDARY_CAPS)
            & !(flags::RMA | flags::READ | flags::WRITE | flags::REMOTE_READ | flags::REMOTE_WRITE)
    } else {
        PRIMARY_CAPS | SECONDARY_CAPS
    };
    let mut req = Request {
        caps: offered,
        ipv6: false,
        src: None,
        dest: None,
    };
    // SAFETY: the caller's contract.
    if let Some(h) = unsafe { hints.as_ref() } {
        if h.caps & !offered != 0 {
            return Err(errno::ENODATA);
        }
        if h.caps != 0 {
            let mut caps = h.caps;
            // A primary capability without a direction means both.
            if caps & (flags::MSG | flags::TAGGED) != 0 && caps & (flags::SEND | flags::RECV) == 0 {
                caps |= flags::SEND | flags::RECV;
            }
            if caps & flags::RMA != 0
                && caps & (flags::READ | flags::WRITE | flags::REMOTE_READ | flags::REMOTE_WRITE)
                    == 0
            {
                caps |= flags::READ | flags::WRITE | flags::REMOTE_READ | flags::REMOTE_WRITE;
            }
            req.caps = caps;
        }
        match h.addr_format {
            sys::FI_FORMAT_UNSPEC | sys::FI_SOCKADDR | sys::FI_SOCKADDR_IN => {}
            sys::FI_SOCKADDR_IN6 => req.ipv6 = true,
            _ => return Err(errno::ENODATA),
        }
        // SAFETY: the caller's contract for each attribute pointer.
        if let Some(ep) = unsafe { h.ep_attr.as_ref() } {
            if ep.type_ != sys::FI_EP_UNSPEC && ep.type_ != sys::FI_EP_RDM {
                return Err(errno::ENODATA);
            }
            if ep.protocol != sys::FI_PROTO_UNSPEC {
                return Err(errno::ENODATA);
            }
            if ep.max_msg_size > MAX_MSG || ep.tx_ctx_cnt > 1 || ep.rx_ctx_cnt > 1 {
                return Err(errno::ENODATA);
            }
        }
        // SAFETY: as above.
        if let Some(d) = unsafe { h.domain_attr.as_ref() } {
            // SAFETY: a non-null name is a NUL-terminated string.
            if !d.name.is_null() && unsafe { CStr::from_ptr(d.name) } != DOMAIN_NAME {
                return Err(errno::ENODATA);
            }
            if d.cq_data_size > CQ_DATA_SIZE {
                return Err(errno::ENODATA);
            }
            check_mr_mode(version, d.mr_mode, h.mode, req.caps)?;
            if d.av_type != sys::FI_AV_UNSPEC
                && d.av_type != sys::FI_AV_MAP
                && d.av_type != sys::FI_AV_TABLE
            {
                return Err(errno::ENODATA);
            }
        }
        // SAFETY: as above.
        if let Some(f) = unsafe { h.fabric_attr.as_ref() } {
            // SAFETY: a non-null name is a NUL-terminated string.
            if !f.name.is_null() && unsafe { CStr::from_ptr(f.name) } != FABRIC_NAME {
                return Err(errno::ENODATA);
            }
        }
        // SAFETY: as above.
        if let Some(tx) = unsafe { h.tx_attr.as_ref() } {
            if tx.msg_order & !MSG_ORDER != 0 || tx.inject_size > INJECT_LIMIT {
                return Err(errno::ENODATA);
            }
        }
        // SAFETY: as above.
        if let Some(rx) = unsafe { h.rx_attr.as_ref() } {
            if rx.msg_order & !MSG_ORDER != 0 {
                return Err(errno::ENODATA);
            }
        }
        // SAFETY: the hints' address pointers hold their lengths.
        req.src = unsafe { read_sockaddr(h.src_addr, h.src_addrlen) };
        // SAFETY: as above.
        req.dest = unsafe { read_sockaddr(h.dest_addr, h.dest_addrlen) };
        if (!h.src_addr.is_null() && req.src.is_none())
            || (!h.dest_addr.is_null() && req.dest.is_none())
        {
            return Err(errno::ENODATA);
        }
    }
    // Node and service: the source with FI_SOURCE, else the destination.
    if !node.is_null() || !service.is_null() {
        let host = (!node.is_null()).then(|| {
            // SAFETY: libfabric passes NUL-terminated strings or null.
            unsafe { CStr::from_ptr(node) }
                .to_string_lossy()
                .into_owned()
        });
        let port = (!service.is_null()).then(|| {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(service) }
                .to_string_lossy()
                .into_owned()
        });
        let port: u16 = match port {
            Some(p) => p.parse().map_err(|_| errno::ENODATA)?,
            None => 0,
        };
        let resolved = match host {
            Some(h) => (h.as_str(), port)
                .to_socket_addrs()
                .map_err(|_| errno::ENODATA)?
                .find(|a| a.is_ipv6() == req.ipv6)
                .ok_or(errno::ENODATA)?,
            None => SocketAddr::new(default_address(req.ipv6)?, port),
        };
        if flags_in & flags::SOURCE != 0 {
            req.src = Some(resolved);
        } else {
            req.dest = Some(resolved);
        }
    }
    if let Some(a) = req.src.or(req.dest) {
        req.ipv6 = a.is_ipv6();
    }
    Ok(req)
}

/// The memory registration check of `fi_getinfo(3)`, for an application
/// asking `user_mode` at API `version`.
fn check_mr_mode(version: u32, user_mode: i32, mode: u64, caps: u64) -> Result<(), i32> {
    let basic = sys::FI_MR_BASIC as i32;
    let scalable = sys::FI_MR_SCALABLE as i32;
    if version < flags::fi_version(1, 5) {
        return match user_mode {
            m if m == sys::FI_MR_UNSPEC as i32 || m == basic => Ok(()),
            _ => Err(errno::ENODATA),
        };
    }
    let _ = mode;
    if user_mode & basic != 0 {
        return if user_mode & !basic == 0 {
            Ok(())
        } else {
            Err(errno::ENODATA)
        };
    }
    if user_mode & scalable != 0 {
        return Err(errno::ENODATA);
    }
    // Without RMA the keys and addresses never leave the process.
    let needed = if caps & flags::RMA != 0 {
        MR_MODE as i32
    } else {
        0
    };
    if user_mode != 0 && user_mode & needed != needed {
        return Err(errno::ENODATA);
    }
    Ok(())
}

/// `fi_getinfo` for this provider.
///
/// # Safety
/// As libfabric's provider `getinfo`: `info` is writable, the rest null or
/// valid.
pub unsafe fn getinfo(
    version: u32,
    node: *const c_char,
    service: *const c_char,
    flags_in: u64,
    hints: *const sys::fi_info,
    info: *mut *mut sys::fi_info,
) -> i32 {
    if info.is_null() {
        return -errno::EINVAL;
    }
    // SAFETY: `info` is writable (checked non-null).
    unsafe { *info = std::ptr::null_mut() };
    // SAFETY: the caller's contract.
    let req = match unsafe { check_hints(version, node, service, flags_in, hints) } {
        Ok(r) => r,
        Err(e) => return -e,
    };
    let src = match req.src {
        Some(a) => a,
        None => match default_address(req.ipv6) {
            Ok(ip) => SocketAddr::new(ip, 0),
            Err(e) => return -e,
        },
    };
    // SAFETY: `fi_dupinfo(NULL)` allocates a zeroed `fi_info` with every
    // attribute structure (libfabric's `fi_allocinfo`).
    let out = unsafe { sys::fi_dupinfo(std::ptr::null()) };
    if out.is_null() {
        return -errno::ENOMEM;
    }
    // SAFETY: `out` and its attribute pointers were just allocated.
    unsafe {
        // SAFETY: the caller's contract.
        fill(&mut *out, hints.as_ref(), &req, src);
        *info = out;
    }
    0
}

/// Fills a freshly allocated `fi_info`.
///
/// # Safety
/// `out`'s attribute pointers are valid; `hints`' are null or valid.
unsafe fn fill(
    out: &mut sys::fi_info,
    hints: Option<&sys::fi_info>,
    req: &Request,
    src: SocketAddr,
) {
    out.caps = req.caps;
    out.mode = 0;
    out.addr_format = format_of(src);
    let src_bytes = sockaddr_bytes(src);
    out.src_addr = malloc_copy(&src_bytes);
    out.src_addrlen = src_bytes.len();
    if let Some(dest) = req.dest {
        let bytes = sockaddr_bytes(dest);
        out.dest_addr = malloc_copy(&bytes);
        out.dest_addrlen = bytes.len();
    }
    // SAFETY: allocated by `fi_dupinfo`.
    let tx = unsafe { &mut *out.tx_attr };
    tx.caps = req.caps
        & (flags::MSG | flags::TAGGED | flags::RMA | flags::SEND | flags::READ | flags::WRITE);
    // SAFETY: the hints' attribute pointers are null or valid (the
    // caller's contract).
    let hint_tx = hints.and_then(|h| unsafe { h.tx_attr.as_ref() });
    // SAFETY: as above.
    let hint_rx = hints.and_then(|h| unsafe { h.rx_attr.as_ref() });
    // SAFETY: as above.
    let hint_domain = hints.and_then(|h| unsafe { h.domain_attr.as_ref() });
    tx.op_flags = hint_tx.map_or(0, |t| t.op_flags);
    tx.msg_order = MSG_ORDER;
    tx.comp_order = sys::FI_ORDER_NONE as u64;
    tx.inject_size = INJECT_LIMIT;
    tx.size = TX_SLOTS;
    tx.iov_limit = IOV_LIMIT;
    tx.rma_iov_limit = 1;
    // SAFETY: allocated by `fi_dupinfo`.
    let rx = unsafe { &mut *out.rx_attr };
    rx.caps = req.caps
        & (flags::MSG
            | flags::TAGGED
            | flags::RECV
            | flags::REMOTE_READ
            | flags::REMOTE_WRITE
            | flags::RMA
            | flags::DIRECTED_RECV
            | flags::SOURCE);
    rx.op_flags = hint_rx.map_or(0, |r| r.op_flags);
    rx.msg_order = MSG_ORDER;
    rx.comp_order = sys::FI_ORDER_NONE as u64;
    rx.total_buffered_recv = EAGER_LIMIT * 64;
    rx.size = 4096;
    rx.iov_limit = IOV_LIMIT;
    // SAFETY: allocated by `fi_dupinfo`.
    let ep = unsafe { &mut *out.ep_attr };
    ep.type_ = sys::FI_EP_RDM;
    ep.protocol = sys::FI_PROTO_UNSPEC;
    ep.protocol_version = 1;
    ep.max_msg_size = MAX_MSG;
    ep.msg_prefix_size = 0;
    ep.max_order_raw_size = 0;
    ep.max_order_war_size = 0;
    ep.max_order_waw_size = 0;
    ep.mem_tag_format = u64::MAX;
    ep.tx_ctx_cnt = 1;
    ep.rx_ctx_cnt = 1;
    // SAFETY: allocated by `fi_dupinfo`.
    let d = unsafe { &mut *out.domain_attr };
    d.name = strdup(DOMAIN_NAME);
    d.threading = match hint_domain.map_or(0, |d| d.threading) {
        0 => sys::FI_THREAD_SAFE,
        t => t,
    };
    let progress = |p: u32| if p == 0 { sys::FI_PROGRESS_AUTO } else { p };
    d.control_progress = progress(hint_domain.map_or(0, |d| d.control_progress));
    d.data_progress = progress(hint_domain.map_or(0, |d| d.data_progress));
    d.resource_mgmt = sys::FI_RM_ENABLED;
    d.av_type = match hint_domain.map_or(0, |d| d.av_type) {
        0 => sys::FI_AV_TABLE,
        t => t,
    };
    d.mr_mode = match hint_domain.map_or(0, |d| d.mr_mode) {
        m if m == sys::FI_MR_BASIC as i32 => m,
        _ if req.caps & flags::RMA != 0 => MR_MODE as i32,
        _ => 0,
    };
    d.mr_key_size = 4;
    d.cq_data_size = CQ_DATA_SIZE;
    d.cq_cnt = 64;
    d.ep_cnt = 1;
    d.tx_ctx_cnt = 1;
    d.rx_ctx_cnt = 1;
    d.max_ep_tx_ctx = 1;
    d.max_ep_rx_ctx = 1;
    d.max_ep_stx_ctx = 0;
    d.max_ep_srx_ctx = 0;
    d.cntr_cnt = 0;
    d.mr_iov_limit = 1;
    d.caps = req.caps & SECONDARY_CAPS;
    d.mode = 0;
    d.mr_cnt = 1024;
    d.max_err_data = 0;
    // SAFETY: allocated by `fi_dupinfo`.
    let f = unsafe { &mut *out.fabric_attr };
    f.name = strdup(FABRIC_NAME);
    f.prov_version = flags::PROVIDER_VERSION;
    f.api_version = flags::API_VERSION;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_sockaddr_bytes() {
        for text in ["127.0.0.1:4791", "[::1]:49152", "10.1.2.3:1"] {
            let a: SocketAddr = text.parse().unwrap();
            let bytes = sockaddr_bytes(a);
            // SAFETY: `bytes` holds the sockaddr.
            let back = unsafe { read_sockaddr(bytes.as_ptr() as *const c_void, bytes.len()) };
            assert_eq!(back, Some(a));
        }
        // SAFETY: a null pointer is allowed.
        assert_eq!(unsafe { read_sockaddr(std::ptr::null(), 16) }, None);
        let short = sockaddr_bytes("127.0.0.1:1".parse().unwrap());
        assert_eq!(
            // SAFETY: `short` holds at least 4 bytes.
            unsafe { read_sockaddr(short.as_ptr() as *const c_void, 4) },
            None
        );
    }

    #[test]
    fn memory_registration_modes() {
        let v = flags::fi_version(1, 17);
        let rma = flags::RMA;
        assert!(check_mr_mode(v, 0, 0, rma).is_ok());
        assert!(check_mr_mode(v, MR_MODE as i32, 0, rma).is_ok());
        assert!(check_mr_mode(v, sys::FI_MR_BASIC as i32, 0, rma).is_ok());
        assert!(check_mr_mode(v, sys::FI_MR_SCALABLE as i32, 0, rma).is_err());
        // Offset mode (no FI_MR_VIRT_ADDR) cannot be served for RMA...
        assert!(check_mr_mode(v, sys::FI_MR_PROV_KEY as i32, 0, rma).is_err());
        // ...but is irrelevant to messages only.
        assert!(check_mr_mode(v, sys::FI_MR_PROV_KEY as i32, 0, flags::TAGGED).is_ok());
        assert!(check_mr_mode(flags::fi_version(1, 4), 0, 0, rma).is_ok());
    }
}

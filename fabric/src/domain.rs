//! The domain (`fi_domain`): one MetaRoCE transport (its UDP sockets and
//! endpoint), the thread that progresses it when the application does not,
//! and memory registration (`fi_mr_reg`, `fi_mr_regv`, `fi_mr_regattr`).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use metaroce_core::api::Access;
use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;

use crate::fabric::{fid, leak};
use crate::flags::{self, errno};
use crate::transport::{Settings, Transport};
use crate::{guard, info, sys};

/// How long after an application call the progress thread stays out of
/// the way (the application is progressing the transport itself).
const APP_ACTIVE: Duration = Duration::from_millis(2);
/// Longest sleep of the progress thread.
const THREAD_MAX_WAIT: Duration = Duration::from_millis(20);

/// What a domain's objects share.
#[derive(Debug)]
pub struct DomainShared {
    transport: Mutex<Option<Transport>>,
    /// A second descriptor of the transport's receive socket, polled
    /// without holding the transport (`None`: a DPU, polled).
    receive_fd: Option<OwnedFd>,
    /// Wakes the progress thread (to stop it).
    waker: EventFd,
    origin: Instant,
    /// When the application last progressed the transport (ns since
    /// `origin`).
    app_active: AtomicU64,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Live memory regions: the address of each `Mr` (its descriptor)
    /// and its key, so a descriptor is checked before it is believed.
    regions: Mutex<HashMap<usize, u32>>,
    /// Whether an endpoint holds the transport.
    endpoint: AtomicBool,
}

impl DomainShared {
    /// The transport, `None` once the domain closed.
    pub fn lock(&self) -> MutexGuard<'_, Option<Transport>> {
        self.transport
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the open transport.
    pub fn with<R>(&self, f: impl FnOnce(&mut Transport) -> Result<R, i32>) -> Result<R, i32> {
        self.note_app();
        let mut guard = self.lock();
        let t = guard.as_mut().ok_or(errno::EBADF)?;
        f(t)
    }

    fn note_app(&self) {
        self.app_active
            .store(self.origin.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Progresses the transport from an application call.
    pub fn progress(&self) {
        self.note_app();
        if let Some(t) = self.lock().as_mut() {
            t.progress();
        }
    }

    /// Progresses, then sleeps until a datagram arrives, the transport's
    /// next deadline, or `max` (a blocking read's wait).
    pub fn progress_and_wait(&self, max: Duration) {
        self.note_app();
        let wait = match self.lock().as_mut() {
            Some(t) => {
                if t.progress() {
                    return;
                }
                t.idle_wait(max)
            }
            None => return,
        };
        if !wait.is_zero() {
            match &self.receive_fd {
                Some(fd) => {
                    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                    let _ = nix::poll::ppoll(&mut fds, Some(TimeSpec::from_duration(wait)), None);
                }
                None => std::thread::sleep(wait),
            }
        }
        self.progress();
    }

    /// The key of the region whose descriptor is `desc`, if it is one.
    pub fn key_of_desc(&self, desc: *mut c_void) -> Option<u32> {
        if desc.is_null() {
            return None;
        }
        self.regions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(desc as usize))
            .copied()
    }

    /// Stops the progress thread and closes the transport.
    fn shut_down(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.write(1);
        if let Some(h) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = h.join();
        }
        self.lock().take();
    }
}

/// The progress thread: while the application is not calling in, it runs
/// the transport whenever a datagram arrives or a timer is due, so
/// retransmissions, acknowledgements and rendezvous go on during the
/// application's computation (`FI_PROGRESS_AUTO`).
fn progress_thread(shared: Arc<DomainShared>) {
    while !shared.stop.load(Ordering::Acquire) {
        let now = shared.origin.elapsed().as_nanos() as u64;
        let since_app =
            Duration::from_nanos(now.saturating_sub(shared.app_active.load(Ordering::Relaxed)));
        let (wait, watch_socket) = if since_app < APP_ACTIVE {
            (APP_ACTIVE - since_app, false)
        } else {
            let mut guard = shared.lock();
            match guard.as_mut() {
                Some(t) => {
                    t.progress();
                    (t.idle_wait(THREAD_MAX_WAIT), true)
                }
                None => return,
            }
        };
        if wait.is_zero() {
            continue;
        }
        let ts = Some(TimeSpec::from_duration(wait));
        let waker = PollFd::new(shared.waker.as_fd(), PollFlags::POLLIN);
        match (&shared.receive_fd, watch_socket) {
            (Some(fd), true) => {
                let socket = PollFd::new(fd.as_fd(), PollFlags::POLLIN);
                let _ = nix::poll::ppoll(&mut [socket, waker], ts, None);
            }
            _ => {
                let _ = nix::poll::ppoll(&mut [waker], ts, None);
            }
        }
    }
}

/// The domain object.
#[repr(C)]
#[derive(Debug)]
pub struct Domain {
    fid: sys::fid_domain,
    closed: AtomicBool,
    pub shared: Arc<DomainShared>,
    /// The attributes it was opened with (threading, progress, ...).
    pub info: DomainInfo,
}

/// What the domain keeps of the `fi_info` it was opened with.
#[derive(Debug, Clone, Copy)]
pub struct DomainInfo {
    pub caps: u64,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    pub addr_format: u32,
    /// The API version the application opened the fabric with.
    pub api_version: u32,
}

static DOMAIN_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(domain_close),
    // SAFETY: `None` for every other entry point.
    ..unsafe { std::mem::zeroed() }
};

static DOMAIN_OPS: sys::fi_ops_domain = sys::fi_ops_domain {
    size: std::mem::size_of::<sys::fi_ops_domain>(),
    av_open: Some(crate::av::open),
    cq_open: Some(crate::cq::open),
    endpoint: Some(crate::ep::open),
    scalable_ep: Some(no_scalable_ep),
    cntr_open: Some(no_cntr),
    poll_open: Some(no_poll),
    stx_ctx: Some(no_stx),
    srx_ctx: Some(no_srx),
    query_atomic: Some(no_query_atomic),
    query_collective: Some(no_query_collective),
    // SAFETY: `None` for the entry points after 1.17's.
    ..unsafe { std::mem::zeroed() }
};

static MR_OPS: sys::fi_ops_mr = sys::fi_ops_mr {
    size: std::mem::size_of::<sys::fi_ops_mr>(),
    reg: Some(mr_reg),
    regv: Some(mr_regv),
    regattr: Some(mr_regattr),
};

/// The fabric's `domain` entry point.
pub(crate) unsafe extern "C" fn open(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
    domain: *mut *mut sys::fid_domain,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if !crate::fabric::is_open(fabric) || domain.is_null() {
            return -errno::EINVAL;
        }
        // SAFETY: `info` is null or the application's `fi_info`.
        let Some(info) = (unsafe { info.as_ref() }) else {
            return -errno::EINVAL;
        };
        // SAFETY: the info's address and attribute pointers are null or
        // valid (it came from `fi_getinfo`, possibly edited).
        let src = unsafe { info::read_sockaddr(info.src_addr, info.src_addrlen) };
        let bind = match src {
            Some(a) => a,
            None => match info::default_address(info.addr_format == sys::FI_SOCKADDR_IN6) {
                Ok(ip) => std::net::SocketAddr::new(ip, 0),
                Err(e) => return -e,
            },
        };
        let settings = match Settings::from_env(bind) {
            Ok(s) => s,
            Err(msg) => {
                eprintln!("metaroce: {msg}");
                return -errno::EINVAL;
            }
        };
        let transport = match Transport::new(settings) {
            Ok(t) => t,
            Err(msg) => {
                eprintln!("metaroce: cannot open the domain at {bind}: {msg}");
                return -errno::EADDRINUSE;
            }
        };
        let receive_fd = match transport.wait_fd().map(|fd| fd.try_clone_to_owned()) {
            Some(Ok(fd)) => Some(fd),
            Some(Err(_)) => return -errno::ENOMEM,
            None => None,
        };
        let Ok(waker) =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
        else {
            return -errno::ENOMEM;
        };
        let shared = Arc::new(DomainShared {
            transport: Mutex::new(Some(transport)),
            receive_fd,
            waker,
            origin: Instant::now(),
            app_active: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            regions: Mutex::new(HashMap::new()),
            endpoint: AtomicBool::new(false),
        });
        let for_thread = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("metaroce-progress".into())
            .spawn(move || progress_thread(for_thread));
        match handle {
            Ok(h) => *shared.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(h),
            Err(_) => return -errno::ENOMEM,
        }
        // SAFETY: attribute pointers of an `fi_info` are null or valid.
        let (tx_op_flags, rx_op_flags) = unsafe {
            (
                info.tx_attr.as_ref().map_or(0, |t| t.op_flags),
                info.rx_attr.as_ref().map_or(0, |r| r.op_flags),
            )
        };
        let obj = leak(Domain {
            fid: sys::fid_domain {
                fid: fid(sys::FI_CLASS_DOMAIN, context, &DOMAIN_FI_OPS),
                ops: &DOMAIN_OPS as *const _ as *mut _,
                mr: &MR_OPS as *const _ as *mut _,
            },
            closed: AtomicBool::new(false),
            shared,
            info: DomainInfo {
                caps: if info.caps == 0 {
                    info::PRIMARY_CAPS | info::SECONDARY_CAPS
                } else {
                    info.caps
                },
                tx_op_flags,
                rx_op_flags,
                addr_format: info::format_of(bind),
                // SAFETY: `fabric` is this provider's open fabric (checked).
                api_version: unsafe { (*fabric).api_version },
            },
        });
        // SAFETY: `domain` is writable (checked non-null).
        unsafe { *domain = obj as *mut sys::fid_domain };
        0
    })
}

/// The open domain behind `domain`.
pub(crate) fn domain_of<'a>(domain: *mut sys::fid_domain) -> Result<&'a Domain, i32> {
    // SAFETY: libfabric passes a domain this provider made.
    match unsafe { (domain as *const Domain).as_ref() } {
        Some(d) if !d.closed.load(Ordering::Acquire) => Ok(d),
        Some(_) => Err(errno::EBADF),
        None => Err(errno::EINVAL),
    }
}

impl Domain {
    /// Claims the transport for an endpoint: one endpoint per domain.
    pub(crate) fn claim_endpoint(&self) -> bool {
        !self.shared.endpoint.swap(true, Ordering::AcqRel)
    }

    /// Gives the transport back (the endpoint closed).
    pub(crate) fn release_endpoint(shared: &DomainShared) {
        shared.endpoint.store(false, Ordering::Release);
    }
}

unsafe extern "C" fn domain_close(fid: *mut sys::fid) -> c_int {
    guard(|| match domain_of(fid as *mut sys::fid_domain) {
        Ok(d) => {
            d.closed.store(true, Ordering::Release);
            d.shared.shut_down();
            0
        }
        Err(e) => -e,
    })
}

unsafe extern "C" fn no_scalable_ep(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_info,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn no_cntr(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_cntr_attr,
    _: *mut *mut sys::fid_cntr,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn no_poll(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_poll_attr,
    _: *mut *mut sys::fid_poll,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn no_stx(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_tx_attr,
    _: *mut *mut sys::fid_stx,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn no_srx(
    _: *mut sys::fid_domain,
    _: *mut sys::fi_rx_attr,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn no_query_atomic(
    _: *mut sys::fid_domain,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut sys::fi_atomic_attr,
    _: u64,
) -> c_int {
    -errno::EOPNOTSUPP
}

unsafe extern "C" fn no_query_collective(
    _: *mut sys::fid_domain,
    _: sys::fi_collective_op,
    _: *mut sys::fi_collective_attr,
    _: u64,
) -> c_int {
    -errno::ENOSYS
}

// ----- Memory regions ---------------------------------------------------

/// A registered memory region. Its address is its descriptor
/// (`fi_mr_desc`).
#[repr(C)]
#[derive(Debug)]
pub struct Mr {
    fid: sys::fid_mr,
    closed: AtomicBool,
    shared: Arc<DomainShared>,
    key: u32,
}

static MR_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(mr_close),
    bind: Some(mr_bind),
    control: Some(mr_control),
    // SAFETY: `None` for every other entry point.
    ..unsafe { std::mem::zeroed() }
};

/// The MetaRoCE rights of libfabric access flags (local use is always
/// allowed: the provider's own READs land in the application's buffers).
fn access_of(access: u64) -> Access {
    let mut a = Access::LOCAL_WRITE;
    if access & flags::REMOTE_WRITE != 0 {
        a = a.with(Access::REMOTE_WRITE);
    }
    if access & flags::REMOTE_READ != 0 {
        a = a.with(Access::REMOTE_READ);
    }
    a
}

fn register(
    fid: *mut sys::fid,
    iov: &[(usize, usize)],
    access: u64,
    offset: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    if mr.is_null() {
        return -errno::EINVAL;
    }
    // SAFETY: the fid is the domain's (`fid_domain` begins with it).
    let d = match domain_of(fid as *mut sys::fid_domain) {
        Ok(d) => d,
        Err(e) => return -e,
    };
    // SAFETY: as above, and a domain's fid has class DOMAIN.
    if unsafe { (*fid).fclass } != sys::FI_CLASS_DOMAIN as usize {
        return -errno::EINVAL;
    }
    // One contiguous range: a MetaRoCE region is `[base, base + len)`.
    let [(base, len)] = iov else {
        return -errno::EOPNOTSUPP;
    };
    if *base == 0 || *len == 0 || offset != 0 && offset != *base as u64 {
        return -errno::EINVAL;
    }
    let key = match d
        .shared
        .with(|t| t.register(*base as u64, *len as u64, access_of(access)))
    {
        Ok(k) => k,
        Err(e) => return -e,
    };
    let obj = leak(Mr {
        fid: sys::fid_mr {
            fid: fid_of(context),
            mem_desc: std::ptr::null_mut(),
            key: u64::from(key),
        },
        closed: AtomicBool::new(false),
        shared: Arc::clone(&d.shared),
        key,
    });
    // SAFETY: `obj` was just allocated.
    unsafe { (*obj).fid.mem_desc = obj as *mut c_void };
    d.shared
        .regions
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(obj as usize, key);
    // SAFETY: `mr` is writable (checked non-null).
    unsafe { *mr = obj as *mut sys::fid_mr };
    0
}

fn fid_of(context: *mut c_void) -> sys::fid {
    fid(sys::FI_CLASS_MR, context, &MR_FI_OPS)
}

unsafe extern "C" fn mr_reg(
    fid: *mut sys::fid,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    _requested_key: u64,
    _flags: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    guard(|| register(fid, &[(buf as usize, len)], access, offset, mr, context))
}

unsafe extern "C" fn mr_regv(
    fid: *mut sys::fid,
    iov: *const sys::iovec,
    count: usize,
    access: u64,
    offset: u64,
    _requested_key: u64,
    _flags: u64,
    mr: *mut *mut sys::fid_mr,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        if iov.is_null() || count == 0 {
            return -errno::EINVAL;
        }
        // SAFETY: the application passes `count` iovecs at `iov`.
        let iov = unsafe { std::slice::from_raw_parts(iov, count) };
        let pieces: Vec<(usize, usize)> = iov
            .iter()
            .map(|v| (v.iov_base as usize, v.iov_len))
            .collect();
        register(fid, &pieces, access, offset, mr, context)
    })
}

unsafe extern "C" fn mr_regattr(
    fid: *mut sys::fid,
    attr: *const sys::fi_mr_attr,
    _flags: u64,
    mr: *mut *mut sys::fid_mr,
) -> c_int {
    guard(|| {
        // SAFETY: `attr` is null or the application's attributes.
        let Some(a) = (unsafe { attr.as_ref() }) else {
            return -errno::EINVAL;
        };
        if a.iface != sys::FI_HMEM_SYSTEM {
            return -errno::EOPNOTSUPP;
        }
        if a.mr_iov.is_null() || a.iov_count == 0 {
            return -errno::EINVAL;
        }
        // SAFETY: the attributes hold `iov_count` iovecs.
        let iov = unsafe { std::slice::from_raw_parts(a.mr_iov, a.iov_count) };
        let pieces: Vec<(usize, usize)> = iov
            .iter()
            .map(|v| (v.iov_base as usize, v.iov_len))
            .collect();
        register(fid, &pieces, a.access, a.offset, mr, a.context)
    })
}

fn mr_of<'a>(fid: *mut sys::fid) -> Result<&'a Mr, i32> {
    // SAFETY: libfabric passes a region this provider made.
    match unsafe { (fid as *const Mr).as_ref() } {
        Some(m) if !m.closed.load(Ordering::Acquire) => Ok(m),
        Some(_) => Err(errno::EBADF),
        None => Err(errno::EINVAL),
    }
}

unsafe extern "C" fn mr_close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        let m = match mr_of(fid) {
            Ok(m) => m,
            Err(e) => return -e,
        };
        m.closed.store(true, Ordering::Release);
        m.shared
            .regions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(fid as usize));
        match m.shared.with(|t| t.deregister(m.key)) {
            Ok(()) | Err(errno::EBADF) => 0,
            Err(e) => -e,
        }
    })
}

unsafe extern "C" fn mr_bind(_: *mut sys::fid, _: *mut sys::fid, _: u64) -> c_int {
    // Regions need no endpoint binding (no FI_MR_ENDPOINT).
    -errno::ENOSYS
}

unsafe extern "C" fn mr_control(_: *mut sys::fid, _: c_int, _: *mut c_void) -> c_int {
    -errno::ENOSYS
}

//! Endpoints (`fi_endpoint`): binding, enabling, names, and the data calls
//! (`fi_msg`, `fi_tagged`, `fi_rma`), each mapped onto the domain's
//! transport ([`data`]). Atomics and the connection-management calls of
//! connected endpoints answer `-FI_ENOSYS`.

mod data;
mod rma;

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::domain::{domain_of, Domain, DomainShared};
use crate::fabric::{fid, leak};
use crate::flags::{self, errno};
use crate::info::sockaddr_bytes;
use crate::{guard, guard_isize, sys};

/// An endpoint.
#[repr(C)]
#[derive(Debug)]
pub struct Ep {
    fid: sys::fid_ep,
    closed: AtomicBool,
    enabled: AtomicBool,
    domain: Arc<DomainShared>,
    /// Default flags of transmit and receive operations (`fi_info`'s
    /// `op_flags`, changed by `FI_SETOPSFLAG`).
    tx_op_flags: AtomicU64,
    rx_op_flags: AtomicU64,
}

static EP_FI_OPS: sys::fi_ops = sys::fi_ops {
    size: std::mem::size_of::<sys::fi_ops>(),
    close: Some(ep_close),
    bind: Some(ep_bind),
    control: Some(ep_control),
    // SAFETY: `None` for every other entry point.
    ..unsafe { std::mem::zeroed() }
};

static EP_OPS: sys::fi_ops_ep = sys::fi_ops_ep {
    size: std::mem::size_of::<sys::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(ep_no_ctx_tx),
    rx_ctx: Some(ep_no_ctx_rx),
    rx_size_left: Some(ep_size_left),
    tx_size_left: Some(ep_size_left),
};

static CM_OPS: sys::fi_ops_cm = sys::fi_ops_cm {
    size: std::mem::size_of::<sys::fi_ops_cm>(),
    setname: Some(cm_setname),
    getname: Some(cm_getname),
    getpeer: Some(cm_getpeer),
    connect: Some(cm_connect),
    listen: Some(cm_listen),
    accept: Some(cm_accept),
    reject: Some(cm_reject),
    shutdown: Some(cm_shutdown),
    join: Some(cm_join),
};

/// The domain's `endpoint` entry point.
pub(crate) unsafe extern "C" fn open(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    ep: *mut *mut sys::fid_ep,
    context: *mut c_void,
) -> c_int {
    guard(|| {
        let d: &Domain = match domain_of(domain) {
            Ok(d) => d,
            Err(e) => return -e,
        };
        if ep.is_null() {
            return -errno::EINVAL;
        }
        // SAFETY: `info` is null or the application's `fi_info`.
        let (tx_op_flags, rx_op_flags) = match unsafe { info.as_ref() } {
            Some(i) => {
                // SAFETY: attribute pointers of an `fi_info` are null or
                // valid.
                let ep_attr = unsafe { i.ep_attr.as_ref() };
                if ep_attr
                    .is_some_and(|a| a.type_ != sys::FI_EP_RDM && a.type_ != sys::FI_EP_UNSPEC)
                {
                    return -errno::EINVAL;
                }
                // SAFETY: as above.
                unsafe {
                    (
                        i.tx_attr
                            .as_ref()
                            .map_or(d.info.tx_op_flags, |t| t.op_flags),
                        i.rx_attr
                            .as_ref()
                            .map_or(d.info.rx_op_flags, |r| r.op_flags),
                    )
                }
            }
            None => (d.info.tx_op_flags, d.info.rx_op_flags),
        };
        // The domain's transport serves one endpoint (one address).
        if !d.claim_endpoint() {
            return -errno::EBUSY;
        }
        let obj = leak(Ep {
            fid: sys::fid_ep {
                fid: fid(sys::FI_CLASS_EP, context, &EP_FI_OPS),
                ops: &EP_OPS as *const _ as *mut _,
                cm: &CM_OPS as *const _ as *mut _,
                msg: &data::MSG_OPS as *const _ as *mut _,
                rma: &rma::RMA_OPS as *const _ as *mut _,
                tagged: &data::TAGGED_OPS as *const _ as *mut _,
                atomic: &rma::ATOMIC_OPS as *const _ as *mut _,
                collective: std::ptr::null_mut(),
            },
            closed: AtomicBool::new(false),
            enabled: AtomicBool::new(false),
            domain: Arc::clone(&d.shared),
            tx_op_flags: AtomicU64::new(tx_op_flags),
            rx_op_flags: AtomicU64::new(rx_op_flags),
        });
        // SAFETY: `ep` is writable (checked non-null).
        unsafe { *ep = obj as *mut sys::fid_ep };
        0
    })
}

fn ep_of<'a>(ep: *mut sys::fid_ep) -> Result<&'a Ep, i32> {
    // SAFETY: libfabric passes an endpoint this provider made.
    match unsafe { (ep as *const Ep).as_ref() } {
        Some(e) if !e.closed.load(Ordering::Acquire) => Ok(e),
        Some(_) => Err(errno::EBADF),
        None => Err(errno::EINVAL),
    }
}

/// An endpoint ready for data calls.
fn enabled_ep<'a>(ep: *mut sys::fid_ep) -> Result<&'a Ep, i32> {
    let e = ep_of(ep)?;
    if e.enabled.load(Ordering::Acquire) {
        Ok(e)
    } else {
        Err(sys::FI_EOPBADSTATE as i32)
    }
}

unsafe extern "C" fn ep_close(fid: *mut sys::fid) -> c_int {
    guard(|| {
        let e = match ep_of(fid as *mut sys::fid_ep) {
            Ok(e) => e,
            Err(err) => return -err,
        };
        e.closed.store(true, Ordering::Release);
        if let Some(t) = e.domain.lock().as_mut() {
            t.close_endpoint();
        }
        Domain::release_endpoint(&e.domain);
        0
    })
}

unsafe extern "C" fn ep_bind(fid: *mut sys::fid, bfid: *mut sys::fid, bind_flags: u64) -> c_int {
    guard(|| {
        let e = match ep_of(fid as *mut sys::fid_ep) {
            Ok(e) => e,
            Err(err) => return -err,
        };
        // SAFETY: `bfid` is null or an object of libfabric's.
        let Some(class) = (unsafe { bfid.as_ref() }).map(|f| f.fclass as u32) else {
            return -errno::EINVAL;
        };
        match class {
            sys::FI_CLASS_CQ => {
                let cq = match crate::cq::cq_of(bfid as *mut sys::fid_cq) {
                    Ok(q) => q,
                    Err(err) => return -err,
                };
                if !Arc::ptr_eq(&cq.domain, &e.domain) {
                    return -errno::EINVAL;
                }
                if bind_flags & (flags::TRANSMIT | flags::RECV) == 0 {
                    return -errno::EBADFLAGS;
                }
                let selective = bind_flags & flags::SELECTIVE_COMPLETION != 0;
                let r = e.domain.with(|t| {
                    if bind_flags & flags::TRANSMIT != 0 {
                        t.bindings.tx_cq = Some(Arc::clone(&cq.queue));
                        t.bindings.tx_selective = selective;
                    }
                    if bind_flags & flags::RECV != 0 {
                        t.bindings.rx_cq = Some(Arc::clone(&cq.queue));
                        t.bindings.rx_selective = selective;
                    }
                    Ok(())
                });
                r.err().map_or(0, |err| -err)
            }
            sys::FI_CLASS_AV => {
                let av = match crate::av::av_of(bfid as *mut sys::fid_av) {
                    Ok(a) => a,
                    Err(err) => return -err,
                };
                let table = Arc::clone(&av.table);
                e.domain
                    .with(|t| {
                        t.bindings.av = Some(table);
                        Ok(())
                    })
                    .err()
                    .map_or(0, |err| -err)
            }
            // Connectionless: nothing is ever reported to an event queue,
            // binding one is allowed.
            sys::FI_CLASS_EQ => 0,
            sys::FI_CLASS_CNTR => -errno::ENOSYS,
            _ => -errno::EINVAL,
        }
    })
}

unsafe extern "C" fn ep_control(fid: *mut sys::fid, command: c_int, arg: *mut c_void) -> c_int {
    guard(|| {
        let e = match ep_of(fid as *mut sys::fid_ep) {
            Ok(e) => e,
            Err(err) => return -err,
        };
        match command as u32 {
            sys::FI_ENABLE => {
                let ready = e
                    .domain
                    .with(|t| Ok(t.bindings.av.is_some()))
                    .unwrap_or(false);
                if !ready {
                    return -errno::ENOAV;
                }
                e.enabled.store(true, Ordering::Release);
                0
            }
            sys::FI_GETOPSFLAG | sys::FI_SETOPSFLAG => {
                if arg.is_null() {
                    return -errno::EINVAL;
                }
                let p = arg as *mut u64;
                // SAFETY: the argument is the application's `uint64_t`.
                let value = unsafe { *p };
                let target = if value & flags::TRANSMIT != 0 {
                    &e.tx_op_flags
                } else if value & flags::RECV != 0 {
                    &e.rx_op_flags
                } else {
                    return -errno::EINVAL;
                };
                let direction = flags::TRANSMIT | flags::RECV;
                if command as u32 == sys::FI_GETOPSFLAG {
                    // SAFETY: as above.
                    unsafe { *p = target.load(Ordering::Acquire) | (value & direction) };
                } else {
                    target.store(value & !direction, Ordering::Release);
                }
                0
            }
            _ => -errno::ENOSYS,
        }
    })
}

unsafe extern "C" fn ep_cancel(fid: *mut sys::fid, context: *mut c_void) -> isize {
    guard_isize(|| {
        let e = match ep_of(fid as *mut sys::fid_ep) {
            Ok(e) => e,
            Err(err) => return -(err as isize),
        };
        match e.domain.with(|t| Ok(t.cancel(context as usize))) {
            Ok(true) => 0,
            Ok(false) => -(errno::ENOENT as isize),
            Err(err) => -(err as isize),
        }
    })
}

unsafe extern "C" fn ep_getopt(
    _: *mut sys::fid,
    _: c_int,
    _: c_int,
    _: *mut c_void,
    _: *mut usize,
) -> c_int {
    -(sys::FI_ENOPROTOOPT as c_int)
}

unsafe extern "C" fn ep_setopt(
    _: *mut sys::fid,
    _: c_int,
    _: c_int,
    _: *const c_void,
    _: usize,
) -> c_int {
    -(sys::FI_ENOPROTOOPT as c_int)
}

unsafe extern "C" fn ep_no_ctx_tx(
    _: *mut sys::fid_ep,
    _: c_int,
    _: *mut sys::fi_tx_attr,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn ep_no_ctx_rx(
    _: *mut sys::fid_ep,
    _: c_int,
    _: *mut sys::fi_rx_attr,
    _: *mut *mut sys::fid_ep,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn ep_size_left(ep: *mut sys::fid_ep) -> isize {
    match ep_of(ep) {
        Ok(_) => crate::transport::TX_SLOTS as isize,
        Err(e) => -(e as isize),
    }
}

// ----- Names ------------------------------------------------------------

unsafe extern "C" fn cm_getname(fid: sys::fid_t, addr: *mut c_void, addrlen: *mut usize) -> c_int {
    guard(|| {
        let e = match ep_of(fid as *mut sys::fid_ep) {
            Ok(e) => e,
            Err(err) => return -err,
        };
        if addrlen.is_null() {
            return -errno::EINVAL;
        }
        match e.domain.with(|t| Ok(t.local_addr())) {
            Ok(a) => crate::av::copy_name(&sockaddr_bytes(a), addr, addrlen),
            Err(err) => -err,
        }
    })
}

unsafe extern "C" fn cm_setname(_: sys::fid_t, _: *mut c_void, _: usize) -> c_int {
    // The address is the domain's sockets', bound when it opened (choose
    // it with the `fi_info` source address or FI_METAROCE_ADDR).
    -errno::ENOSYS
}

unsafe extern "C" fn cm_getpeer(_: *mut sys::fid_ep, _: *mut c_void, _: *mut usize) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn cm_connect(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: *const c_void,
    _: usize,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn cm_listen(_: *mut sys::fid_pep) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn cm_accept(_: *mut sys::fid_ep, _: *const c_void, _: usize) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn cm_reject(
    _: *mut sys::fid_pep,
    _: sys::fid_t,
    _: *const c_void,
    _: usize,
) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn cm_shutdown(_: *mut sys::fid_ep, _: u64) -> c_int {
    -errno::ENOSYS
}

unsafe extern "C" fn cm_join(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: u64,
    _: *mut *mut sys::fid_mc,
    _: *mut c_void,
) -> c_int {
    -errno::ENOSYS
}

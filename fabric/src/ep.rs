//! Endpoints (`fi_endpoint`): binding, enabling, names, and the data calls
//! (`fi_msg`, `fi_tagged`, `fi_rma`), each mapped onto the domain's
//! transport. Atomics and the connection-management calls of connected
//! endpoints answer `-FI_ENOSYS`.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::domain::{domain_of, Domain, DomainShared};
use crate::fabric::{fid, leak};
use crate::flags::{self, errno};
use crate::info::{sockaddr_bytes, IOV_LIMIT};
use crate::matching::PostedRecv;
use crate::transport::{RmaArgs, RmaOp, SendArgs};
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

static MSG_OPS: sys::fi_ops_msg = sys::fi_ops_msg {
    size: std::mem::size_of::<sys::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

static TAGGED_OPS: sys::fi_ops_tagged = sys::fi_ops_tagged {
    size: std::mem::size_of::<sys::fi_ops_tagged>(),
    recv: Some(tagged_recv),
    recvv: Some(tagged_recvv),
    recvmsg: Some(tagged_recvmsg),
    send: Some(tagged_send),
    sendv: Some(tagged_sendv),
    sendmsg: Some(tagged_sendmsg),
    inject: Some(tagged_inject),
    senddata: Some(tagged_senddata),
    injectdata: Some(tagged_injectdata),
};

static RMA_OPS: sys::fi_ops_rma = sys::fi_ops_rma {
    size: std::mem::size_of::<sys::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

static ATOMIC_OPS: sys::fi_ops_atomic = sys::fi_ops_atomic {
    size: std::mem::size_of::<sys::fi_ops_atomic>(),
    write: Some(atomic_write),
    writev: Some(atomic_writev),
    writemsg: Some(atomic_writemsg),
    inject: Some(atomic_inject),
    readwrite: Some(atomic_readwrite),
    readwritev: Some(atomic_readwritev),
    readwritemsg: Some(atomic_readwritemsg),
    compwrite: Some(atomic_compwrite),
    compwritev: Some(atomic_compwritev),
    compwritemsg: Some(atomic_compwritemsg),
    writevalid: Some(atomic_valid),
    readwritevalid: Some(atomic_valid),
    compwritevalid: Some(atomic_valid),
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
                msg: &MSG_OPS as *const _ as *mut _,
                rma: &RMA_OPS as *const _ as *mut _,
                tagged: &TAGGED_OPS as *const _ as *mut _,
                atomic: &ATOMIC_OPS as *const _ as *mut _,
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

// ----- Shared paths of the data calls -------------------------------------

/// `(address, length)` pairs of an iovec array.
fn iov_pairs(iov: *const sys::iovec, count: usize) -> Result<Vec<(usize, usize)>, i32> {
    if count > IOV_LIMIT || (iov.is_null() && count > 0) {
        return Err(errno::EINVAL);
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the application passes `count` iovecs at `iov`.
    let v = unsafe { std::slice::from_raw_parts(iov, count) };
    Ok(v.iter().map(|i| (i.iov_base as usize, i.iov_len)).collect())
}

fn rc(r: Result<(), i32>) -> isize {
    match r {
        Ok(()) => 0,
        Err(e) => -(e as isize),
    }
}

struct Send {
    iov: Vec<(usize, usize)>,
    dest: u64,
    tag: Option<u64>,
    data: Option<u64>,
    context: usize,
    /// Operation flags (the call's, or the endpoint's defaults).
    op_flags: Option<u64>,
    inject: bool,
}

fn send(ep: *mut sys::fid_ep, s: Send) -> isize {
    let e = match enabled_ep(ep) {
        Ok(e) => e,
        Err(err) => return -(err as isize),
    };
    let op_flags = s
        .op_flags
        .unwrap_or_else(|| e.tx_op_flags.load(Ordering::Acquire));
    // `FI_INJECT` on a `sendmsg`: the buffer is free on return, which
    // eager messages satisfy (they are copied when posted); longer ones
    // would be READ from it later.
    let total: usize = s.iov.iter().map(|&(_, len)| len).sum();
    if op_flags & flags::INJECT != 0 && total > crate::transport::INJECT_LIMIT {
        return -(errno::EMSGSIZE as isize);
    }
    rc(e.domain.with(|t| {
        let completion =
            !s.inject && (!t.bindings.tx_selective || op_flags & flags::COMPLETION != 0);
        t.send(&SendArgs {
            dest: s.dest,
            iov: &s.iov,
            tag: s.tag,
            // Remote CQ data is MetaRoCE's 32-bit immediate
            // (`cq_data_size` 4).
            data: s.data.map(|d| d as u32),
            context: s.context,
            completion,
            inject: s.inject,
        })
    }))
}

struct Recv {
    iov: Vec<(usize, usize)>,
    src: u64,
    tag: u64,
    ignore: u64,
    tagged: bool,
    context: usize,
    op_flags: Option<u64>,
}

fn recv(ep: *mut sys::fid_ep, r: Recv) -> isize {
    let e = match enabled_ep(ep) {
        Ok(e) => e,
        Err(err) => return -(err as isize),
    };
    let op_flags = r
        .op_flags
        .unwrap_or_else(|| e.rx_op_flags.load(Ordering::Acquire));
    if op_flags & flags::MULTI_RECV != 0 {
        return -(errno::EOPNOTSUPP as isize);
    }
    rc(e.domain.with(|t| {
        let completion = !t.bindings.rx_selective || op_flags & flags::COMPLETION != 0;
        let posted = PostedRecv {
            iov: r.iov.clone(),
            context: r.context,
            src: r.src,
            tag: if r.tagged { r.tag } else { 0 },
            ignore: if r.tagged { r.ignore } else { u64::MAX },
            completion,
        };
        if r.tagged && op_flags & flags::PEEK != 0 {
            t.peek(
                &posted,
                op_flags & flags::CLAIM != 0,
                op_flags & flags::DISCARD != 0,
            );
            return Ok(());
        }
        if r.tagged && op_flags & flags::CLAIM != 0 {
            return t.claim(posted, op_flags & flags::DISCARD != 0);
        }
        t.recv(posted, r.tagged)
    }))
}

fn rma(ep: *mut sys::fid_ep, args: RmaArgs, desc: *mut c_void, op_flags: Option<u64>) -> isize {
    let e = match enabled_ep(ep) {
        Ok(e) => e,
        Err(err) => return -(err as isize),
    };
    let op_flags = op_flags.unwrap_or_else(|| e.tx_op_flags.load(Ordering::Acquire));
    let local_key = e.domain.key_of_desc(desc);
    if !desc.is_null() && local_key.is_none() {
        return -(errno::EINVAL as isize);
    }
    rc(e.domain.with(|t| {
        let completion =
            !args.inject && (!t.bindings.tx_selective || op_flags & flags::COMPLETION != 0);
        t.rma(RmaArgs {
            local_key,
            completion,
            ..args
        })
    }))
}

fn one(buf: *const c_void, len: usize) -> Vec<(usize, usize)> {
    vec![(buf as usize, len)]
}

// ----- fi_msg -----------------------------------------------------------

unsafe extern "C" fn msg_recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        recv(
            ep,
            Recv {
                iov: one(buf, len),
                src: src_addr,
                tag: 0,
                ignore: 0,
                tagged: false,
                context: context as usize,
                op_flags: None,
            },
        )
    })
}

unsafe extern "C" fn msg_recvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard_isize(|| match iov_pairs(iov, count) {
        Ok(iov) => recv(
            ep,
            Recv {
                iov,
                src: src_addr,
                tag: 0,
                ignore: 0,
                tagged: false,
                context: context as usize,
                op_flags: None,
            },
        ),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn msg_recvmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg,
    op_flags: u64,
) -> isize {
    guard_isize(|| {
        // SAFETY: `msg` is null or the application's message.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return -(errno::EINVAL as isize);
        };
        match iov_pairs(m.msg_iov, m.iov_count) {
            Ok(iov) => recv(
                ep,
                Recv {
                    iov,
                    src: m.addr,
                    tag: 0,
                    ignore: 0,
                    tagged: false,
                    context: m.context as usize,
                    op_flags: Some(op_flags),
                },
            ),
            Err(e) => -(e as isize),
        }
    })
}

unsafe extern "C" fn msg_send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: None,
                data: None,
                context: context as usize,
                op_flags: None,
                inject: false,
            },
        )
    })
}

unsafe extern "C" fn msg_sendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard_isize(|| match iov_pairs(iov, count) {
        Ok(iov) => send(
            ep,
            Send {
                iov,
                dest: dest_addr,
                tag: None,
                data: None,
                context: context as usize,
                op_flags: None,
                inject: false,
            },
        ),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn msg_sendmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg,
    op_flags: u64,
) -> isize {
    guard_isize(|| {
        // SAFETY: `msg` is null or the application's message.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return -(errno::EINVAL as isize);
        };
        match iov_pairs(m.msg_iov, m.iov_count) {
            Ok(iov) => send(
                ep,
                Send {
                    iov,
                    dest: m.addr,
                    tag: None,
                    data: (op_flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data),
                    context: m.context as usize,
                    op_flags: Some(op_flags),
                    inject: false,
                },
            ),
            Err(e) => -(e as isize),
        }
    })
}

unsafe extern "C" fn msg_inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: sys::fi_addr_t,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: None,
                data: None,
                context: 0,
                op_flags: None,
                inject: true,
            },
        )
    })
}

unsafe extern "C" fn msg_senddata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: None,
                data: Some(data),
                context: context as usize,
                op_flags: None,
                inject: false,
            },
        )
    })
}

unsafe extern "C" fn msg_injectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest_addr: sys::fi_addr_t,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: None,
                data: Some(data),
                context: 0,
                op_flags: None,
                inject: true,
            },
        )
    })
}

// ----- fi_tagged --------------------------------------------------------

unsafe extern "C" fn tagged_recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    _desc: *mut c_void,
    src_addr: sys::fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        recv(
            ep,
            Recv {
                iov: one(buf, len),
                src: src_addr,
                tag,
                ignore,
                tagged: true,
                context: context as usize,
                op_flags: None,
            },
        )
    })
}

unsafe extern "C" fn tagged_recvv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    src_addr: sys::fi_addr_t,
    tag: u64,
    ignore: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| match iov_pairs(iov, count) {
        Ok(iov) => recv(
            ep,
            Recv {
                iov,
                src: src_addr,
                tag,
                ignore,
                tagged: true,
                context: context as usize,
                op_flags: None,
            },
        ),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn tagged_recvmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_tagged,
    op_flags: u64,
) -> isize {
    guard_isize(|| {
        // SAFETY: `msg` is null or the application's message.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return -(errno::EINVAL as isize);
        };
        match iov_pairs(m.msg_iov, m.iov_count) {
            Ok(iov) => recv(
                ep,
                Recv {
                    iov,
                    src: m.addr,
                    tag: m.tag,
                    ignore: m.ignore,
                    tagged: true,
                    context: m.context as usize,
                    op_flags: Some(op_flags),
                },
            ),
            Err(e) => -(e as isize),
        }
    })
}

unsafe extern "C" fn tagged_send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: Some(tag),
                data: None,
                context: context as usize,
                op_flags: None,
                inject: false,
            },
        )
    })
}

unsafe extern "C" fn tagged_sendv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    _desc: *mut *mut c_void,
    count: usize,
    dest_addr: sys::fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| match iov_pairs(iov, count) {
        Ok(iov) => send(
            ep,
            Send {
                iov,
                dest: dest_addr,
                tag: Some(tag),
                data: None,
                context: context as usize,
                op_flags: None,
                inject: false,
            },
        ),
        Err(e) => -(e as isize),
    })
}

unsafe extern "C" fn tagged_sendmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_tagged,
    op_flags: u64,
) -> isize {
    guard_isize(|| {
        // SAFETY: `msg` is null or the application's message.
        let Some(m) = (unsafe { msg.as_ref() }) else {
            return -(errno::EINVAL as isize);
        };
        match iov_pairs(m.msg_iov, m.iov_count) {
            Ok(iov) => send(
                ep,
                Send {
                    iov,
                    dest: m.addr,
                    tag: Some(m.tag),
                    data: (op_flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data),
                    context: m.context as usize,
                    op_flags: Some(op_flags),
                    inject: false,
                },
            ),
            Err(e) => -(e as isize),
        }
    })
}

unsafe extern "C" fn tagged_inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: sys::fi_addr_t,
    tag: u64,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: Some(tag),
                data: None,
                context: 0,
                op_flags: None,
                inject: true,
            },
        )
    })
}

unsafe extern "C" fn tagged_senddata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    _desc: *mut c_void,
    data: u64,
    dest_addr: sys::fi_addr_t,
    tag: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: Some(tag),
                data: Some(data),
                context: context as usize,
                op_flags: None,
                inject: false,
            },
        )
    })
}

unsafe extern "C" fn tagged_injectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest_addr: sys::fi_addr_t,
    tag: u64,
) -> isize {
    guard_isize(|| {
        send(
            ep,
            Send {
                iov: one(buf, len),
                dest: dest_addr,
                tag: Some(tag),
                data: Some(data),
                context: 0,
                op_flags: None,
                inject: true,
            },
        )
    })
}

// ----- fi_rma -----------------------------------------------------------

#[allow(clippy::too_many_arguments)]
fn rma_args(
    op: RmaOp,
    dest: u64,
    buf: usize,
    len: usize,
    addr: u64,
    key: u64,
    context: usize,
    inject: bool,
) -> RmaArgs {
    RmaArgs {
        op,
        dest,
        buf,
        len,
        local_key: None,
        remote_addr: addr,
        remote_key: key,
        context,
        completion: true,
        inject,
    }
}

/// The single local buffer and single remote range of an RMA call.
fn single(iov: &[(usize, usize)]) -> Result<(usize, usize), i32> {
    match iov {
        [one] => Ok(*one),
        [] => Ok((0, 0)),
        _ => Err(errno::EOPNOTSUPP),
    }
}

unsafe extern "C" fn rma_read(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        let a = rma_args(
            RmaOp::Read,
            src_addr,
            buf as usize,
            len,
            addr,
            key,
            context as usize,
            false,
        );
        rma(ep, a, desc, None)
    })
}

unsafe extern "C" fn rma_readv(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    desc: *mut *mut c_void,
    count: usize,
    src_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        let (buf, len) = match iov_pairs(iov, count).and_then(|v| single(&v)) {
            Ok(x) => x,
            Err(e) => return -(e as isize),
        };
        let d = first_desc(desc, count);
        let a = rma_args(
            RmaOp::Read,
            src_addr,
            buf,
            len,
            addr,
            key,
            context as usize,
            false,
        );
        rma(ep, a, d, None)
    })
}

fn first_desc(desc: *mut *mut c_void, count: usize) -> *mut c_void {
    if desc.is_null() || count == 0 {
        std::ptr::null_mut()
    } else {
        // SAFETY: the application passes `count` descriptors at `desc`.
        unsafe { *desc }
    }
}

fn rma_msg(ep: *mut sys::fid_ep, msg: *const sys::fi_msg_rma, op_flags: u64, read: bool) -> isize {
    // SAFETY: `msg` is null or the application's message.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return -(errno::EINVAL as isize);
    };
    let (buf, len) = match iov_pairs(m.msg_iov, m.iov_count).and_then(|v| single(&v)) {
        Ok(x) => x,
        Err(e) => return -(e as isize),
    };
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return -(errno::EOPNOTSUPP as isize);
    }
    // SAFETY: one remote range (checked count and non-null).
    let remote = unsafe { *m.rma_iov };
    if remote.len != len {
        return -(errno::EINVAL as isize);
    }
    let op = if read {
        RmaOp::Read
    } else if op_flags & flags::REMOTE_CQ_DATA != 0 {
        RmaOp::WriteData(m.data as u32)
    } else {
        RmaOp::Write
    };
    let inject = !read && op_flags & flags::INJECT != 0;
    let a = rma_args(
        op,
        m.addr,
        buf,
        len,
        remote.addr,
        remote.key,
        m.context as usize,
        inject,
    );
    rma(ep, a, first_desc(m.desc, m.iov_count), Some(op_flags))
}

unsafe extern "C" fn rma_readmsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_rma,
    op_flags: u64,
) -> isize {
    guard_isize(|| rma_msg(ep, msg, op_flags, true))
}

unsafe extern "C" fn rma_write(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        let a = rma_args(
            RmaOp::Write,
            dest_addr,
            buf as usize,
            len,
            addr,
            key,
            context as usize,
            false,
        );
        rma(ep, a, desc, None)
    })
}

unsafe extern "C" fn rma_writev(
    ep: *mut sys::fid_ep,
    iov: *const sys::iovec,
    desc: *mut *mut c_void,
    count: usize,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        let (buf, len) = match iov_pairs(iov, count).and_then(|v| single(&v)) {
            Ok(x) => x,
            Err(e) => return -(e as isize),
        };
        let a = rma_args(
            RmaOp::Write,
            dest_addr,
            buf,
            len,
            addr,
            key,
            context as usize,
            false,
        );
        rma(ep, a, first_desc(desc, count), None)
    })
}

unsafe extern "C" fn rma_writemsg(
    ep: *mut sys::fid_ep,
    msg: *const sys::fi_msg_rma,
    op_flags: u64,
) -> isize {
    guard_isize(|| rma_msg(ep, msg, op_flags, false))
}

unsafe extern "C" fn rma_inject(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    guard_isize(|| {
        let a = rma_args(
            RmaOp::Write,
            dest_addr,
            buf as usize,
            len,
            addr,
            key,
            0,
            true,
        );
        rma(ep, a, std::ptr::null_mut(), None)
    })
}

unsafe extern "C" fn rma_writedata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    data: u64,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> isize {
    guard_isize(|| {
        let op = RmaOp::WriteData(data as u32);
        let a = rma_args(
            op,
            dest_addr,
            buf as usize,
            len,
            addr,
            key,
            context as usize,
            false,
        );
        rma(ep, a, desc, None)
    })
}

unsafe extern "C" fn rma_injectdata(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    data: u64,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
) -> isize {
    guard_isize(|| {
        let op = RmaOp::WriteData(data as u32);
        let a = rma_args(op, dest_addr, buf as usize, len, addr, key, 0, true);
        rma(ep, a, std::ptr::null_mut(), None)
    })
}

// ----- fi_atomic: not offered ---------------------------------------------

const NO_ATOMICS: isize = -(errno::ENOSYS as isize);

unsafe extern "C" fn atomic_write(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: usize,
    _: *mut c_void,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut c_void,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_writev(
    _: *mut sys::fid_ep,
    _: *const sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut c_void,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_writemsg(
    _: *mut sys::fid_ep,
    _: *const sys::fi_msg_atomic,
    _: u64,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_inject(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: usize,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_readwrite(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: usize,
    _: *mut c_void,
    _: *mut c_void,
    _: *mut c_void,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut c_void,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_readwritev(
    _: *mut sys::fid_ep,
    _: *const sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: *mut sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut c_void,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_readwritemsg(
    _: *mut sys::fid_ep,
    _: *const sys::fi_msg_atomic,
    _: *mut sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: u64,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_compwrite(
    _: *mut sys::fid_ep,
    _: *const c_void,
    _: usize,
    _: *mut c_void,
    _: *const c_void,
    _: *mut c_void,
    _: *mut c_void,
    _: *mut c_void,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut c_void,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_compwritev(
    _: *mut sys::fid_ep,
    _: *const sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: *const sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: *mut sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: sys::fi_addr_t,
    _: u64,
    _: u64,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut c_void,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_compwritemsg(
    _: *mut sys::fid_ep,
    _: *const sys::fi_msg_atomic,
    _: *const sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: *mut sys::fi_ioc,
    _: *mut *mut c_void,
    _: usize,
    _: u64,
) -> isize {
    NO_ATOMICS
}

unsafe extern "C" fn atomic_valid(
    _: *mut sys::fid_ep,
    _: sys::fi_datatype,
    _: sys::fi_op,
    _: *mut usize,
) -> c_int {
    -errno::EOPNOTSUPP
}

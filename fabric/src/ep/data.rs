//! The message calls of an endpoint (`fi_msg`, `fi_tagged`) and the paths
//! every data call shares: each reads its arguments, checks the endpoint is
//! enabled, and hands the operation to the domain's transport.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

use super::enabled_ep;
use crate::flags::{self, errno};
use crate::info::IOV_LIMIT;
use crate::matching::PostedRecv;
use crate::transport::{RmaArgs, SendArgs};
use crate::{guard_isize, sys};

pub(super) static MSG_OPS: sys::fi_ops_msg = sys::fi_ops_msg {
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

pub(super) static TAGGED_OPS: sys::fi_ops_tagged = sys::fi_ops_tagged {
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

// ----- Shared paths of the data calls -------------------------------------

/// `(address, length)` pairs of an iovec array.
pub(super) fn iov_pairs(iov: *const sys::iovec, count: usize) -> Result<Vec<(usize, usize)>, i32> {
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

impl Send {
    /// A send of `iov` to `dest` with the endpoint's default flags.
    fn new(iov: Vec<(usize, usize)>, dest: u64, context: usize) -> Send {
        Send {
            iov,
            dest,
            tag: None,
            data: None,
            context,
            op_flags: None,
            inject: false,
        }
    }
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

impl Recv {
    /// An untagged receive into `iov` from `src` with the endpoint's
    /// default flags.
    fn new(iov: Vec<(usize, usize)>, src: u64, context: usize) -> Recv {
        Recv {
            iov,
            src,
            tag: 0,
            ignore: 0,
            tagged: false,
            context,
            op_flags: None,
        }
    }
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

pub(super) fn rma(
    ep: *mut sys::fid_ep,
    args: RmaArgs,
    desc: *mut c_void,
    op_flags: Option<u64>,
) -> isize {
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
    guard_isize(|| recv(ep, Recv::new(one(buf, len), src_addr, context as usize)))
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
        Ok(iov) => recv(ep, Recv::new(iov, src_addr, context as usize)),
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
                    op_flags: Some(op_flags),
                    ..Recv::new(iov, m.addr, m.context as usize)
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
    guard_isize(|| send(ep, Send::new(one(buf, len), dest_addr, context as usize)))
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
        Ok(iov) => send(ep, Send::new(iov, dest_addr, context as usize)),
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
                    data: (op_flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data),
                    op_flags: Some(op_flags),
                    ..Send::new(iov, m.addr, m.context as usize)
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
                inject: true,
                ..Send::new(one(buf, len), dest_addr, 0)
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
                data: Some(data),
                ..Send::new(one(buf, len), dest_addr, context as usize)
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
                data: Some(data),
                inject: true,
                ..Send::new(one(buf, len), dest_addr, 0)
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
                tag,
                ignore,
                tagged: true,
                ..Recv::new(one(buf, len), src_addr, context as usize)
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
                tag,
                ignore,
                tagged: true,
                ..Recv::new(iov, src_addr, context as usize)
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
                    tag: m.tag,
                    ignore: m.ignore,
                    tagged: true,
                    op_flags: Some(op_flags),
                    ..Recv::new(iov, m.addr, m.context as usize)
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
                tag: Some(tag),
                ..Send::new(one(buf, len), dest_addr, context as usize)
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
                tag: Some(tag),
                ..Send::new(iov, dest_addr, context as usize)
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
                    tag: Some(m.tag),
                    data: (op_flags & flags::REMOTE_CQ_DATA != 0).then_some(m.data),
                    op_flags: Some(op_flags),
                    ..Send::new(iov, m.addr, m.context as usize)
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
                tag: Some(tag),
                inject: true,
                ..Send::new(one(buf, len), dest_addr, 0)
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
                tag: Some(tag),
                data: Some(data),
                ..Send::new(one(buf, len), dest_addr, context as usize)
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
                tag: Some(tag),
                data: Some(data),
                inject: true,
                ..Send::new(one(buf, len), dest_addr, 0)
            },
        )
    })
}

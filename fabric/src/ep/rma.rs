//! The RMA calls of an endpoint (`fi_rma`: WRITE, WRITE with remote CQ
//! data, READ) and `fi_atomic`, which only refuses.

use std::ffi::{c_int, c_void};

use super::data::{iov_pairs, rma};
use crate::flags::{self, errno};
use crate::transport::{RmaArgs, RmaOp};
use crate::{guard_isize, sys};

pub(super) static RMA_OPS: sys::fi_ops_rma = sys::fi_ops_rma {
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

pub(super) static ATOMIC_OPS: sys::fi_ops_atomic = sys::fi_ops_atomic {
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

/// An entry point of `fi_ops_atomic` that only refuses (each has its own C
/// signature, so each needs its own function).
macro_rules! refuse {
    ($name:ident, $ret:ty, $value:expr, ($($arg:ty),* $(,)?)) => {
        unsafe extern "C" fn $name($(_: $arg),*) -> $ret {
            $value
        }
    };
}

type Ep_ = *mut sys::fid_ep;
type Buf = *const c_void;
type Desc = *mut c_void;
type Ioc = *const sys::fi_ioc;
type IocOut = *mut sys::fi_ioc;
type Descs = *mut *mut c_void;
type Addr = sys::fi_addr_t;
type Dt = sys::fi_datatype;
type AOp = sys::fi_op;
type Ctx = *mut c_void;
type AMsg = *const sys::fi_msg_atomic;

refuse!(
    atomic_write,
    isize,
    NO_ATOMICS,
    (Ep_, Buf, usize, Desc, Addr, u64, u64, Dt, AOp, Ctx)
);
refuse!(
    atomic_writev,
    isize,
    NO_ATOMICS,
    (Ep_, Ioc, Descs, usize, Addr, u64, u64, Dt, AOp, Ctx)
);
refuse!(atomic_writemsg, isize, NO_ATOMICS, (Ep_, AMsg, u64));
refuse!(
    atomic_inject,
    isize,
    NO_ATOMICS,
    (Ep_, Buf, usize, Addr, u64, u64, Dt, AOp)
);
refuse!(
    atomic_readwrite,
    isize,
    NO_ATOMICS,
    (Ep_, Buf, usize, Desc, Desc, Desc, Addr, u64, u64, Dt, AOp, Ctx)
);
refuse!(
    atomic_readwritev,
    isize,
    NO_ATOMICS,
    (Ep_, Ioc, Descs, usize, IocOut, Descs, usize, Addr, u64, u64, Dt, AOp, Ctx)
);
refuse!(
    atomic_readwritemsg,
    isize,
    NO_ATOMICS,
    (Ep_, AMsg, IocOut, Descs, usize, u64)
);
refuse!(
    atomic_compwrite,
    isize,
    NO_ATOMICS,
    (Ep_, Buf, usize, Desc, Buf, Desc, Desc, Desc, Addr, u64, u64, Dt, AOp, Ctx)
);
refuse!(
    atomic_compwritev,
    isize,
    NO_ATOMICS,
    (
        Ep_, Ioc, Descs, usize, Ioc, Descs, usize, IocOut, Descs, usize, Addr, u64, u64, Dt, AOp,
        Ctx
    )
);
refuse!(
    atomic_compwritemsg,
    isize,
    NO_ATOMICS,
    (Ep_, AMsg, Ioc, Descs, usize, IocOut, Descs, usize, u64)
);
refuse!(
    atomic_valid,
    c_int,
    -errno::EOPNOTSUPP,
    (Ep_, Dt, AOp, *mut usize)
);

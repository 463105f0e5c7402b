//! libfabric's flag bits and error numbers as the types the provider uses
//! (bindgen gives each macro the smallest type that holds its value).

use crate::sys;

macro_rules! bits {
    ($($name:ident = $value:expr;)*) => { $(pub const $name: u64 = $value as u64;)* };
}

bits! {
    MSG = sys::FI_MSG;
    RMA = sys::FI_RMA;
    TAGGED = sys::FI_TAGGED;
    ATOMIC = sys::FI_ATOMIC;
    READ = sys::FI_READ;
    WRITE = sys::FI_WRITE;
    RECV = sys::FI_RECV;
    SEND = sys::FI_SEND;
    TRANSMIT = sys::FI_TRANSMIT;
    REMOTE_READ = sys::FI_REMOTE_READ;
    REMOTE_WRITE = sys::FI_REMOTE_WRITE;
    MULTI_RECV = sys::FI_MULTI_RECV;
    REMOTE_CQ_DATA = sys::FI_REMOTE_CQ_DATA;
    MORE = sys::FI_MORE;
    PEEK = sys::FI_PEEK;
    FENCE = sys::FI_FENCE;
    COMPLETION = sys::FI_COMPLETION;
    EVENT = sys::FI_EVENT;
    INJECT = sys::FI_INJECT;
    INJECT_COMPLETE = sys::FI_INJECT_COMPLETE;
    TRANSMIT_COMPLETE = sys::FI_TRANSMIT_COMPLETE;
    DELIVERY_COMPLETE = sys::FI_DELIVERY_COMPLETE;
    LOCAL_COMM = sys::FI_LOCAL_COMM;
    REMOTE_COMM = sys::FI_REMOTE_COMM;
    SOURCE = sys::FI_SOURCE;
    DIRECTED_RECV = sys::FI_DIRECTED_RECV;
    CLAIM = sys::FI_CLAIM;
    DISCARD = sys::FI_DISCARD;
    SELECTIVE_COMPLETION = sys::FI_SELECTIVE_COMPLETION;
    RMA_EVENT = sys::FI_RMA_EVENT;
    PROV_ATTR_ONLY = sys::FI_PROV_ATTR_ONLY;
    NUMERICHOST = sys::FI_NUMERICHOST;
}

/// `FI_ADDR_UNSPEC` and `FI_ADDR_NOTAVAIL`: `((uint64_t) -1)`.
pub const ADDR_UNSPEC: u64 = u64::MAX;
pub const ADDR_NOTAVAIL: u64 = u64::MAX;
/// `FI_KEY_NOTAVAIL`.
pub const KEY_NOTAVAIL: u64 = u64::MAX;

/// The libfabric API version the provider implements: the structures of
/// the 1.17 headers it is built against.
pub const API_VERSION: u32 = fi_version(sys::FI_MAJOR_VERSION, sys::FI_MINOR_VERSION);
/// The provider's own version.
pub const PROVIDER_VERSION: u32 = fi_version(0, 1);

/// `FI_VERSION(major, minor)`.
pub const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// libfabric error numbers (positive, as in `fi_errno.h`).
pub mod errno {
    use crate::sys;
    macro_rules! codes {
        ($($name:ident = $value:expr;)*) => { $(pub const $name: i32 = $value as i32;)* };
    }
    codes! {
        EIO = sys::FI_EIO;
        EBADF = sys::FI_EBADF;
        EAGAIN = sys::FI_EAGAIN;
        ENOMEM = sys::FI_ENOMEM;
        EACCES = sys::FI_EACCES;
        EBUSY = sys::FI_EBUSY;
        ENODEV = sys::FI_ENODEV;
        EINVAL = sys::FI_EINVAL;
        ENOSYS = sys::FI_ENOSYS;
        ENOMSG = sys::FI_ENOMSG;
        ENODATA = sys::FI_ENODATA;
        EMSGSIZE = sys::FI_EMSGSIZE;
        EOPNOTSUPP = sys::FI_EOPNOTSUPP;
        EADDRINUSE = sys::FI_EADDRINUSE;
        EADDRNOTAVAIL = sys::FI_EADDRNOTAVAIL;
        ENOENT = sys::FI_ENOENT;
        ETIMEDOUT = sys::FI_ETIMEDOUT;
        ECONNREFUSED = sys::FI_ECONNREFUSED;
        EHOSTUNREACH = sys::FI_EHOSTUNREACH;
        ECONNABORTED = sys::FI_ECONNABORTED;
        EREMOTEIO = sys::FI_EREMOTEIO;
        ECANCELED = sys::FI_ECANCELED;
        EKEYREJECTED = sys::FI_EKEYREJECTED;
        ETOOSMALL = sys::FI_ETOOSMALL;
        EAVAIL = sys::FI_EAVAIL;
        EBADFLAGS = sys::FI_EBADFLAGS;
        ETRUNC = sys::FI_ETRUNC;
        ENOKEY = sys::FI_ENOKEY;
        ENOAV = sys::FI_ENOAV;
        ENORX = sys::FI_ENORX;
        ENOCQ = sys::FI_ENOCQ;
    }
}

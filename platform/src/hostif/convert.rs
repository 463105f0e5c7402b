//! Between the ABI's entries (`metaroce_abi`) and the core's types: the
//! only place that knows both. Work entries are decoded here (an unknown
//! opcode, flags or a bad length is refused with the ABI status the spec
//! names, spec 6.7); completions and statuses are encoded here.

use metaroce_abi as abi;
use metaroce_core::api::{
    Completion, LocalBuf, Op, Opcode, PeerAddr, RecvRequest, Status, WorkRequest,
};
use metaroce_core::wire::MemoryTarget;
use smoltcp::wire::{IpAddress, Ipv4Address, Ipv6Address};

/// A send-queue entry as the core wants it, or the status refusing it.
pub fn work_request(e: &abi::SendWqe) -> Result<WorkRequest, u8> {
    if e.flags != 0 {
        return Err(abi::STATUS_INVALID_REQUEST);
    }
    let remote = MemoryTarget {
        key: e.rkey,
        addr: e.raddr,
    };
    let op = match e.opcode {
        abi::OP_WRITE => Op::Write { remote },
        abi::OP_WRITE_IMM => Op::WriteImm { remote, imm: e.imm },
        abi::OP_SEND => Op::Send,
        abi::OP_SEND_IMM => Op::SendImm { imm: e.imm },
        abi::OP_READ => Op::Read { remote },
        _ => return Err(abi::STATUS_BAD_OPCODE),
    };
    let needs_bytes = matches!(op, Op::Write { .. } | Op::WriteImm { .. } | Op::Read { .. });
    if e.length > abi::MAX_MESSAGE || (needs_bytes && e.length == 0) {
        return Err(abi::STATUS_BAD_LENGTH);
    }
    Ok(WorkRequest {
        id: e.wr_id,
        op,
        local: LocalBuf {
            key: e.lkey,
            addr: e.laddr,
            len: e.length,
        },
    })
}

/// A receive-queue entry as the core wants it, or the status refusing it.
pub fn recv_request(e: &abi::RecvWqe) -> Result<RecvRequest, u8> {
    if e.length > abi::MAX_MESSAGE {
        return Err(abi::STATUS_BAD_LENGTH);
    }
    Ok(RecvRequest {
        id: e.wr_id,
        local: LocalBuf {
            key: e.lkey,
            addr: e.laddr,
            len: e.length,
        },
    })
}

/// The ABI opcode a send-queue entry completes with.
pub fn wqe_opcode(opcode: u8) -> u8 {
    match opcode {
        abi::OP_SEND_IMM => abi::OP_SEND,
        other => other,
    }
}

/// The ABI code of a core completion status.
pub fn status(s: Status) -> u8 {
    match s {
        Status::Success => abi::STATUS_SUCCESS,
        Status::LocalProtection => abi::STATUS_LOCAL_PROTECTION,
        Status::RemoteInvalidKey => abi::STATUS_REMOTE_INVALID_KEY,
        Status::RemoteAccess => abi::STATUS_REMOTE_ACCESS,
        Status::RemoteBounds => abi::STATUS_REMOTE_BOUNDS,
        Status::RemoteProtocol => abi::STATUS_REMOTE_PROTOCOL,
        Status::ReceiveTooSmall => abi::STATUS_RECEIVE_TOO_SMALL,
        Status::RetryExceeded => abi::STATUS_RETRY_EXCEEDED,
        Status::ReceiverNotReadyExceeded => abi::STATUS_RNR_EXCEEDED,
        Status::Flushed => abi::STATUS_FLUSHED,
    }
}

/// The ABI completion of a core completion on connection `(index, generation)`.
pub fn cqe(c: &Completion, index: u32, generation: u32) -> abi::Cqe {
    let opcode = match c.opcode {
        Opcode::Write => abi::OP_WRITE,
        Opcode::WriteImm => abi::OP_WRITE_IMM,
        Opcode::Send => abi::OP_SEND,
        Opcode::Read => abi::OP_READ,
        Opcode::Recv => abi::OP_RECV,
        Opcode::RecvWriteImm => abi::OP_RECV_WRITE_IMM,
    };
    abi::Cqe {
        wr_id: c.wr_id,
        conn_index: index,
        conn_generation: generation,
        byte_len: c.byte_len,
        imm: c.imm.unwrap_or(0),
        reserved: 0,
        opcode,
        status: status(c.status),
        flags: if c.imm.is_some() {
            abi::CQE_FLAG_IMM
        } else {
            0
        },
        owner: 0,
    }
}

/// A peer address from an admin command's IP (IPv4-mapped or IPv6) and port.
pub fn peer_addr(ip: &[u8; 16], port: u16) -> PeerAddr {
    let ip = match abi::ipv4_of_mapped(ip) {
        Some(v4) => IpAddress::Ipv4(Ipv4Address::from(v4)),
        None => IpAddress::Ipv6(Ipv6Address::from(*ip)),
    };
    PeerAddr { ip, port }
}

/// The ABI form (IPv4-mapped IPv6) of a peer's IP address.
pub fn ip_bytes(ip: &IpAddress) -> [u8; 16] {
    match ip {
        IpAddress::Ipv4(v4) => abi::ipv4_mapped(v4.octets()),
        IpAddress::Ipv6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_opcodes_flags_and_lengths_are_refused() {
        let good = abi::SendWqe {
            opcode: abi::OP_WRITE,
            length: 8,
            ..abi::SendWqe::default()
        };
        assert!(work_request(&good).is_ok());
        let e = abi::SendWqe { opcode: 99, ..good };
        assert_eq!(work_request(&e), Err(abi::STATUS_BAD_OPCODE));
        let e = abi::SendWqe { flags: 1, ..good };
        assert_eq!(work_request(&e), Err(abi::STATUS_INVALID_REQUEST));
        let e = abi::SendWqe { length: 0, ..good };
        assert_eq!(work_request(&e), Err(abi::STATUS_BAD_LENGTH));
        let e = abi::SendWqe {
            length: abi::MAX_MESSAGE + 1,
            ..good
        };
        assert_eq!(work_request(&e), Err(abi::STATUS_BAD_LENGTH));
        let e = abi::SendWqe {
            opcode: abi::OP_SEND,
            length: 0,
            ..good
        };
        assert!(work_request(&e).is_ok(), "an empty SEND is fine");
    }

    #[test]
    fn addresses_round_trip() {
        let p = peer_addr(&abi::ipv4_mapped([198, 18, 0, 2]), 4795);
        assert_eq!(p.ip, IpAddress::Ipv4(Ipv4Address::new(198, 18, 0, 2)));
        assert_eq!(ip_bytes(&p.ip), abi::ipv4_mapped([198, 18, 0, 2]));
    }
}

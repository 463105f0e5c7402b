//! The layout of every ABI structure as data ([`LAYOUTS`]), taken from the
//! compiler (`offset_of!`, `size_of`), with the sizes and offsets the
//! specification fixes asserted at compile time. The spec-consistency test
//! compares the tables of `docs/spec/06-host-interface.md` with [`LAYOUTS`].

use core::mem::{offset_of, size_of};

use crate::{
    AdminCmd, AdminCqe, Cqe, DeviceHeader, DeviceIndices, Doorbell, DoorbellLine, DoorbellPage,
    QueueSetHeader, QuotaCmd, QuotaValues, RecvWqe, SendWqe, SetCounters, SetQuota,
};

/// One field: its name, byte offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldLayout {
    pub name: &'static str,
    pub offset: usize,
    pub size: usize,
}

/// One structure: its C name, size and fields in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StructLayout {
    pub c_name: &'static str,
    pub size: usize,
    pub fields: &'static [FieldLayout],
}

/// The size of the field a projection names (never called).
const fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! layout {
    ($ty:ident as $c:literal { $($field:ident),* $(,)? }) => {
        StructLayout {
            c_name: $c,
            size: size_of::<$ty>(),
            fields: &[$(FieldLayout {
                name: stringify!($field),
                offset: offset_of!($ty, $field),
                size: field_size(|s: &$ty| &s.$field),
            }),*],
        }
    };
}

/// Every ABI structure, in the order of the specification.
pub const LAYOUTS: &[StructLayout] = &[
    layout!(DeviceHeader as "mr_device_header" {
        magic, abi_major, abi_minor, features, state, queue_sets, shm_len, set_offset,
        set_stride, data_offset, data_len, heartbeat, ipv4, udp_port, node, max_message,
        max_regions, max_connections, reserved0, reserved,
    }),
    layout!(QueueSetHeader as "mr_queue_set_header" {
        owner, state, index, pd, window_offset, window_len, sq_offset, sq_depth, rq_offset,
        rq_depth, cq_offset, cq_depth, aq_offset, aq_depth, acq_offset, acq_depth,
        doorbell_offset, indices_offset, counters_offset, quota_offset, reserved,
    }),
    layout!(Doorbell as "mr_doorbell" { index, rings }),
    layout!(DoorbellLine as "mr_doorbell_line" { bell, reserved }),
    layout!(DoorbellPage as "mr_doorbell_page" { sq, rq, cq, aq, acq }),
    layout!(DeviceIndices as "mr_device_indices" {
        sq_consumer, rq_consumer, aq_consumer, reserved0, reserved,
    }),
    layout!(SetCounters as "mr_set_counters" {
        posted_sends, posted_recvs, completions, admin_commands, events, refused_bad_opcode,
        refused_bad_length, refused_bad_connection, refused_bad_address, refused_not_permitted,
        refused_invalid, bad_producer_index, spurious_doorbells, cq_overflow, events_lost,
        transport_retransmissions, transport_timeouts, transport_packets_sent,
        transport_packets_received, transport_bytes_sent, transport_bytes_received,
        transport_ce_received, device_rx_frames, device_tx_frames, device_dma_faults,
        device_rate_hint_mbps, transport_max_in_flight, refused_no_resources, refused_bad_key,
        refused_quota, reserved,
    }),
    layout!(QuotaValues as "mr_quota_values" {
        connections, regions, region_bytes, work_entries, commands, reserved,
    }),
    layout!(SetQuota as "mr_set_quota" { limit, used, refused, reserved }),
    layout!(SendWqe as "mr_send_wqe" {
        wr_id, conn_index, conn_generation, opcode, flags, reserved0, imm, lkey, length, laddr,
        raddr, rkey, reserved1, reserved2,
    }),
    layout!(RecvWqe as "mr_recv_wqe" { wr_id, conn_index, conn_generation, lkey, length, laddr }),
    layout!(Cqe as "mr_cqe" {
        wr_id, conn_index, conn_generation, byte_len, imm, reserved, opcode, status, flags, owner,
    }),
    layout!(AdminCmd as "mr_admin_cmd" {
        tag, opcode, flags, reserved0, access, conn_index, conn_generation, addr, len, key, port,
        reserved1, ip,
    }),
    layout!(AdminCqe as "mr_admin_cqe" {
        tag, conn_index, conn_generation, value, ip, port, reserved0, detail, reserved1, kind,
        status, opcode, owner,
    }),
    layout!(QuotaCmd as "mr_quota_cmd" {
        tag, opcode, flags, reserved0, set, connections, regions, region_bytes, work_entries,
        commands, reserved1,
    }),
];

// The sizes the specification fixes.
const _: () = assert!(size_of::<DeviceHeader>() == 256);
const _: () = assert!(size_of::<QueueSetHeader>() == 256);
const _: () = assert!(size_of::<Doorbell>() == 8);
const _: () = assert!(size_of::<DoorbellLine>() == 64);
const _: () = assert!(size_of::<DoorbellPage>() == 320);
const _: () = assert!(size_of::<DeviceIndices>() == 64);
const _: () = assert!(size_of::<SetCounters>() == 256);
const _: () = assert!(size_of::<SendWqe>() == 64);
const _: () = assert!(size_of::<RecvWqe>() == 32);
const _: () = assert!(size_of::<Cqe>() == 32);
const _: () = assert!(size_of::<AdminCmd>() == 64);
const _: () = assert!(size_of::<AdminCqe>() == 64);
const _: () = assert!(size_of::<QuotaValues>() == 64);
const _: () = assert!(size_of::<SetQuota>() == 256);
const _: () = assert!(size_of::<QuotaCmd>() == size_of::<AdminCmd>());

// The offsets the protocol relies on: the published last words, the
// fields each side reads first.
const _: () = assert!(offset_of!(Cqe, opcode) == crate::CQE_LAST_WORD);
const _: () = assert!(offset_of!(Cqe, owner) == crate::CQE_LAST_WORD + 3);
const _: () = assert!(offset_of!(AdminCqe, kind) == crate::ADMIN_CQE_LAST_WORD);
const _: () = assert!(offset_of!(AdminCqe, owner) == crate::ADMIN_CQE_LAST_WORD + 3);
const _: () = assert!(offset_of!(DeviceHeader, state) == 16);
const _: () = assert!(offset_of!(DeviceHeader, heartbeat) == 64);
const _: () = assert!(offset_of!(QueueSetHeader, owner) == 0);
const _: () = assert!(offset_of!(SendWqe, opcode) == 16);
const _: () = assert!(offset_of!(SendWqe, laddr) == 32);
const _: () = assert!(offset_of!(SendWqe, raddr) == 40);
const _: () = assert!(offset_of!(DoorbellPage, acq) == 256);
const _: () = assert!(offset_of!(AdminCmd, ip) == 48);
const _: () = assert!(offset_of!(AdminCqe, ip) == 24);
// SET_QUOTA shares the admin queue: the same tag and opcode, and limits in
// the order of `QuotaValues` (the device reads them as one array).
const _: () = assert!(offset_of!(QuotaCmd, opcode) == offset_of!(AdminCmd, opcode));
const _: () = assert!(offset_of!(QuotaCmd, flags) == offset_of!(AdminCmd, flags));
const _: () = assert!(offset_of!(QuotaCmd, set) == 12);
const _: () = assert!(offset_of!(QuotaCmd, connections) == 16);
const _: () = assert!(offset_of!(QuotaCmd, commands) == 48);
const _: () = assert!(offset_of!(QuotaValues, commands) == 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_tile_each_structure_without_gaps() {
        for s in LAYOUTS {
            let mut at = 0;
            for f in s.fields {
                assert_eq!(f.offset, at, "{}.{} leaves a gap", s.c_name, f.name);
                at += f.size;
            }
            assert_eq!(at, s.size, "{} has trailing bytes", s.c_name);
        }
    }
}

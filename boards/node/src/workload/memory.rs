//! Where the workload's buffers are in its host memory, and the bytes it
//! puts there: message patterns and control messages.

use metaroce_app as app;
use metaroce_platform::dma::HostWindow;

use metaroce_board::Board;

use crate::config::{NodeConfig, MAX_STREAMS};
use crate::hw::ThisBoard;

/// Where the board's host memory (its DMA window) sits in the host
/// address space.
pub const HOST_BASE: u64 = <ThisBoard as Board>::HOST_MEMORY_BASE;
/// Bytes of host memory.
pub const HOST_MEMORY_LEN: usize = <ThisBoard as Board>::HOST_MEMORY_LEN;
/// Most connections one task accepts (a core of a multi-core node may be
/// handed every incoming connection of its node).
pub const MAX_SLOTS: usize = 48;

/// The control messages' buffers, 64 bytes apart, at the start of host
/// memory: the streams' hello receives and done sends, the slots' done
/// receives and hello sends.
pub(super) const CTRL_LEN: u64 = 64 * 1024;
pub(super) const CTRL_STRIDE: u64 = 64;
pub(super) const HELLO_RECV: u64 = HOST_BASE;
pub(super) const DONE_RECV: u64 = HOST_BASE + 0x1000;
pub(super) const HELLO_SEND: u64 = HOST_BASE + 0x2000;
pub(super) const DONE_SEND: u64 = HOST_BASE + 0x3000;
const _: () = assert!(MAX_SLOTS as u64 * CTRL_STRIDE <= 0x1000);
const _: () = assert!(MAX_STREAMS as u64 * CTRL_STRIDE <= 0x1000);
const _: () = assert!(DONE_SEND + 0x1000 <= HOST_BASE + CTRL_LEN);
/// Addresses of every buffer. What a peer writes or reads comes first
/// (READ sources, WRITE targets), at addresses that depend only on `size`
/// and `count`, which every node shares; then this task's own areas, sized
/// by its streams and slots.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub size: u64,
    pub count: u64,
    pub read_source: u64,
    pub write_sink: u64,
    pub recv_bufs: u64,
    pub src: u64,
    pub read_sink: u64,
}

impl Layout {
    pub fn new(cfg: &NodeConfig, memory_len: usize) -> Option<Layout> {
        let size = u64::from(cfg.size);
        let count = u64::from(cfg.count);
        let area = size.checked_mul(count)?;
        let slots = u64::from(cfg.expect.max(1));
        let streams = u64::from(cfg.streams.max(1));
        let read_source = HOST_BASE + CTRL_LEN;
        let write_sink = read_source + area;
        let recv_bufs = write_sink + area.checked_mul(slots)?;
        let src = recv_bufs + area.checked_mul(slots)?;
        let read_sink = src + area.checked_mul(streams)?;
        let end = read_sink + area.checked_mul(streams)?;
        (end - HOST_BASE <= memory_len as u64).then_some(Layout {
            size,
            count,
            read_source,
            write_sink,
            recv_bufs,
            src,
            read_sink,
        })
    }

    /// Message `i` of area `index` (a slot or a stream) from `base`.
    pub fn at(&self, base: u64, index: usize, i: u32) -> u64 {
        base + index as u64 * self.size * self.count + u64::from(i) * self.size
    }
}

/// The pattern of message `i` that `receiver`'s slot `slot` receives
/// (`metaroce_app`'s, as the serve role's): the seed here, the message
/// index there.
pub(super) fn pattern_seed(seed: u64, receiver: u8, slot: u64) -> u64 {
    seed ^ (u64::from(receiver) << 56) ^ (slot << 40)
}

/// Fills `[addr, addr + len)` with message `i`'s pattern under `seed`.
pub(super) fn fill_pattern(
    mem: &mut HostWindow<'_>,
    addr: u64,
    len: u64,
    seed: u64,
    i: u32,
) -> bool {
    let Ok(bytes) = mem.slice_mut(addr, len as usize) else {
        return false;
    };
    app::fill_pattern(seed, u64::from(i), bytes);
    true
}

/// Whether `[addr, addr + len)` holds message `i`'s pattern under `seed`.
pub(super) fn matches_pattern(
    mem: &HostWindow<'_>,
    addr: u64,
    len: u64,
    seed: u64,
    i: u32,
) -> bool {
    mem.slice(addr, len as usize)
        .is_ok_and(|bytes| app::check_pattern(seed, u64::from(i), bytes))
}

pub(super) fn put_u32s(mem: &mut HostWindow<'_>, addr: u64, words: [u32; 4]) {
    if let Ok(bytes) = mem.slice_mut(addr, 16) {
        for (chunk, w) in bytes.chunks_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_be_bytes());
        }
    }
}

pub(super) fn get_u32s(mem: &HostWindow<'_>, addr: u64) -> Option<[u32; 4]> {
    let bytes = mem.slice(addr, 16).ok()?;
    let mut words = [0u32; 4];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks(4)) {
        *w = u32::from_be_bytes(chunk.try_into().ok()?);
    }
    Some(words)
}

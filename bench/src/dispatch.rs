//! Cost of the multi-core frame dispatcher (`metaroce_platform::shard`):
//! per frame, what the core that owns the network device pays to steer a
//! received frame into the owning core's ring (classify, look up the
//! owner, copy the frame into the ring slot), and to move a frame a core
//! queued onto the device. QEMU's firmware runs this on core 0 for every
//! frame of the node; on a NIC that steers in hardware (Elba's per-core
//! rings) nobody pays it.
//!
//! The device is a stand-in that costs nothing: [`Replay`] lends the same
//! prepared frames again and again on receive and discards on transmit
//! after a copy into its slot (as a DMA ring slot would be written), so
//! the time is the dispatcher's and the rings'.

use std::hint::black_box;

use metaroce_core::wire::{Body, EncapRepr, Flags, Header, IpPair, Repr, DEFAULT_UDP_PORT};
use metaroce_platform::device::{MemFrameDevice, MemLink, FRAME_SLOT_LEN};
use metaroce_platform::shard::{Dispatcher, ShardMap};
use metaroce_platform::FrameDevice;
use smoltcp::wire::{EthernetAddress, Ipv4Address};

use crate::measure::{self, Row, Sample};

/// Cores the frames are spread over.
pub const CORES: usize = 4;
/// Payload bytes per frame: the QEMU firmware's MTU.
pub const PAYLOAD_LEN: usize = 1024;
const RING: usize = 256;
const BATCH: u32 = 32;

/// A device that receives prepared frames in turn and accepts every
/// transmit into one slot.
struct Replay {
    frames: Vec<Vec<u8>>,
    next: usize,
    slot: Box<[u8; FRAME_SLOT_LEN]>,
}

impl FrameDevice for Replay {
    fn max_frame_len(&self) -> usize {
        FRAME_SLOT_LEN
    }

    fn receive<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let frame = &self.frames[self.next];
        self.next = (self.next + 1) % self.frames.len();
        Some(f(black_box(frame)))
    }

    fn transmit_ready(&mut self) -> bool {
        true
    }

    fn transmit<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let r = f(&mut self.slot[..len]);
        black_box(&self.slot[..]);
        Some(r)
    }
}

/// A WRITE-sized data frame (1024 B payload) to connection `dst_conn`.
fn data_frame(dst_conn: u32) -> Vec<u8> {
    let repr = Repr {
        header: Header {
            flags: Flags::NONE,
            dst_conn,
            token: 1,
            psn: 1,
            path: 0,
            timestamp: 0,
        },
        body: Body::Keepalive,
        payload_len: 0,
    };
    let mut packet = vec![0u8; repr.buffer_len() + PAYLOAD_LEN];
    let header_len = repr.buffer_len();
    repr.emit(&mut packet[..header_len], &[]);
    let encap = EncapRepr {
        src_mac: EthernetAddress([2, 0, 0, 0, 0, 1]),
        dst_mac: EthernetAddress([2, 0, 0, 0, 0, 2]),
        ip: IpPair::V4 {
            src: Ipv4Address::new(198, 18, 0, 1),
            dst: Ipv4Address::new(198, 18, 0, 2),
        },
        src_port: 49152,
        dst_port: DEFAULT_UDP_PORT,
        dscp: 0,
        ecn: 0,
        hop_limit: 64,
    };
    let mut frame = vec![0u8; encap.frame_len(packet.len())];
    let _ = encap.emit(&mut frame, packet.len(), |t| t.copy_from_slice(&packet));
    frame
}

/// Nanoseconds per frame of one dispatcher direction, best of `repeats`.
fn sample(repeats: u32, mut round: impl FnMut(u64)) -> Sample {
    let mut samples = Vec::new();
    for _ in 0..repeats {
        samples.push(measure::timed(&mut round));
    }
    measure::best(&samples)
}

/// The dispatcher rows: steer only, receive (steer + copy into the
/// owner's ring), transmit (a core's queued frame onto the device), and a
/// memcpy of the same frame for scale.
pub fn rows(repeats: u32) -> Vec<Row> {
    // Ids as the sharded table makes them: 8 index bits, 16 slots a core.
    let map = ShardMap::new(8, 16, CORES).expect("valid split");
    let frames: Vec<Vec<u8>> = (0..64u32)
        .map(|i| data_frame(0x5a00_0000 | (i % 64)))
        .collect();
    let frame_len = frames[0].len();
    let links: Vec<MemLink<RING>> = (0..CORES).map(|_| MemLink::new()).collect();
    let (mut cores, mut rings): (Vec<MemFrameDevice<'_, RING>>, Vec<MemFrameDevice<'_, RING>>) =
        links.iter().map(|l| l.ends().expect("fresh link")).unzip();
    let mut device = Replay {
        frames: frames.clone(),
        next: 0,
        slot: Box::new([0; FRAME_SLOT_LEN]),
    };
    let mut dispatcher = Dispatcher::new(map, CORES, DEFAULT_UDP_PORT);

    let steer = sample(repeats, |iterations| {
        for i in 0..iterations {
            let frame = &frames[(i % 64) as usize];
            black_box(dispatcher.steer(black_box(frame)));
        }
    });
    let receive = sample(repeats, |iterations| {
        let mut left = iterations;
        while left > 0 {
            let n = left.min(u64::from(BATCH)) as u32;
            dispatcher.receive(&mut device, &mut rings, n);
            for core in cores.iter_mut() {
                while core.receive(|f| black_box(f.len())).is_some() {}
            }
            left -= u64::from(n);
        }
    });
    let transmit = sample(repeats, |iterations| {
        let mut left = iterations;
        while left > 0 {
            let n = left.min(u64::from(BATCH));
            for i in 0..n {
                let core = &mut cores[(i as usize) % CORES];
                // The engine writes its frame in place; a header-sized
                // write stands for it, so the copy timed is the device's.
                core.transmit(frame_len, |slot| slot[..64].fill(i as u8));
            }
            dispatcher.transmit(&mut device, &mut rings, n as u32);
            left -= n;
        }
    });
    let copy = measure::memcpy_sample(frame_len);
    let ns = |s: Sample| s.ns();
    vec![
        Row::new(
            "dispatch_steer_ns",
            ns(steer),
            "ns",
            format!("dispatcher: classify a {frame_len} B frame and find its core (ShardMap)"),
        ),
        Row::new(
            "dispatch_rx_ns_per_frame",
            ns(receive),
            "ns",
            format!("  receive: steer + copy into the owner's ring ({CORES} cores)"),
        ),
        Row::new(
            "dispatch_tx_ns_per_frame",
            ns(transmit),
            "ns",
            "  transmit: a core's queued frame onto the device (copy into the TX slot)",
        ),
        Row::new(
            "dispatch_memcpy_frame_ns",
            ns(copy),
            "ns",
            format!("  memcpy of one {frame_len} B frame, for scale"),
        ),
        Row::new(
            "dispatch_mpps",
            1000.0 / (ns(receive) + ns(transmit)).max(1e-3),
            "Mpps",
            "  frames one dispatching core moves per second, each in and out",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prepared_frame_steers_to_a_core() {
        let map = ShardMap::new(8, 16, CORES).unwrap();
        let mut d = Dispatcher::new(map, CORES, DEFAULT_UDP_PORT);
        for i in 0..64 {
            assert!(matches!(
                d.steer(&data_frame(0x5a00_0000 | i)),
                metaroce_platform::shard::Steer::Core(c) if c == (i / 16) as usize
            ));
        }
    }
}

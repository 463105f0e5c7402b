//! The bench role (`role=bench`): what the firmware's per-packet work
//! costs on this CPU, counted by the Performance Monitors Unit.
//!
//! It computes the CRC-32 trailer of a 4 KiB WRITE data packet (28-byte
//! common header, 24-byte WRITE extension, 4096 bytes of payload: 4148
//! bytes covered) exactly as the engine does for every packet it sends and
//! receives (`metaroce_core::wire::packet::crc32`), [`PACKETS`] times, and
//! prints one line on the console:
//!
//! ```text
//! METAROCE-BENCH crc32 bytes=4148 packets=2000 instructions_x10=... cycles_x10=... crc=1 aes=0 check=...
//! ```
//!
//! `instructions_x10` and `cycles_x10` are ten times the count per packet
//! (one decimal without floating point). `crc`/`aes` say which CPU features
//! the firmware was compiled for, so which code path crc32fast took
//! (table-driven, `crc32x` chains, or `PMULL` folding). `check` is the CRC
//! itself, so a wrong path cannot go unnoticed. Under QEMU with
//! `-icount shift=0` the instruction count is exact and the cycle count is
//! the same number (QEMU does not model the core's pipeline); on an Elba the
//! cycle count is the real one. `cargo xtask bench --firmware` runs it for
//! each CPU setting and prints the table.

use crate::hw;
use crate::println;

/// Packets per measurement: enough that the loop's own cost and the
/// counters' start/stop vanish in the average.
const PACKETS: u64 = 2000;
/// Bytes the trailer covers in a 4 KiB WRITE data packet.
const COVERED: usize = metaroce_core::wire::HEADER_LEN + 24 + 4096;

/// Runs the measurement and exits QEMU with status 0.
pub fn run() -> ! {
    let mut packet = [0u8; COVERED];
    for (i, byte) in packet.iter_mut().enumerate() {
        // Any pattern; not all zeros, so the CRC is not trivially constant.
        *byte = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    // Warm-up: page-table walks and the first touch of the tables.
    let mut check = metaroce_core::wire::packet::crc32(&[&packet]);
    hw::pmu_start();
    for i in 0..PACKETS {
        // A different packet each time (its PSN field), as in a real
        // stream, and the result kept, so nothing is hoisted out of the loop.
        packet[16..24].copy_from_slice(&i.to_be_bytes());
        check ^= metaroce_core::wire::packet::crc32(&[core::hint::black_box(&packet)]);
    }
    let counts = hw::pmu_read();
    println!(
        "METAROCE-BENCH crc32 bytes={} packets={} instructions_x10={} cycles_x10={} crc={} aes={} check={:08x}",
        COVERED,
        PACKETS,
        counts.instructions * 10 / PACKETS,
        counts.cycles * 10 / PACKETS,
        u8::from(cfg!(target_feature = "crc")),
        u8::from(cfg!(target_feature = "aes")),
        check
    );
    hw::exit(0)
}

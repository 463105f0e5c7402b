//! What a stream's completions and a slot's done message check: every
//! READ against the receiver's pattern, every byte a stream placed at the
//! receiver against the sender's.

use metaroce_core::api::{Completion, Opcode};
use metaroce_core::Instant;
use metaroce_platform::dma::HostWindow;

use super::memory::{get_u32s, matches_pattern, pattern_seed, CTRL_STRIDE, HELLO_RECV};
use super::{
    consumes_receive, op_of, target_node, Workload, DONE_WR, HELLO_MAGIC, HELLO_WR, READ_SOURCE,
};
use crate::println;

impl Workload<'_> {
    pub(super) fn on_stream_completion(
        &mut self,
        now: Instant,
        mem: &mut HostWindow<'_>,
        k: usize,
        c: &Completion,
        ok: bool,
    ) {
        let count = self.cfg.count;
        let size = self.cfg.size;
        let seed = self.cfg.seed;
        let receiver = target_node(&self.cfg, self.cfg.target.unwrap_or(0));
        let read_sink = self.layout.read_sink;
        let layout = self.layout;
        let node = self.cfg.node;
        let stream = &mut self.senders[k];
        match (c.opcode, c.wr_id) {
            (Opcode::Recv, HELLO_WR) => {
                if let Some([HELLO_MAGIC, slot, key, _]) =
                    get_u32s(mem, HELLO_RECV + CTRL_STRIDE * k as u64).filter(|_| ok)
                {
                    stream.slot = slot;
                    stream.remote_key = Some(key);
                    defmt::debug!(
                        "stream {=usize} hello: slot {=u32}, remote key {=u32:#x}",
                        k,
                        slot,
                        key
                    );
                }
            }
            (Opcode::Send, DONE_WR) => {
                stream.done = true;
                if !ok {
                    stream.failed += 1;
                }
            }
            (Opcode::Write | Opcode::WriteImm | Opcode::Send | Opcode::Read, i)
                if i < u64::from(count) =>
            {
                stream.completed += 1;
                self.last_data = Some(now);
                if !ok {
                    stream.failed += 1;
                    return;
                }
                stream.bytes += u64::from(size);
                if c.opcode == Opcode::Read {
                    let seed = pattern_seed(seed, receiver, READ_SOURCE);
                    let addr = layout.at(read_sink, k, i as u32);
                    if !matches_pattern(mem, addr, layout.size, seed, i as u32) {
                        stream.reads_bad += 1;
                        println!(
                            "METAROCE-WARN node={} stream={} read {} corrupt",
                            node, k, i
                        );
                    }
                }
            }
            _ => {}
        }
    }

    /// Checks every byte the stream of slot `s` placed.
    pub(super) fn verify_slot(&mut self, s: usize, mem: &HostWindow<'_>) {
        let l = self.layout;
        let mut bad = 0;
        let mut bytes = 0;
        let mut expected_receives = 0;
        for i in 0..self.cfg.count {
            let op = op_of(self.cfg.workload, i);
            let seed = pattern_seed(self.cfg.seed, self.cfg.node, s as u64);
            let addr = match op {
                Opcode::Write | Opcode::WriteImm => l.at(l.write_sink, s, i),
                Opcode::Send => l.at(l.recv_bufs, s, i),
                _ => continue,
            };
            expected_receives += u32::from(consumes_receive(op));
            if matches_pattern(mem, addr, l.size, seed, i) {
                bytes += l.size;
            } else {
                bad += 1;
                println!(
                    "METAROCE-WARN node={} slot={} message={} corrupt",
                    self.cfg.node, s, i
                );
            }
        }
        let slot = &mut self.slots[s];
        if slot.receives != expected_receives {
            println!(
                "METAROCE-WARN node={} slot={} receives={} expected={}",
                self.cfg.node, s, slot.receives, expected_receives
            );
            bad += 1;
        }
        slot.bad = bad + slot.failed;
        slot.bytes = bytes;
        defmt::debug!("slot {=usize} verified: {=u32} bad", s, slot.bad);
    }
}

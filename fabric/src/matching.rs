//! Receive matching: the application's posted receives against arriving
//! messages, and messages that arrived before a receive matched them
//! (unexpected messages, held by the provider, never refused).
//!
//! Untagged and tagged receives are two independent queues, as libfabric
//! defines them. Within a queue a message takes the first posted receive
//! that matches it, and a receive the first unexpected message that it
//! matches, so messages from one source are matched in the order they were
//! sent (`FI_ORDER_SAS`). A receive names a source (`FI_DIRECTED_RECV`) or
//! `FI_ADDR_UNSPEC`; a tagged receive matches `tag` under `ignore`.

use std::collections::VecDeque;

use crate::flags::ADDR_UNSPEC;

/// A receive the application posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostedRecv {
    /// `(address, length)` of each buffer, in order.
    pub iov: Vec<(usize, usize)>,
    /// The application's context, returned in the completion.
    pub context: usize,
    /// Source address (`fi_addr_t`) or `FI_ADDR_UNSPEC`.
    pub src: u64,
    pub tag: u64,
    pub ignore: u64,
    /// Whether a completion is written (selective completion).
    pub completion: bool,
}

impl PostedRecv {
    /// Bytes the buffers hold.
    pub fn capacity(&self) -> usize {
        self.iov.iter().map(|&(_, len)| len).sum()
    }

    /// Whether a message from `src` with `tag` matches (tags compare
    /// only for tagged receives; untagged ones post `ignore = !0`).
    pub fn matches(&self, src: u64, tag: u64) -> bool {
        (self.src == ADDR_UNSPEC || self.src == src) && (self.tag ^ tag) & !self.ignore == 0
    }
}

/// What a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// The payload itself.
    Eager(Vec<u8>),
    /// Where to READ it from (rendezvous).
    Rts {
        len: u64,
        key: u32,
        addr: u64,
        rndv_id: u32,
    },
}

impl Body {
    /// The message's length.
    pub fn len(&self) -> u64 {
        match self {
            Body::Eager(bytes) => bytes.len() as u64,
            Body::Rts { len, .. } => *len,
        }
    }

    /// Whether the message is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A message that arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The connection it came on (handle bits).
    pub conn: u64,
    pub tag: u64,
    /// Remote CQ data.
    pub data: Option<u32>,
    pub body: Body,
}

/// The two queues of one kind of receive (untagged or tagged).
#[derive(Debug, Default)]
pub struct Queue {
    posted: VecDeque<PostedRecv>,
    unexpected: VecDeque<Arrival>,
}

impl Queue {
    /// A message arrived from `src`: the receive it matches, removed from
    /// the posted queue, or `None` when it is held as unexpected.
    pub fn arrive(&mut self, arrival: Arrival, src: u64) -> Option<(PostedRecv, Arrival)> {
        match self.posted.iter().position(|p| p.matches(src, arrival.tag)) {
            Some(i) => {
                let posted = self.posted.remove(i).expect("position is in range");
                Some((posted, arrival))
            }
            None => {
                self.unexpected.push_back(arrival);
                None
            }
        }
    }

    /// The application posts `recv`: the first unexpected message it
    /// matches (`src_of` gives a connection's source address now), or
    /// `None` when it is queued.
    pub fn post(
        &mut self,
        recv: PostedRecv,
        src_of: impl Fn(u64) -> u64,
    ) -> Option<(PostedRecv, Arrival)> {
        match self.find_unexpected(recv.src, recv.tag, recv.ignore, &src_of) {
            Some(i) => {
                let arrival = self.unexpected.remove(i).expect("position is in range");
                Some((recv, arrival))
            }
            None => {
                self.posted.push_back(recv);
                None
            }
        }
    }

    /// Index of the first unexpected message a receive of `(src, tag,
    /// ignore)` would match.
    pub fn find_unexpected(
        &self,
        src: u64,
        tag: u64,
        ignore: u64,
        src_of: &impl Fn(u64) -> u64,
    ) -> Option<usize> {
        self.unexpected.iter().position(|a| {
            (src == ADDR_UNSPEC || src == src_of(a.conn)) && (tag ^ a.tag) & !ignore == 0
        })
    }

    /// The unexpected message at `i` (from [`Queue::find_unexpected`]).
    pub fn unexpected(&self, i: usize) -> Option<&Arrival> {
        self.unexpected.get(i)
    }

    /// Removes the unexpected message at `i`.
    pub fn take_unexpected(&mut self, i: usize) -> Option<Arrival> {
        self.unexpected.remove(i)
    }

    /// Removes the posted receive whose context is `context`.
    pub fn cancel(&mut self, context: usize) -> Option<PostedRecv> {
        let i = self.posted.iter().position(|p| p.context == context)?;
        self.posted.remove(i)
    }

    /// Removes every posted receive (the endpoint closes).
    pub fn drain_posted(&mut self) -> Vec<PostedRecv> {
        self.posted.drain(..).collect()
    }

    /// Receives posted and not yet matched.
    pub fn posted_len(&self) -> usize {
        self.posted.len()
    }

    /// Messages held as unexpected.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(src: u64, tag: u64, ignore: u64, context: usize) -> PostedRecv {
        PostedRecv {
            iov: vec![(0x1000, 64)],
            context,
            src,
            tag,
            ignore,
            completion: true,
        }
    }

    fn msg(conn: u64, tag: u64, byte: u8) -> Arrival {
        Arrival {
            conn,
            tag,
            data: None,
            body: Body::Eager(vec![byte]),
        }
    }

    #[test]
    fn a_message_takes_the_first_matching_receive() {
        let mut q = Queue::default();
        assert!(q.post(recv(ADDR_UNSPEC, 5, 0, 1), |c| c).is_none());
        assert!(q.post(recv(ADDR_UNSPEC, 7, 0, 2), |c| c).is_none());
        assert!(q.post(recv(ADDR_UNSPEC, 7, 0, 3), |c| c).is_none());
        let (r, _) = q.arrive(msg(9, 7, 0), 9).expect("tag 7 is posted");
        assert_eq!(r.context, 2);
        let (r, _) = q.arrive(msg(9, 7, 0), 9).expect("tag 7 is posted twice");
        assert_eq!(r.context, 3);
        assert!(q.arrive(msg(9, 7, 0), 9).is_none());
        assert_eq!(q.unexpected_len(), 1);
    }

    #[test]
    fn unexpected_messages_match_in_arrival_order() {
        let mut q = Queue::default();
        for byte in 0..3 {
            assert!(q.arrive(msg(4, 0x10 + u64::from(byte), byte), 4).is_none());
        }
        // Ignore the low nibble: any of the three matches, the oldest wins.
        let (_, a) = q
            .post(recv(ADDR_UNSPEC, 0x10, 0xf, 1), |c| c)
            .expect("match");
        assert_eq!(a.body, Body::Eager(vec![0]));
        let (_, a) = q.post(recv(ADDR_UNSPEC, 0x12, 0, 2), |c| c).expect("match");
        assert_eq!(a.body, Body::Eager(vec![2]));
    }

    #[test]
    fn directed_receives_take_only_their_source() {
        let mut q = Queue::default();
        assert!(q.arrive(msg(1, 0, 1), 100).is_none());
        assert!(q.arrive(msg(2, 0, 2), 200).is_none());
        let src_of = |conn: u64| conn * 100;
        let (_, a) = q.post(recv(200, 0, 0, 1), src_of).expect("from 200");
        assert_eq!(a.conn, 2);
        assert!(q.post(recv(300, 0, 0, 2), src_of).is_none());
        assert!(q.arrive(msg(1, 0, 3), 100).is_none());
        let (r, _) = q.arrive(msg(3, 0, 4), 300).expect("directed receive");
        assert_eq!(r.context, 2);
    }

    #[test]
    fn cancel_removes_only_the_named_receive() {
        let mut q = Queue::default();
        q.post(recv(ADDR_UNSPEC, 1, 0, 10), |c| c);
        q.post(recv(ADDR_UNSPEC, 1, 0, 11), |c| c);
        assert_eq!(q.cancel(10).map(|r| r.context), Some(10));
        assert!(q.cancel(10).is_none());
        assert_eq!(q.posted_len(), 1);
    }
}

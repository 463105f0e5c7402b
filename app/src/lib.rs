//! # metaroce-app
//!
//! The application `metaroce serve` runs over MetaRoCE, written once for
//! both of its homes: the host tool (`metaroce serve`) and the firmware's
//! serve role. It holds the four fixed-layout SEND messages the server
//! speaks with its clients ([`message`], little-endian), the deterministic
//! data pattern both sides check integrity against ([`pattern`]), and the
//! server itself ([`serve`]): a sans-IO state machine that reacts to a
//! connection's events and completions, budgets what each peer holds, and
//! asks its platform (a [`serve::ServeHost`]) to register memory and post
//! work. It is `no_std` and allocation-free; it is **not** a transport
//! (the messages travel as MetaRoCE SENDs) and does no I/O of its own.
//!
//! 1. Client → server `ANNOUNCE`: operation, pattern seed, message size.
//! 2. Server → client `REGION`: a fresh region for this connection (key,
//!    address, length, slots); for reads it is pre-filled, slot `j` with
//!    `pattern(seed, j)`.
//! 3. Client WRITE_IMMs message `i` into slot `i % slots` with immediate `i`
//!    (the server verifies the slot against `pattern(seed, i)` on the
//!    receive completion), or READs slots and verifies them itself.
//! 4. Client → server `DONE`, server → client `REPORT` (what it verified).
//!
//! Every connection has a protection domain of its own: a region's key
//! works only on the connection it was given to. To reach one region from
//! a second connection, that connection sends `JOIN` with the region's
//! **ticket** (a random 64-bit capability the `REGION` answer carried); the
//! server answers `REGION` with keys of the same memory registered in the
//! joining connection's own domain.

#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_code)]

pub mod message;
pub mod pattern;
pub mod serve;

pub use message::*;
pub use pattern::{check_pattern, fill_pattern};

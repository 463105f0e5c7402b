//! `memcpy` for the Cortex-A72, replacing compiler-builtins' portable one,
//! and small `memmove` and `memset` beside it.
//!
//! The engine's payload moves (the DMA gather of a packet's payload into
//! its frame, the placement of a received payload) are `memcpy` calls,
//! and compiler-builtins' version, built for a generic `strict-align`
//! Armv8.0-A, copies a misaligned source (every payload behind a 14-byte
//! Ethernet header is one) with shifts and merges at about 1.6
//! instructions per byte: half of the engine's instructions per packet
//! went there (`cargo xtask bench --firmware`, engine row). This one moves
//! 32 bytes with two load pairs and two store pairs per iteration,
//! aligned or not: the firmware runs with the MMU on and `SCTLR_ELx.A`
//! clear before any Rust code (aarch64-rt's entry), and every buffer it
//! copies is normal memory, where unaligned accesses are allowed (the
//! reason the boards build with `-strict-align`); device registers are
//! never copied with `memcpy` (they are read and written with volatile
//! accesses of their own width).
//!
//! `memcpy(dst, src, n)`: x0 = dst, x1 = src, x2 = n; returns dst. The
//! regions do not overlap (callers with overlap use `memmove`). The
//! strong definitions here take the place of compiler-builtins' weak ones.
//!
//! `memmove` (overlapping copies: `copy_within`, shifting slices) is rare
//! and short in the firmware; compiler-builtins' is a kilobyte of code.
//! Copying forwards is safe whenever `dst <= src` (each block is loaded
//! before any byte of it is overwritten), so that case is `memcpy`; a
//! destination above the source is copied backwards, 8 bytes at a time,
//! then byte by byte. `memset` stores 16 bytes at a time, then the tail.

// SAFETY (of the definitions): each reads `n` bytes at `src` (`memset`:
// none) and writes `n` bytes at `dst` and nothing else, touches only the
// caller-saved registers x3-x7 besides its arguments, and returns `dst`,
// as the C contracts their callers rely on require.
core::arch::global_asm!(
    ".section .text.memcpy, \"ax\"",
    ".global memcpy",
    ".type memcpy, %function",
    ".balign 16",
    "memcpy:",
    "mov x3, x0",
    "subs x2, x2, #32",
    "b.lo 2f",
    "1:",
    "ldp x4, x5, [x1]",
    "ldp x6, x7, [x1, #16]",
    "add x1, x1, #32",
    "stp x4, x5, [x3]",
    "stp x6, x7, [x3, #16]",
    "add x3, x3, #32",
    "subs x2, x2, #32",
    "b.hs 1b",
    "2:",
    // 0..31 bytes left: the low five bits of x2 (now n - 32k - 32).
    "tbz x2, #4, 3f",
    "ldp x4, x5, [x1], #16",
    "stp x4, x5, [x3], #16",
    "3:",
    "tbz x2, #3, 4f",
    "ldr x4, [x1], #8",
    "str x4, [x3], #8",
    "4:",
    "tbz x2, #2, 5f",
    "ldr w4, [x1], #4",
    "str w4, [x3], #4",
    "5:",
    "tbz x2, #1, 6f",
    "ldrh w4, [x1], #2",
    "strh w4, [x3], #2",
    "6:",
    "tbz x2, #0, 7f",
    "ldrb w4, [x1]",
    "strb w4, [x3]",
    "7:",
    "ret",
    ".size memcpy, . - memcpy",
    "",
    ".section .text.memmove, \"ax\"",
    ".global memmove",
    ".type memmove, %function",
    ".balign 16",
    "memmove:",
    "cmp x0, x1",
    "b.ls memcpy",
    "add x3, x0, x2",
    "add x1, x1, x2",
    "8:",
    "cmp x2, #8",
    "b.lo 9f",
    "ldr x4, [x1, #-8]!",
    "str x4, [x3, #-8]!",
    "sub x2, x2, #8",
    "b 8b",
    "9:",
    "cbz x2, 10f",
    "ldrb w4, [x1, #-1]!",
    "strb w4, [x3, #-1]!",
    "sub x2, x2, #1",
    "b 9b",
    "10:",
    "ret",
    ".size memmove, . - memmove",
    "",
    ".section .text.memset, \"ax\"",
    ".global memset",
    ".type memset, %function",
    ".balign 16",
    "memset:",
    "mov x3, x0",
    "and x1, x1, #0xff",
    "mov x4, #0x0101010101010101",
    "mul x1, x1, x4",
    "11:",
    "cmp x2, #16",
    "b.lo 12f",
    "stp x1, x1, [x3], #16",
    "sub x2, x2, #16",
    "b 11b",
    "12:",
    "cbz x2, 13f",
    "strb w1, [x3], #1",
    "sub x2, x2, #1",
    "b 12b",
    "13:",
    "ret",
    ".size memset, . - memset",
);

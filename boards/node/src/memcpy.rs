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
//! 128 bytes per iteration with four load pairs and four store pairs of
//! q registers (ten instructions: 80 per KiB), aligned or not, then the
//! 0..127 bytes left by one test of each bit of the length (64, 32 and 16
//! bytes in q registers, 8, 4, 2, 1 in x/w), so a small struct move costs
//! a handful of instructions. With x-register pairs, 32 bytes per eight
//! instructions (256 per KiB), the engine took 7,439.3 instructions per
//! 1 KiB packet; with q registers 7,048.4 (the board's setting, QEMU
//! `-icount`; 48 bytes more code).
//!
//! Unaligned accesses: the firmware runs with the MMU on and `SCTLR_ELx.A`
//! clear before any Rust code (aarch64-rt's entry), and every buffer it
//! copies is normal memory, where unaligned accesses are allowed (the
//! reason the boards build with `-strict-align`); device registers are
//! never copied with `memcpy` (they are read and written with volatile
//! accesses of their own width).
//!
//! q registers: aarch64-rt's entry (boot and secondary cores) turns off
//! FP/SIMD trapping (`CPACR_EL1.FPEN`) before any Rust code, and the
//! compiled firmware already uses q registers throughout (struct moves,
//! zeroing: `aarch64-unknown-none` has `neon`). v16-v31 are caller-saved
//! (AAPCS64), so a caller keeps nothing there across the call. No
//! exception handler returns to the code it interrupted (QEMU `virt`:
//! every exception reports and exits, interrupts stay masked and are
//! handled inline after `wfi`; Elba: aarch64-rt's handlers, which panic),
//! so none can clobber a q register under a copy in flight, any more than
//! under compiled code.
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
// caller-saved registers x3-x4 and q16-q23 (v16-v31 are caller-saved in
// AAPCS64) besides its arguments, and returns `dst`, as the C contracts
// their callers rely on require.
core::arch::global_asm!(
    ".section .text.memcpy, \"ax\"",
    ".global memcpy",
    ".type memcpy, %function",
    ".balign 16",
    "memcpy:",
    "mov x3, x0",
    "subs x2, x2, #128",
    "b.lo 2f",
    // 128 bytes per iteration: four load pairs of q registers, then four
    // store pairs, the cursors moved by the first of each (post-index).
    "1:",
    "ldp q16, q17, [x1], #128",
    "ldp q18, q19, [x1, #-96]",
    "ldp q20, q21, [x1, #-64]",
    "ldp q22, q23, [x1, #-32]",
    "stp q16, q17, [x3], #128",
    "stp q18, q19, [x3, #-96]",
    "stp q20, q21, [x3, #-64]",
    "stp q22, q23, [x3, #-32]",
    "subs x2, x2, #128",
    "b.hs 1b",
    "2:",
    // 0..127 bytes left: the low seven bits of x2 (now n - 128k - 128).
    "tbz x2, #6, 3f",
    "ldp q16, q17, [x1], #64",
    "ldp q18, q19, [x1, #-32]",
    "stp q16, q17, [x3], #64",
    "stp q18, q19, [x3, #-32]",
    "3:",
    "tbz x2, #5, 4f",
    "ldp q16, q17, [x1], #32",
    "stp q16, q17, [x3], #32",
    "4:",
    "tbz x2, #4, 5f",
    "ldr q16, [x1], #16",
    "str q16, [x3], #16",
    "5:",
    "tbz x2, #3, 6f",
    "ldr x4, [x1], #8",
    "str x4, [x3], #8",
    "6:",
    "tbz x2, #2, 7f",
    "ldr w4, [x1], #4",
    "str w4, [x3], #4",
    "7:",
    "tbz x2, #1, 8f",
    "ldrh w4, [x1], #2",
    "strh w4, [x3], #2",
    "8:",
    "tbz x2, #0, 9f",
    "ldrb w4, [x1]",
    "strb w4, [x3]",
    "9:",
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
    "10:",
    "cmp x2, #8",
    "b.lo 11f",
    "ldr x4, [x1, #-8]!",
    "str x4, [x3, #-8]!",
    "sub x2, x2, #8",
    "b 10b",
    "11:",
    "cbz x2, 12f",
    "ldrb w4, [x1, #-1]!",
    "strb w4, [x3, #-1]!",
    "sub x2, x2, #1",
    "b 11b",
    "12:",
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
    "13:",
    "cmp x2, #16",
    "b.lo 14f",
    "stp x1, x1, [x3], #16",
    "sub x2, x2, #16",
    "b 13b",
    "14:",
    "cbz x2, 15f",
    "strb w1, [x3], #1",
    "sub x2, x2, #1",
    "b 14b",
    "15:",
    "ret",
    ".size memset, . - memset",
);

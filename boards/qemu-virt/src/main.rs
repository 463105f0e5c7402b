//! Firmware for QEMU `virt` (work in progress: see issue 4).

#![cfg_attr(target_os = "none", no_std, no_main)]

#[cfg(target_os = "none")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {
        core::hint::spin_loop();
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    eprintln!("board-qemu-virt is firmware: build it with --target aarch64-unknown-none");
}

//! A polled driver for the 16550 UART (the Elba console is an `ns16550a`
//! with 32-bit registers spaced `1 << reg_shift` bytes apart).
//!
//! The driver reaches the hardware only through [`Registers`], so the same
//! code runs against the MMIO block on the board ([`Mmio`]) and against a
//! fake register block in host tests. Waiting for the transmitter is
//! bounded ([`SPIN_LIMIT`] polls): a missing or stuck UART gives
//! [`UartError::Timeout`], never a hang.

use core::ptr::NonNull;

/// Register indices (multiplied by the stride to get byte offsets).
mod reg {
    /// Receive buffer (read) / transmit holding (write); divisor low with DLAB.
    pub const RBR_THR_DLL: usize = 0;
    /// Interrupt enable; divisor high with DLAB.
    pub const IER_DLM: usize = 1;
    /// FIFO control (write).
    pub const FCR: usize = 2;
    /// Line control.
    pub const LCR: usize = 3;
    /// Modem control.
    pub const MCR: usize = 4;
    /// Line status.
    pub const LSR: usize = 5;
}

/// Line status: a received byte is waiting.
pub const LSR_DATA_READY: u32 = 0x01;
/// Line status: the transmit holding register (or FIFO) is empty.
pub const LSR_THR_EMPTY: u32 = 0x20;
/// Line status: the transmitter is idle (holding and shift register empty).
pub const LSR_TX_IDLE: u32 = 0x40;
/// Line control: 8 data bits, no parity, 1 stop bit.
pub const LCR_8N1: u32 = 0x03;
/// Line control: divisor latch access.
pub const LCR_DLAB: u32 = 0x80;
/// FIFO control: enable and clear both FIFOs.
pub const FCR_ENABLE_CLEAR: u32 = 0x07;
/// Modem control: DTR and RTS asserted.
pub const MCR_DTR_RTS: u32 = 0x03;
/// Polls of the line status before a write gives up.
pub const SPIN_LIMIT: u32 = 1_000_000;

/// Word access to a 16550 register block.
pub trait Registers {
    /// Reads the 32-bit register `offset` bytes from the base.
    fn read(&mut self, offset: usize) -> u32;
    /// Writes the 32-bit register `offset` bytes from the base.
    fn write(&mut self, offset: usize, value: u32);
}

/// Why the UART refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UartError {
    /// The transmitter stayed busy for [`SPIN_LIMIT`] polls.
    Timeout,
    /// No 16-bit divisor gives this baud rate from this clock.
    BadBaudRate { clock_hz: u32, baud: u32 },
}

impl core::fmt::Display for UartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            UartError::Timeout => f.write_str("UART transmitter timed out"),
            UartError::BadBaudRate { clock_hz, baud } => {
                write!(f, "no divisor for {baud} baud from {clock_hz} Hz")
            }
        }
    }
}

impl core::error::Error for UartError {}

impl embedded_io::Error for UartError {
    fn kind(&self) -> embedded_io::ErrorKind {
        match self {
            UartError::Timeout => embedded_io::ErrorKind::TimedOut,
            UartError::BadBaudRate { .. } => embedded_io::ErrorKind::InvalidInput,
        }
    }
}

/// The divisor for `baud` from a `clock_hz` input clock (16x oversampling),
/// rounded to the nearest integer.
pub fn divisor(clock_hz: u32, baud: u32) -> Result<u16, UartError> {
    let bad = UartError::BadBaudRate { clock_hz, baud };
    let denominator = u64::from(baud) * 16;
    if denominator == 0 {
        return Err(bad);
    }
    let d = (u64::from(clock_hz) + denominator / 2) / denominator;
    u16::try_from(d).ok().filter(|&d| d != 0).ok_or(bad)
}

/// A 16550 UART.
#[derive(Debug)]
pub struct Uart16550<R: Registers> {
    regs: R,
    reg_shift: u32,
}

impl<R: Registers> Uart16550<R> {
    /// A driver for the block `regs` with registers `1 << reg_shift` bytes
    /// apart. Nothing is written: settings left by the boot loader stay
    /// until [`Self::configure`].
    pub fn new(regs: R, reg_shift: u32) -> Self {
        Uart16550 { regs, reg_shift }
    }

    fn offset(&self, index: usize) -> usize {
        index << self.reg_shift
    }

    fn read_reg(&mut self, index: usize) -> u32 {
        let offset = self.offset(index);
        self.regs.read(offset)
    }

    fn write_reg(&mut self, index: usize, value: u32) {
        let offset = self.offset(index);
        self.regs.write(offset, value);
    }

    /// Programs 8N1 at `baud` from a `clock_hz` input clock, enables the
    /// FIFOs and masks the UART's interrupts (the driver polls).
    pub fn configure(&mut self, clock_hz: u32, baud: u32) -> Result<(), UartError> {
        let d = divisor(clock_hz, baud)?;
        self.write_reg(reg::IER_DLM, 0);
        self.write_reg(reg::LCR, LCR_DLAB | LCR_8N1);
        self.write_reg(reg::RBR_THR_DLL, u32::from(d & 0xff));
        self.write_reg(reg::IER_DLM, u32::from(d >> 8));
        self.write_reg(reg::LCR, LCR_8N1);
        self.write_reg(reg::FCR, FCR_ENABLE_CLEAR);
        self.write_reg(reg::MCR, MCR_DTR_RTS);
        Ok(())
    }

    /// The line status register.
    pub fn line_status(&mut self) -> u32 {
        self.read_reg(reg::LSR)
    }

    /// Sends one byte, waiting (bounded) for room in the transmitter.
    pub fn write_byte(&mut self, byte: u8) -> Result<(), UartError> {
        self.wait_for(LSR_THR_EMPTY)?;
        self.write_reg(reg::RBR_THR_DLL, u32::from(byte));
        Ok(())
    }

    /// Sends text: each `\n` as CR LF, which a terminal wants. Stops at
    /// the first byte that fails.
    pub fn write_text(&mut self, text: &[u8]) -> Result<(), UartError> {
        for &b in text {
            if b == b'\n' {
                self.write_byte(b'\r')?;
            }
            self.write_byte(b)?;
        }
        Ok(())
    }

    /// A received byte, if one is waiting.
    pub fn read_byte(&mut self) -> Option<u8> {
        (self.line_status() & LSR_DATA_READY != 0)
            .then(|| (self.read_reg(reg::RBR_THR_DLL) & 0xff) as u8)
    }

    /// Waits (bounded) until every byte has left the transmitter.
    pub fn wait_idle(&mut self) -> Result<(), UartError> {
        self.wait_for(LSR_TX_IDLE)
    }

    fn wait_for(&mut self, bits: u32) -> Result<(), UartError> {
        for _ in 0..SPIN_LIMIT {
            if self.line_status() & bits == bits {
                return Ok(());
            }
            core::hint::spin_loop();
        }
        Err(UartError::Timeout)
    }

    /// The register block (for tests).
    pub fn registers(&self) -> &R {
        &self.regs
    }
}

impl<R: Registers> embedded_io::ErrorType for Uart16550<R> {
    type Error = UartError;
}

impl<R: Registers> embedded_io::Write for Uart16550<R> {
    fn write(&mut self, buf: &[u8]) -> Result<usize, UartError> {
        // Blocking: everything, or the error of the byte that failed (the
        // trait asks for at least one byte unless `buf` is empty).
        for &b in buf {
            self.write_byte(b)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> Result<(), UartError> {
        self.wait_idle()
    }
}

impl<R: Registers> core::fmt::Write for Uart16550<R> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.write_text(s.as_bytes()).map_err(|_| core::fmt::Error)
    }
}

/// A 16550 register block in memory-mapped I/O.
#[derive(Debug)]
pub struct Mmio {
    base: NonNull<u32>,
}

// SAFETY: the block is only reached through `&mut Mmio`, so moving the
// handle to another context moves the only access with it.
unsafe impl Send for Mmio {}

impl Mmio {
    /// The register block at `base`.
    ///
    /// # Safety
    /// `base` must be the 16550 block, mapped as device memory, covering
    /// `8 << reg_shift` bytes, and no other code may access it while this
    /// handle lives.
    pub unsafe fn new(base: NonNull<u32>) -> Self {
        Mmio { base }
    }
}

impl Registers for Mmio {
    fn read(&mut self, offset: usize) -> u32 {
        // SAFETY: `new`'s contract: the block is mapped and ours; the
        // driver only uses offsets of its eight registers.
        unsafe { self.base.byte_add(offset).read_volatile() }
    }

    fn write(&mut self, offset: usize, value: u32) {
        // SAFETY: as in `read`.
        unsafe { self.base.byte_add(offset).write_volatile(value) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedded_io::Write as _;
    use std::vec::Vec;

    /// A fake 16550: eight 32-bit registers at stride 4, a log of writes,
    /// a receive queue and a transmitter that can be made to stick.
    #[derive(Default)]
    struct FakeBlock {
        writes: Vec<(usize, u32)>,
        transmitted: Vec<u8>,
        rx: Vec<u8>,
        stuck: bool,
        lcr: u32,
        line_status_reads: u32,
    }

    impl Registers for FakeBlock {
        fn read(&mut self, offset: usize) -> u32 {
            assert!(offset.is_multiple_of(4), "32-bit registers, 4-byte stride");
            match offset {
                0x14 => {
                    self.line_status_reads += 1;
                    let tx = if self.stuck {
                        0
                    } else {
                        LSR_THR_EMPTY | LSR_TX_IDLE
                    };
                    tx | u32::from(!self.rx.is_empty())
                }
                0x00 if self.lcr & LCR_DLAB == 0 => u32::from(self.rx.remove(0)),
                _ => 0,
            }
        }

        fn write(&mut self, offset: usize, value: u32) {
            assert!(
                offset < 0x20 && offset.is_multiple_of(4),
                "offset {offset:#x}"
            );
            self.writes.push((offset, value));
            match offset {
                0x0c => self.lcr = value,
                0x00 if self.lcr & LCR_DLAB == 0 => self.transmitted.push(value as u8),
                _ => {}
            }
        }
    }

    #[test]
    fn divisor_for_the_elba_console() {
        // 156.25 MHz / (16 * 115200) = 84.77: rounds to 85 (0.27 % fast).
        assert_eq!(divisor(156_250_000, 115_200), Ok(85));
        assert_eq!(divisor(1_843_200, 9600), Ok(12));
        assert!(divisor(156_250_000, 0).is_err());
        assert!(divisor(100, 115_200).is_err(), "divisor rounds to 0");
        assert!(divisor(u32::MAX, 1).is_err(), "divisor above 16 bits");
    }

    #[test]
    fn configure_writes_the_divisor_under_dlab_at_stride_4() {
        let mut uart = Uart16550::new(FakeBlock::default(), 2);
        uart.configure(156_250_000, 115_200).unwrap();
        assert_eq!(
            uart.registers().writes,
            [
                (0x04, 0),
                (0x0c, LCR_DLAB | LCR_8N1),
                (0x00, 85),
                (0x04, 0),
                (0x0c, LCR_8N1),
                (0x08, FCR_ENABLE_CLEAR),
                (0x10, MCR_DTR_RTS),
            ]
        );
        assert!(
            uart.registers().transmitted.is_empty(),
            "divisor is not data"
        );
        assert!(uart.configure(1, 0).is_err());
    }

    #[test]
    fn writes_go_to_thr_and_text_gets_crlf() {
        let mut uart = Uart16550::new(FakeBlock::default(), 2);
        assert_eq!(uart.write(b"ok"), Ok(2));
        core::fmt::Write::write_str(&mut uart, "a\nb").unwrap();
        uart.write_text(b"c\n").unwrap();
        uart.flush().unwrap();
        assert_eq!(uart.registers().transmitted, b"oka\r\nbc\r\n");
        assert!(uart.registers().writes.iter().all(|&(o, _)| o == 0));
    }

    #[test]
    fn a_stuck_transmitter_times_out_instead_of_hanging() {
        let mut uart = Uart16550::new(
            FakeBlock {
                stuck: true,
                ..FakeBlock::default()
            },
            2,
        );
        assert_eq!(uart.write(b"x"), Err(UartError::Timeout));
        assert_eq!(uart.flush(), Err(UartError::Timeout));
        assert_eq!(
            embedded_io::Error::kind(&UartError::Timeout),
            embedded_io::ErrorKind::TimedOut
        );
        assert!(uart.registers().transmitted.is_empty());
        assert_eq!(uart.registers().line_status_reads, 2 * SPIN_LIMIT);
    }

    #[test]
    fn received_bytes_are_read_when_ready() {
        let mut uart = Uart16550::new(
            FakeBlock {
                rx: std::vec![b'h', b'i'],
                ..FakeBlock::default()
            },
            2,
        );
        assert_eq!(uart.read_byte(), Some(b'h'));
        assert_eq!(uart.read_byte(), Some(b'i'));
        assert_eq!(uart.read_byte(), None);
    }

    #[test]
    fn reg_shift_zero_packs_registers() {
        let mut uart = Uart16550::new(FakeBlockShift0::default(), 0);
        uart.write_byte(b'z').unwrap();
        assert_eq!(uart.registers().reads, [5]);
        assert_eq!(uart.registers().writes, [(0, u32::from(b'z'))]);
    }

    #[derive(Default)]
    struct FakeBlockShift0 {
        reads: Vec<usize>,
        writes: Vec<(usize, u32)>,
    }

    impl Registers for FakeBlockShift0 {
        fn read(&mut self, offset: usize) -> u32 {
            self.reads.push(offset);
            LSR_THR_EMPTY
        }
        fn write(&mut self, offset: usize, value: u32) {
            self.writes.push((offset, value));
        }
    }
}

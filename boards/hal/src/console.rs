//! Console lines without `core::fmt`.
//!
//! The firmware's console prints text and unsigned integers: the
//! `METAROCE-*` lines the harness and the xtask read, the banner, the
//! panic location. `format_args!` and `core::fmt` would do it, but their
//! machinery (`Formatter::pad`, `pad_integral`, `fmt::write`, the
//! `Display` of each integer width) costs about 5 KB of the firmware's
//! 128 KiB code budget. Here a line is a format string and its arguments
//! ([`Line`], made by [`console_line!`](crate::console_line)), and one
//! small function writes it out ([`Line::write`]): the format string stays
//! in `.rodata`, and a call site only stores its arguments.
//!
//! The format strings are the subset of `format_args!` the firmware uses,
//! with the same output byte for byte: `{}` (a string as it is, an integer
//! in decimal), `{:0N}` (an integer in decimal, zero-padded to N digits,
//! N from 1 to 9), `{:x}` (lowercase hexadecimal; `{:0Nx}` zero-padded)
//! and `{:#x}` (the same after `0x`). `console_line!` checks at compile time that a string uses
//! only these and has one argument per `{...}`; the tests hold the output
//! to `format!`'s.

/// One argument of a [`Line`]: every integer type the firmware prints
/// becomes a `u64`, and text stays borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    Int(u64),
    Str(&'a str),
}

macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl From<$t> for Arg<'_> {
            #[inline(always)]
            fn from(n: $t) -> Self {
                Arg::Int(n as u64)
            }
        }
    )*};
}

int_arg!(u8, u16, u32, u64, usize);

impl<'a> From<&'a str> for Arg<'a> {
    #[inline(always)]
    fn from(s: &'a str) -> Self {
        Arg::Str(s)
    }
}

/// How one `{...}` formats an integer (a string ignores it).
#[derive(Debug, Clone, Copy, Default)]
struct Spec {
    /// Hexadecimal (`x`), else decimal.
    hex: bool,
    /// `0x` first (`#`).
    prefix: bool,
    /// Fewest digits, zero-padded (`0N`); 0 pads nothing.
    width: usize,
}

impl Spec {
    /// The spec between `{` and `}`, as [`placeholders`] let it through
    /// (so nothing is checked here, and nothing panics).
    fn parse(spec: &[u8]) -> Spec {
        let mut s = Spec::default();
        for &c in spec {
            match c {
                b'#' => s.prefix = true,
                b'x' => s.hex = true,
                b'1'..=b'9' => s.width = usize::from(c - b'0'),
                _ => {}
            }
        }
        s
    }

    /// `n`'s digits, at the end of `buf` (u64::MAX has 20 in decimal; the
    /// width is at most 9).
    fn digits(self, mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
        let radix = if self.hex { 16 } else { 10 };
        let mut at = buf.len();
        loop {
            at -= 1;
            buf[at] = b"0123456789abcdef"[(n % radix) as usize];
            n /= radix;
            if n == 0 && buf.len() - at >= self.width {
                return &buf[at..];
            }
        }
    }
}

/// The number of `{...}` in `fmt`, for [`console_line!`](crate::console_line)
/// to check at compile time. Panics (a compile-time error there) on a
/// `{...}` other than `{}`, `{:}`, `{:0N}`, `{:x}`, `{:0Nx}` and `{:#x}`,
/// on a `}` alone, and on `{{` and `}}`, which are not supported.
pub const fn placeholders(fmt: &str) -> usize {
    let fmt = fmt.as_bytes();
    let mut count = 0;
    let mut i = 0;
    while i < fmt.len() {
        if fmt[i] == b'}' {
            panic!("console_line!: a `}}` without its `{{`");
        }
        if fmt[i] != b'{' {
            i += 1;
            continue;
        }
        count += 1;
        i += 1;
        if i < fmt.len() && fmt[i] == b':' {
            i += 1;
            let prefix = i < fmt.len() && fmt[i] == b'#';
            if prefix {
                i += 1;
            } else if i + 1 < fmt.len() && fmt[i] == b'0' && matches!(fmt[i + 1], b'1'..=b'9') {
                i += 2;
            }
            if i < fmt.len() && fmt[i] == b'x' {
                i += 1;
            } else if prefix {
                panic!("console_line!: `#` only in `{{:#x}}`");
            }
        }
        if i >= fmt.len() || fmt[i] != b'}' {
            panic!("console_line!: only `{{}}`, `{{:0N}}`, `{{:x}}`, `{{:0Nx}}` and `{{:#x}}`");
        }
        i += 1;
    }
    count
}

/// A console line: a format string and its arguments (see the module
/// documentation), without the newline.
#[derive(Debug, Clone, Copy)]
pub struct Line<'a> {
    fmt: &'static str,
    args: &'a [Arg<'a>],
}

impl<'a> Line<'a> {
    /// The line `fmt` with `args`. Use [`console_line!`](crate::console_line),
    /// which checks the two agree: here a `{...}` without an argument
    /// prints nothing, and an argument without a `{...}` is left out.
    #[inline(always)]
    pub const fn new(fmt: &'static str, args: &'a [Arg<'a>]) -> Self {
        Line { fmt, args }
    }

    /// Hands the line's bytes to `out`, in pieces, in order.
    #[inline(never)]
    pub fn write(&self, out: &mut dyn FnMut(&[u8])) {
        let mut rest = self.fmt.as_bytes();
        let mut args = self.args.iter();
        while let Some(open) = rest.iter().position(|&c| c == b'{') {
            out(&rest[..open]);
            rest = &rest[open + 1..];
            let close = rest.iter().position(|&c| c == b'}').unwrap_or(rest.len());
            let spec = Spec::parse(&rest[..close]);
            match args.next() {
                Some(Arg::Str(s)) => out(s.as_bytes()),
                Some(&Arg::Int(n)) => {
                    if spec.prefix {
                        out(b"0x");
                    }
                    out(spec.digits(n, &mut [0; 20]));
                }
                None => {}
            }
            rest = rest.get(close + 1..).unwrap_or_default();
        }
        out(rest);
    }
}

/// A [`Line`] from a format string and its arguments, checked at compile
/// time (see the module documentation for the format strings):
/// `console_line!("METAROCE-EXIT {}", code)`.
///
/// ```compile_fail
/// // One argument for two `{}`.
/// let line = metaroce_board::console_line!("{} {}", 1u32);
/// ```
///
/// ```compile_fail
/// // Not a format the console has.
/// let line = metaroce_board::console_line!("{:?}", 1u32);
/// ```
#[macro_export]
macro_rules! console_line {
    ($fmt:literal $(, $arg:expr)* $(,)?) => {
        $crate::console::Line::new(
            {
                const FMT: &str = $fmt;
                const {
                    assert!(
                        $crate::console::placeholders(FMT) == <[&str]>::len(&[$(stringify!($arg)),*]),
                        "console_line!: one argument per `{{}}`"
                    )
                };
                FMT
            },
            &[$($crate::console::Arg::from($arg)),*],
        )
    };
}

#[cfg(test)]
mod tests {
    extern crate std;

    use std::string::String;
    use std::vec::Vec;

    use super::*;

    fn text(line: &Line<'_>) -> String {
        let mut out = Vec::new();
        line.write(&mut |bytes| out.extend_from_slice(bytes));
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn lines_read_as_format_args_writes_them() {
        let role: &str = "both";
        assert_eq!(
            text(&crate::console_line!(
                "METAROCE-RESULT node={} role={} goodput_mbps={}.{:02} max={} ok={}",
                3u8,
                role,
                812u64,
                7u64,
                u64::MAX,
                "OK",
            )),
            std::format!(
                "METAROCE-RESULT node={} role={} goodput_mbps={}.{:02} max={} ok={}",
                3u8,
                role,
                812u64,
                7u64,
                u64::MAX,
                "OK"
            )
        );
        assert_eq!(text(&crate::console_line!("no arguments")), "no arguments");
        assert_eq!(text(&crate::console_line!("{}", "")), "");
        assert_eq!(text(&crate::console_line!("{}{}", 0u32, 10usize)), "010");
    }

    #[test]
    fn integers_format_as_core_fmt_does() {
        let values = [
            0,
            1,
            9,
            10,
            99,
            100,
            0xdead_beef,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ];
        for n in values {
            let line = |fmt| text(&Line::new(fmt, &[Arg::Int(n)]));
            assert_eq!(line("{}"), std::format!("{}", n));
            assert_eq!(line("{:02}"), std::format!("{:02}", n));
            assert_eq!(line("{:09}"), std::format!("{:09}", n));
            assert_eq!(line("{:x}"), std::format!("{:x}", n));
            assert_eq!(line("{:08x}"), std::format!("{:08x}", n));
            assert_eq!(line("{:#x}"), std::format!("{:#x}", n));
            assert_eq!(line("a{:#x}b"), std::format!("a{:#x}b", n));
        }
        assert_eq!(text(&crate::console_line!("{}", u8::MAX)), "255");
        assert_eq!(text(&crate::console_line!("{}", u16::MAX)), "65535");
        assert_eq!(text(&crate::console_line!("{}", u32::MAX)), "4294967295");
        assert_eq!(
            text(&crate::console_line!("{}", usize::MAX)),
            std::format!("{}", usize::MAX)
        );
    }

    #[test]
    fn placeholders_are_counted_and_checked() {
        assert_eq!(placeholders(""), 0);
        assert_eq!(placeholders("a {} b {:02} c {:x} d {:#x}"), 4);
        assert_eq!(placeholders("{:}"), 1, "as `{{}}`");
        for bad in [
            "{", "}", "{:?}", "{:#}", "{:5}", "{:#02}", "{:#04x}", "{{}}", "{:010}", "{x}",
        ] {
            assert!(
                std::panic::catch_unwind(|| placeholders(bad)).is_err(),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn an_argument_is_two_words() {
        assert_eq!(size_of::<Arg<'_>>(), 16);
    }
}

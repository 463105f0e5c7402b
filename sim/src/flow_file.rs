//! Flows from a text file, so a user's own traffic matrix can be
//! replayed on any fabric.
//!
//! The format: one flow a line, `SRC DST BYTES [START_US]`, fields split
//! by spaces, tabs or commas. `SRC` and `DST` are host indices (hosts
//! are numbered leaf by leaf from 0), `BYTES` a whole number with an
//! optional unit (`KiB`, `MiB`, `GiB`, `KB`, `MB`, `GB`), `START_US` when
//! the flow starts, in microseconds (default 0; fractions allowed). `#`
//! starts a comment; blank lines are skipped.
//!
//! ```text
//! # src dst bytes start_us
//! 0   17  4MiB
//! 3   5   65536  12.5
//! ```
//!
//! Every error names its line.

use metaroce_core::Instant;

use crate::packet::HostId;
use crate::workload::Flow;

/// Parses `text` into flows among `hosts` hosts.
pub fn parse(text: &str, hosts: usize) -> Result<Vec<Flow>, String> {
    let mut flows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        let fields: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|f| !f.is_empty())
            .collect();
        if fields.is_empty() {
            continue;
        }
        let n = i + 1;
        flows.push(parse_line(&fields, hosts).map_err(|e| format!("line {n}: {e}"))?);
    }
    Ok(flows)
}

fn parse_line(fields: &[&str], hosts: usize) -> Result<Flow, String> {
    if !(3..=4).contains(&fields.len()) {
        return Err(format!(
            "expected `SRC DST BYTES [START_US]`, found {} fields",
            fields.len()
        ));
    }
    let host = |name: &str, text: &str| -> Result<HostId, String> {
        let h: HostId = text
            .parse()
            .map_err(|_| format!("{name} `{text}` is not a host index"))?;
        if h >= hosts {
            return Err(format!(
                "{name} {h} is not a host (hosts 0 to {})",
                hosts - 1
            ));
        }
        Ok(h)
    };
    let src = host("SRC", fields[0])?;
    let dst = host("DST", fields[1])?;
    if src == dst {
        return Err(format!("a host cannot send to itself ({src})"));
    }
    let bytes = bytes(fields[2])?;
    let start = match fields.get(3) {
        None => Instant::ZERO,
        Some(text) => {
            let us: f64 = text
                .parse()
                .map_err(|_| format!("START_US `{text}` is not a number"))?;
            if !(0.0..1e12).contains(&us) {
                return Err(format!("START_US {text} out of range (0 to 10^12)"));
            }
            Instant::from_nanos((us * 1_000.0).round() as u64)
        }
    };
    Ok(Flow {
        src,
        dst,
        bytes,
        start,
    })
}

/// A byte count with an optional unit.
fn bytes(text: &str) -> Result<u64, String> {
    const UNITS: [(&str, u64); 6] = [
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("KB", 1_000),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
    ];
    let (digits, scale) = UNITS
        .iter()
        .find_map(|&(unit, scale)| text.strip_suffix(unit).map(|d| (d, scale)))
        .unwrap_or((text, 1));
    let n: u64 = digits.parse().map_err(|_| {
        format!("BYTES `{text}` is not a whole number of bytes (units: KiB MiB GiB KB MB GB)")
    })?;
    let b = n
        .checked_mul(scale)
        .ok_or_else(|| format!("BYTES `{text}` is too large"))?;
    if b == 0 {
        return Err("BYTES must be more than 0".into());
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_parse_with_units_starts_and_comments() {
        let text = "# a matrix\n\n0 3 4MiB\n 2,1,65536, 12.5 # late\n1\t0\t1KB\n";
        let flows = parse(text, 4).unwrap();
        assert_eq!(flows.len(), 3);
        assert_eq!(
            (flows[0].src, flows[0].dst, flows[0].bytes),
            (0, 3, 4 << 20)
        );
        assert_eq!(flows[0].start, Instant::ZERO);
        assert_eq!(flows[1].bytes, 65_536);
        assert_eq!(flows[1].start, Instant::from_nanos(12_500));
        assert_eq!(flows[2].bytes, 1_000);
    }

    #[test]
    fn the_example_file_parses() {
        let text = include_str!("../flows/example.flows");
        let flows = parse(text, 128).unwrap();
        assert_eq!(flows.len(), 128 + 16 + 64);
        assert!(parse(text, 127).unwrap_err().starts_with("line "));
    }

    #[test]
    fn bad_lines_are_reported_with_their_number() {
        let cases = [
            ("0 1\n", "line 1: expected"),
            ("0 1 8\n0 9 8\n", "line 2: DST 9 is not a host"),
            ("# x\n2 2 8\n", "line 2: a host cannot send"),
            ("0 1 8x\n", "line 1: BYTES `8x`"),
            ("0 1 0\n", "line 1: BYTES must be"),
            (
                "0 1 99999999999GiB\n",
                "line 1: BYTES `99999999999GiB` is too large",
            ),
            ("0 1 8 -3\n", "line 1: START_US -3 out of range"),
            ("0 1 8 soon\n", "line 1: START_US `soon`"),
            ("a 1 8\n", "line 1: SRC `a`"),
        ];
        for (text, want) in cases {
            let err = parse(text, 4).unwrap_err();
            assert!(err.starts_with(want), "{text:?}: {err}");
        }
    }
}

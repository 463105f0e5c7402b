//! `cargo xtask bench --host`: `metaroce bench` against `metaroce serve`
//! on loopback beside single-stream iperf3 UDP at the same payload per
//! datagram, in one run, so the two numbers share the machine's load.
//!
//! For each payload size (1024 and 8192 bytes): `metaroce serve` and
//! `metaroce bench --duration 3 --paths 4 --mtu SIZE` with the defaults a
//! user gets (no rate cap), then `iperf3 -s -1` and
//! `iperf3 -c 127.0.0.1 -u -b 0 -l SIZE -t 3`, whose figure is what the
//! receiver got (`sum_received`). MetaRoCE's figure is verified goodput:
//! payload the server checked, without its 60 bytes of header and trailer
//! per datagram. iperf3 is installed with apt-get when missing (root).
//! Timings, not a test: not part of `cargo xtask test`.

use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use crate::system;
use crate::util::{self, Error};

const SIZES: &[u32] = &[1024, 8192];
const SECONDS: u32 = 3;

/// The `goodput N Mbit/s` and `limited by ...` of a bench summary.
pub fn parse_bench(text: &str) -> Option<(f64, String)> {
    let goodput = text.lines().find_map(|l| {
        let rest = l.split("goodput ").nth(1)?;
        rest.split_whitespace().next()?.parse::<f64>().ok()
    })?;
    let limit = text
        .lines()
        .find_map(|l| l.strip_prefix("limited by "))
        .map(|l| l.split(';').next().unwrap_or(l).to_string())
        .unwrap_or_default();
    Some((goodput, limit))
}

/// Receiver-side Mbit/s from `iperf3 --json` of a UDP client.
pub fn parse_iperf3(json: &str) -> Option<f64> {
    let at = json.find("\"sum_received\"")?;
    let rest = &json[at..];
    let key = "\"bits_per_second\":";
    let start = rest.find(key)? + key.len();
    let number: String = rest[start..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e' || *c == '+' || *c == '-')
        .collect();
    Some(number.parse::<f64>().ok()? / 1e6)
}

fn metaroce(size: u32, port: u16) -> Result<(f64, String), Error> {
    let bin = util::target_dir().join("release").join("metaroce");
    let mut server = Command::new(&bin)
        .args(["serve", "--bind", &format!("127.0.0.1:{port}"), "--mtu"])
        .arg(size.to_string())
        .args(["--duration", "30"])
        .stdout(Stdio::null())
        .spawn()?;
    sleep(Duration::from_millis(300));
    let out = Command::new(&bin)
        .args(["bench", "--peer", &format!("127.0.0.1:{port}"), "--quiet"])
        .args(["--duration", &SECONDS.to_string(), "--paths", "4", "--mtu"])
        .arg(size.to_string())
        .output();
    let _ = server.kill();
    let _ = server.wait();
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_bench(&text)
        .ok_or_else(|| Error::new(format!("metaroce bench printed no goodput:\n{text}")))
}

fn iperf3(size: u32, port: u16) -> Result<f64, Error> {
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .spawn()?;
    sleep(Duration::from_millis(300));
    let out = Command::new("iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-u",
            "-b",
            "0",
            "-l",
        ])
        .arg(size.to_string())
        .args(["-t", &SECONDS.to_string(), "--json"])
        .output();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out?.stdout).into_owned();
    parse_iperf3(&text).ok_or_else(|| Error::new("iperf3 printed no sum_received"))
}

/// Entry point of `cargo xtask bench --host`.
pub fn run() -> Result<(), Error> {
    system::ensure_system_packages(
        &[("iperf3", "iperf3")],
        "the UDP baseline of the host bench",
    )?;
    util::run(&mut util::cargo([
        "build",
        "--release",
        "-p",
        "metaroce-host",
    ]))?;
    let mut rows = Vec::new();
    for (i, &size) in SIZES.iter().enumerate() {
        let port = 4795 + 10 + i as u16;
        let (goodput, limit) = metaroce(size, port)?;
        let udp = iperf3(size, 5201 + i as u16)?;
        rows.push((size, goodput, udp, limit));
    }
    println!("\nloopback, {SECONDS} s each, in this run:\n");
    println!("| payload per datagram | metaroce bench (verified) Mbit/s | iperf3 UDP received Mbit/s | ratio | metaroce limited by |");
    println!("|---:|---:|---:|---:|---|");
    for (size, goodput, udp, limit) in rows {
        println!(
            "| {size} B | {goodput:.0} | {udp:.0} | {:.2}x | {limit} |",
            goodput / udp.max(1e-9)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_summaries_are_read() {
        let text = "write a -> b: 10 messages x 65536 B = 655360 B in 3.00 s: goodput 1545.0 Mbit/s\npackets 5\nlimited by loss: 6 of 5 packets lost (0 refused); 3.9 datagrams per send call\n";
        assert_eq!(
            parse_bench(text),
            Some((1545.0, "loss: 6 of 5 packets lost (0 refused)".to_string()))
        );
        assert_eq!(parse_bench("nothing"), None);
    }

    #[test]
    fn iperf3_receiver_rate_is_read() {
        let json = r#"{"end": {"sum": {"bits_per_second": 747229327.7}, "sum_sent": {"bits_per_second": 747229327.7}, "sum_received": {"start": 0, "bits_per_second": 265622100.26, "lost_percent": 64.4}}}"#;
        let mbps = parse_iperf3(json).unwrap();
        assert!((mbps - 265.6221).abs() < 1e-3, "{mbps}");
        assert_eq!(parse_iperf3("{}"), None);
    }
}

//! Two processes in two network namespaces joined by a veth pair, with
//! nftables in the server's namespace dropping a random 0 %, 1 % and 10 %
//! of MetaRoCE datagrams in both directions and CE-marking 5 % of the data:
//! `metaroce serve` in one, `metaroce bench` in the other, integrity
//! checked by the server on every message.
//!
//! The test creates and removes the namespaces itself and uses only the
//! private subnet 10.77.0.0/24 inside them. It needs root, `ip` and `nft`;
//! without them it prints `SKIPPED` and why (`cargo xtask test host-netns`
//! shows the output; the step installs `iproute2` and `nftables`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};

const SERVER_IP: &str = "10.77.0.2";
const CLIENT_IP: &str = "10.77.0.1";

fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not running as root (network namespaces need it)".into());
    }
    for tool in ["ip", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            return Some(format!(
                "`{tool}` is not installed (apt-get install iproute2 nftables)"
            ));
        }
    }
    None
}

fn run(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Two namespaces and their veth pair, removed on drop (also on panic).
struct Namespaces {
    client: String,
    server: String,
}

impl Namespaces {
    fn create() -> Result<Namespaces, String> {
        let id = std::process::id();
        let ns = Namespaces {
            client: format!("mrc{id}"),
            server: format!("mrs{id}"),
        };
        let veth_c = format!("mrc{}", id % 100_000);
        let veth_s = format!("mrs{}", id % 100_000);
        let steps: Vec<Vec<String>> = vec![
            vec!["ip".into(), "netns".into(), "add".into(), ns.client.clone()],
            vec!["ip".into(), "netns".into(), "add".into(), ns.server.clone()],
            [
                "ip", "link", "add", &veth_c, "netns", &ns.client, "type", "veth", "peer", "name",
                &veth_s, "netns", &ns.server,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ];
        for s in steps {
            let out = Command::new(&s[0])
                .args(&s[1..])
                .output()
                .map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "{s:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        for (n, dev, ip) in [
            (&ns.client, &veth_c, CLIENT_IP),
            (&ns.server, &veth_s, SERVER_IP),
        ] {
            run(&[
                "ip",
                "-n",
                n,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                dev,
            ]);
            run(&["ip", "-n", n, "link", "set", dev, "up"]);
            run(&["ip", "-n", n, "link", "set", "lo", "up"]);
        }
        Ok(ns)
    }

    /// Replaces the impairment rules in the server's namespace.
    fn impair(&self, loss_percent: u32, ce_percent: u32) {
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.server,
                "nft",
                "delete",
                "table",
                "inet",
                "metaroce",
            ])
            .stderr(Stdio::null())
            .status();
        let rules = format!(
            "table inet metaroce {{
  chain pre {{
    type filter hook prerouting priority 0; policy accept;
    udp dport 4795 numgen random mod 100 < {loss_percent} drop
    udp dport 4795 numgen random mod 100 < {ce_percent} ip ecn set ce
  }}
  chain out {{
    type filter hook output priority 0; policy accept;
    ip daddr {CLIENT_IP} meta l4proto udp numgen random mod 100 < {loss_percent} drop
  }}
}}
"
        );
        let path = std::env::temp_dir().join(format!("metaroce-nft-{}.conf", std::process::id()));
        std::fs::write(&path, rules).unwrap();
        run(&[
            "ip",
            "netns",
            "exec",
            &self.server,
            "nft",
            "-f",
            path.to_str().unwrap(),
        ]);
        let _ = std::fs::remove_file(path);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in [&self.client, &self.server] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let start = json
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {json}"))
        + key.len()
        + 3;
    let rest = &json[start..];
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    &rest[..end]
}

fn bench(ns: &Namespaces, loss: u32, ce: u32) {
    ns.impair(loss, ce);
    let bin = env!("CARGO_BIN_EXE_metaroce");
    let mut server = Command::new("ip")
        .args(["netns", "exec", &ns.server, bin, "serve", "--once"])
        .args(["--bind", &format!("{SERVER_IP}:4795")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let listening = lines.next().unwrap().unwrap();
    assert!(listening.contains("listening"), "{listening}");
    let client = Command::new("ip")
        .args([
            "netns", "exec", &ns.client, bin, "bench", "--json", "--quiet",
        ])
        .args(["--peer", &format!("{SERVER_IP}:4795")])
        .args(["--duration", "2", "--size", "65536", "--paths", "4"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&client.stdout).to_string();
    let report = lines.next().map(|l| l.unwrap()).unwrap_or_default();
    let server_status = server.wait().unwrap();
    assert!(
        client.status.success(),
        "bench at {loss}% loss failed: {out} {}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(server_status.success(), "server: {report}");
    assert!(report.contains("integrity OK"), "{report}");
    assert_eq!(json_field(&out, "integrity_ok"), "true", "{out}");
    let completions: u64 = json_field(&out, "completions").parse().unwrap();
    assert!(completions > 0, "{out}");
    let goodput: f64 = json_field(&out, "goodput_mbps").parse().unwrap();
    let retx: u64 = json_field(&out, "retransmissions").parse().unwrap();
    let ce_echoed: u64 = json_field(&out, "ce_echoed").parse().unwrap();
    println!(
        "netns loss {loss:2}% CE {ce}%: {completions} messages, goodput {goodput:.1} Mbit/s, \
         {retx} retransmissions, {ce_echoed} CE echoed, integrity OK"
    );
    if loss > 0 {
        assert!(retx > 0, "no retransmissions at {loss}% loss: {out}");
    }
    if ce > 0 {
        assert!(ce_echoed > 0, "no CE echoed at {ce}% marking: {out}");
    }
}

#[test]
fn netns_bench_through_nftables_loss_and_ce() {
    if let Some(why) = skip_reason() {
        println!("SKIPPED netns_bench_through_nftables_loss_and_ce: {why}");
        return;
    }
    let ns = match Namespaces::create() {
        Ok(ns) => ns,
        Err(e) => {
            println!(
                "SKIPPED netns_bench_through_nftables_loss_and_ce: cannot create namespaces: {e}"
            );
            return;
        }
    };
    bench(&ns, 0, 0);
    bench(&ns, 1, 5);
    bench(&ns, 10, 5);
}

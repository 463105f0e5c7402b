//! The libfabric provider (`fabric/`) proven by software nobody
//! here wrote: the `fabric` step of `cargo xtask test` and
//! `cargo xtask bench --fabric`.
//!
//! The step, in order:
//!
//! 1. Debian packages: `libfabric-bin` (`fi_info`, `fi_pingpong`),
//!    `libfabric-dev` (headers for the provider's bindgen and the C tests),
//!    `libclang-dev` (bindgen), `openmpi-bin`/`libopenmpi-dev`, `nftables`
//!    (the loss runs), installed with apt-get when root.
//! 2. The provider crate: `cargo clippy -p metaroce-fabric --all-targets`,
//!    its unit tests, a release build; `target/release/libmetaroce_fi.so`
//!    is copied to `target/fabric/libmetaroce-fi.so` (libfabric loads only
//!    `lib*-fi.so` files) and every tool runs with `FI_PROVIDER_PATH`
//!    pointing at this run's own copy of it (`target/fabric/run-PID/`, with
//!    the test programs: a rebuild or a parallel run meanwhile cannot pull
//!    a file from under a running test),
//!    `FI_METAROCE_ADDR=127.0.0.1` and `FI_METAROCE_PORT_RANGE` set to a
//!    range of ports free at the start of this run.
//! 3. `fi_info -p metaroce -v` lists the provider and its capabilities.
//! 4. `fi_pingpong -e rdm` (plain and `-m tagged`, `-c` data check) at 8 B,
//!    4 KiB, 64 KiB and 1 MiB: a server and a client process on loopback.
//! 5. The C tests of `fabric/tests/c/` (RMA, tagged, errors, threads),
//!    built with the system `cc ... -lfabric`; each prints `N passed, N
//!    failed`.
//! 6. The MPI programs of `fabric/tests/mpi/` (ping-pong, point-to-point
//!    semantics, `MPI_THREAD_MULTIPLE`, 16 MiB
//!    `MPI_Allreduce`, `MPI_Alltoall`), `mpirun -np 2` and `-np 4` through
//!    Open MPI's `ofi` MTL restricted to the provider; then again with 1 %
//!    random loss of the provider's UDP packets (nftables on loopback, a
//!    table of this run only, deleted afterwards; root only, else skipped
//!    and said so), after two `fi_pingpong -c` runs through the same loss.
//!
//! Every child process runs in its own process group with a deadline; on
//! a hang the group is killed and the failure shows both sides' output.
//! Control ports (fi_pingpong's TCP side channel) are picked free per run.
//!
//! `METAROCE_FABRIC_PROVIDER=tcp cargo xtask test fabric` runs the same
//! tools against libfabric's own `tcp` provider (or `sockets`) without
//! building the crate: how the harness itself is checked. The C tests'
//! promises beyond libfabric's (use after close, no atomics, ...) are then
//! skipped, not passed.
//!
//! `cargo xtask bench --fabric` (`bench`): fi_pingpong latency and
//! bandwidth of `metaroce`, `tcp` and `udp` at the same sizes, then
//! `metaroce` and `tcp` under 1 % random drop of their own packets, and a
//! 16 MiB `MPI_Allreduce` over `metaroce` beside Open MPI over TCP; a table
//! and `target/metaroce/bench-fabric.csv`. The allreduce runs again under
//! 1 % loss of each transport's own packets (Open MPI's TCP listening
//! ports held to a range with `btl_tcp_port_min_v4`/`btl_tcp_port_range_v4`).

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::system;
use crate::test::Context;
use crate::util::{self, Error};

/// The provider the step proves (libfabric's name for it).
const PROVIDER: &str = "metaroce";
/// Transfer sizes of the fi_pingpong runs and the bench.
const SIZES: &[usize] = &[8, 4096, 65536, 1 << 20];
/// Capability names `fi_info -v` must show for the provider.
const CAPS: &[&str] = &[
    "FI_MSG",
    "FI_TAGGED",
    "FI_RMA",
    "FI_EP_RDM",
    "FI_SOCKADDR_IN",
];
/// The C test programs (`fabric/tests/c/NAME.c`).
const C_TESTS: &[&str] = &["rma", "tagged", "errors", "threads"];
/// The MPI programs (`fabric/tests/mpi/NAME.c`) with their arguments.
const MPI_PROGRAMS: &[(&str, &[&str])] = &[
    ("pingpong", &["10"]),
    ("allreduce", &["3"]),
    ("alltoall", &["16384"]),
    // Wildcards, probe, matched probe, ssend, cancel, message order.
    ("semantics", &[]),
    // MPI_THREAD_MULTIPLE: four threads per rank (even rank counts).
    ("threads", &[]),
];
/// Ports in the provider's range (`FI_METAROCE_PORT_RANGE`), and in the
/// tcp provider's (`FI_TCP_PORT_LOW_RANGE`/`HIGH`).
const RANGE_LEN: u16 = 128;

// ---- packages -------------------------------------------------------------

/// What the step needs from Debian, and why.
const PACKAGES: &[(&str, &str)] = &[
    ("libfabric-bin", "fi_info, fi_pingpong"),
    (
        "libfabric-dev",
        "rdma/*.h for the provider's bindgen and the C tests",
    ),
    ("libclang-dev", "bindgen"),
    ("openmpi-bin", "mpirun"),
    ("libopenmpi-dev", "mpicc, mpi.h"),
    ("nftables", "nft, the 1 % loss runs"),
];

/// Whether Debian package `name` is installed (dpkg's status), or, without
/// dpkg, whether a file it ships is there.
fn installed(name: &str) -> bool {
    let dpkg = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", name])
        .stderr(Stdio::null())
        .output();
    match dpkg {
        Ok(out) => String::from_utf8_lossy(&out.stdout).contains("install ok installed"),
        Err(_) => {
            let probe = match name {
                "libfabric-bin" => "/usr/bin/fi_pingpong",
                "libfabric-dev" => "/usr/include/rdma/fabric.h",
                "libclang-dev" => "/usr/lib/x86_64-linux-gnu/libclang.so",
                "openmpi-bin" => "/usr/bin/mpirun",
                "libopenmpi-dev" => "/usr/bin/mpicc",
                _ => "/usr/sbin/nft",
            };
            Path::new(probe).exists()
        }
    }
}

/// Installs what is missing of [`PACKAGES`] (root), or says what to run.
pub fn ensure_packages() -> Result<(), Error> {
    let missing: Vec<(&str, &str)> = PACKAGES
        .iter()
        .copied()
        .filter(|(p, _)| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = missing.iter().map(|(p, _)| *p).collect();
    let install = format!(
        "apt-get install -y --no-install-recommends {}",
        names.join(" ")
    );
    if !system::is_root() {
        return Err(Error::new(format!(
            "missing system packages: {}\nrun as root:\n    apt-get update && {install}",
            names.join(", ")
        )));
    }
    let why: Vec<String> = missing.iter().map(|(p, w)| format!("{p} ({w})")).collect();
    println!(
        "fabric: installing {} for the libfabric provider's tests",
        why.join(", ")
    );
    util::run(Command::new("apt-get").arg("update"))?;
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "--no-install-recommends"])
        .args(&names)
        .env("DEBIAN_FRONTEND", "noninteractive");
    util::run(&mut cmd)
}

// ---- child processes with deadlines --------------------------------------

/// How a child process ended, with everything it printed.
#[derive(Debug)]
pub struct Finished {
    pub what: String,
    pub status: Option<ExitStatus>,
    pub timed_out: Option<Duration>,
    pub stdout: String,
    pub stderr: String,
    pub took: Duration,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.timed_out.is_none() && self.status.is_some_and(|s| s.success())
    }

    /// `exit status: 1`, `killed after 60 s without finishing`, ...
    pub fn outcome(&self) -> String {
        match (self.timed_out, self.status) {
            (Some(limit), _) => format!(
                "killed after {} without finishing (hang)",
                util::fmt_duration(limit)
            ),
            (None, Some(s)) => s.to_string(),
            (None, None) => "no exit status".into(),
        }
    }

    /// The command, its outcome and its output, for a failure message.
    pub fn report(&self) -> String {
        let mut s = format!("--- {} ({})\n", self.what, self.outcome());
        for (label, text) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            let text = text.trim_end();
            if text.is_empty() {
                continue;
            }
            // The end is what explains a failure; long outputs are cut.
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(60);
            s.push_str(&format!("  [{label}]\n"));
            if from > 0 {
                s.push_str(&format!("  ... ({from} lines before)\n"));
            }
            for line in &lines[from..] {
                s.push_str("  ");
                s.push_str(line);
                s.push('\n');
            }
        }
        s
    }
}

/// A started child: its own process group, stdout and stderr collected.
#[derive(Debug)]
pub struct Running {
    what: String,
    child: Child,
    started: Instant,
    out: mpsc::Receiver<(bool, String)>,
}

/// The command as a reader would type it, with the variables it sets.
fn shown(cmd: &Command) -> String {
    let mut s = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            s.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    s.push_str(&util::display(cmd));
    s
}

/// Starts `cmd` in a process group of its own (so a hang is ended with
/// everything it started) and echoes it.
pub fn spawn(cmd: &mut Command) -> Result<Running, Error> {
    let what = shown(cmd);
    // In this run's folder when it has one: libpsm2, which libfabric loads,
    // writes `PROGRAM.HOST-PID,HOST.btr` backtraces into the working
    // directory of a crashing process (not into the source tree, then).
    let run = util::target_dir()
        .join("fabric")
        .join(format!("run-{}", std::process::id()));
    if cmd.get_current_dir().is_none() && run.is_dir() {
        cmd.current_dir(&run);
    }
    println!("$ {what}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::new(format!("cannot run `{what}`: {e}")))?;
    let (tx, rx) = mpsc::channel();
    let streams: [(bool, Option<Box<dyn Read + Send>>); 2] = [
        (
            true,
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
        (
            false,
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
    ];
    for (is_out, stream) in streams {
        if let Some(mut stream) = stream {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = stream.read_to_end(&mut bytes);
                let _ = tx.send((is_out, String::from_utf8_lossy(&bytes).into_owned()));
            });
        }
    }
    Ok(Running {
        what,
        child,
        started: Instant::now(),
        out: rx,
    })
}

/// Sends `signal` to process group `pgid` (the child and what it started).
fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

impl Running {
    /// Waits for the child up to `limit` after its start; past it, the
    /// group gets SIGTERM, then SIGKILL two seconds later.
    pub fn wait(mut self, limit: Duration) -> Finished {
        let mut timed_out = None;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) => {}
                Err(_) => break None,
            }
            if self.started.elapsed() > limit {
                timed_out = Some(limit);
                let pgid = self.child.id();
                signal_group(pgid, "TERM");
                let grace = Instant::now();
                while grace.elapsed() < Duration::from_secs(2) {
                    if let Ok(Some(_)) = self.child.try_wait() {
                        break;
                    }
                    sleep(Duration::from_millis(50));
                }
                signal_group(pgid, "KILL");
                let _ = self.child.kill();
                break self.child.wait().ok();
            }
            sleep(Duration::from_millis(20));
        };
        // Whatever the group left running goes too (an orphaned rank).
        signal_group(self.child.id(), "KILL");
        let took = self.started.elapsed();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        for _ in 0..2 {
            match self.out.recv_timeout(Duration::from_secs(5)) {
                Ok((true, text)) => stdout = text,
                Ok((false, text)) => stderr = text,
                Err(_) => {
                    stderr.push_str("\n(output incomplete: a descendant kept the pipe open)");
                    break;
                }
            }
        }
        Finished {
            what: self.what,
            status,
            timed_out,
            stdout,
            stderr,
            took,
        }
    }

    /// Waits up to `extra` more from now (see [`Running::wait`]).
    pub fn wait_more(self, extra: Duration) -> Finished {
        let limit = self.started.elapsed() + extra;
        self.wait(limit)
    }

    /// Ends the child now (a server whose client failed).
    pub fn stop(self) -> Finished {
        signal_group(self.child.id(), "KILL");
        let limit = self.started.elapsed() + Duration::from_secs(5);
        self.wait(limit)
    }

    /// Whether the child has exited already.
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

/// Runs `cmd` to its end or its deadline.
pub fn run_for(cmd: &mut Command, limit: Duration) -> Result<Finished, Error> {
    Ok(spawn(cmd)?.wait(limit))
}

// ---- ports -----------------------------------------------------------------

/// A TCP port free on loopback now (the kernel's pick).
pub fn free_tcp_port() -> Result<u16, Error> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The first of `RANGE_LEN` consecutive ports, below the kernel's
/// ephemeral range, all free for UDP and TCP now. The search starts at a
/// place of this process's own, so parallel runs take different ranges.
pub fn free_range() -> Result<u16, Error> {
    let slots = (30000 - 20000) / RANGE_LEN as u32;
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
    for i in 0..slots {
        let base = 20000 + ((seed + i) % slots) as u16 * RANGE_LEN;
        let free = (base..base + RANGE_LEN).all(|p| {
            UdpSocket::bind(("127.0.0.1", p)).is_ok() && TcpListener::bind(("127.0.0.1", p)).is_ok()
        });
        if free {
            return Ok(base);
        }
    }
    Err(Error::new("no free range of ports in 20000-29999"))
}

/// Whether something listens on TCP `port` (`/proc/net/tcp`, `tcp6`):
/// how the fi_pingpong client knows its server is ready, without taking
/// the server's one control connection.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|path| {
        std::fs::read_to_string(path).is_ok_and(|table| {
            table.lines().skip(1).any(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

// ---- providers ---------------------------------------------------------------

/// A libfabric provider under test: its name, the environment its
/// processes get, and the nftables match of its own data packets.
#[derive(Debug, Clone)]
pub struct Provider {
    pub name: String,
    pub env: Vec<(String, String)>,
    /// The protocol and port range of its data (loss rules), if known.
    pub ports: Option<(&'static str, u16, u16)>,
}

impl Provider {
    /// `metaroce` from `dir` (the folder holding `libmetaroce-fi.so`).
    pub fn metaroce(dir: &Path, base: u16) -> Provider {
        let hi = base + RANGE_LEN - 1;
        Provider {
            name: PROVIDER.into(),
            env: vec![
                ("FI_PROVIDER_PATH".into(), dir.display().to_string()),
                ("FI_METAROCE_ADDR".into(), "127.0.0.1".into()),
                ("FI_METAROCE_PORT_RANGE".into(), format!("{base}-{hi}")),
            ],
            ports: Some(("udp", base, hi)),
        }
    }

    /// One of libfabric's own: `tcp` (its data ports held to a range),
    /// `udp`, `sockets`.
    pub fn builtin(name: &str, base: u16) -> Provider {
        let hi = base + RANGE_LEN - 1;
        let mut env = vec![];
        let mut ports = None;
        if name == "tcp" {
            env.push(("FI_TCP_IFACE".into(), "lo".into()));
            env.push(("FI_TCP_PORT_LOW_RANGE".into(), base.to_string()));
            env.push(("FI_TCP_PORT_HIGH_RANGE".into(), hi.to_string()));
            ports = Some(("tcp", base, hi));
        } else if name == "udp" {
            env.push(("FI_UDP_IFACE".into(), "lo".into()));
        } else if name == "sockets" {
            env.push(("FI_SOCKETS_IFACE".into(), "lo".into()));
        }
        Provider {
            name: name.into(),
            env,
            ports,
        }
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }
}

// ---- nftables loss -----------------------------------------------------------

/// An nftables table of this run dropping `percent` % of the provider's
/// packets on loopback (counted); deleted when dropped, also on failure.
#[derive(Debug)]
pub struct Loss {
    table: String,
}

impl Loss {
    pub fn start(p: &Provider, percent: u32) -> Result<Loss, Error> {
        let Some((proto, lo, hi)) = p.ports else {
            return Err(Error::new(format!(
                "provider {} has no port range to drop packets of",
                p.name
            )));
        };
        remove_stale_tables();
        let table = format!("metaroce_fabric_{}", std::process::id());
        let rules = format!(
            "table inet {table} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    oifname \"lo\" {proto} dport {lo}-{hi} counter
    oifname \"lo\" {proto} sport {lo}-{hi} {proto} dport != {lo}-{hi} counter
    oifname \"lo\" {proto} dport {lo}-{hi} numgen random mod 100 < {percent} counter drop
    oifname \"lo\" {proto} sport {lo}-{hi} {proto} dport != {lo}-{hi} numgen random mod 100 < {percent} counter drop
  }}
}}
"
        );
        let path = std::env::temp_dir().join(format!("{table}.nft"));
        std::fs::write(&path, rules)?;
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &table])
            .stderr(Stdio::null())
            .status();
        let loaded = util::run(Command::new("nft").arg("-f").arg(&path));
        let _ = std::fs::remove_file(&path);
        loaded?;
        println!(
            "fabric: nftables table inet {table}: {percent} % of {proto} ports {lo}-{hi} on lo dropped"
        );
        Ok(Loss { table })
    }

    /// `(seen, dropped)` packets so far, from the rules' counters.
    pub fn counts(&self) -> (u64, u64) {
        let out = Command::new("nft")
            .args(["list", "table", "inet", &self.table])
            .output();
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        parse_counters(&text)
    }
}

/// `(seen, dropped)` from `nft list table` of a [`Loss`] table: the
/// counters of the rules ending in `drop`, and of the others.
pub fn parse_counters(text: &str) -> (u64, u64) {
    let (mut seen, mut dropped) = (0, 0);
    for line in text.lines() {
        let Some(rest) = line.split("counter packets ").nth(1) else {
            continue;
        };
        let n: u64 = rest
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if line.trim_end().ends_with("drop") {
            dropped += n;
        } else {
            seen += n;
        }
    }
    (seen, dropped)
}

/// Tables of runs that ended without deleting theirs (killed by a signal).
fn remove_stale_tables() {
    let Ok(out) = Command::new("nft").args(["list", "tables"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.strip_prefix("table inet ") else {
            continue;
        };
        let Some(pid) = name.trim().strip_prefix("metaroce_fabric_") else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            println!("fabric: deleting the nftables table of an ended run: {name}");
            let _ = Command::new("nft")
                .args(["delete", "table", "inet", name.trim()])
                .status();
        }
    }
}

impl Drop for Loss {
    fn drop(&mut self) {
        let (seen, dropped) = self.counts();
        println!(
            "fabric: nftables table inet {} deleted ({dropped} of {seen} packets dropped)",
            self.table
        );
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

// ---- fi_info -------------------------------------------------------------------

/// `fi_info -p PROV -v` lists the provider with [`CAPS`].
fn fi_info_check(p: &Provider) -> Result<(), String> {
    let mut cmd = p.command("fi_info");
    cmd.args(["-p", &p.name, "-t", "FI_EP_RDM", "-v"]);
    let f = run_for(&mut cmd, Duration::from_secs(30)).map_err(|e| e.to_string())?;
    if !f.ok() {
        return Err(format!("fi_info failed\n{}", f.report()));
    }
    let provider_line = f
        .stdout
        .lines()
        .any(|l| l.contains("prov_name:") && l.contains(&p.name));
    let missing: Vec<&str> = CAPS
        .iter()
        .copied()
        .filter(|c| !f.stdout.contains(c))
        .collect();
    if !provider_line || !missing.is_empty() {
        return Err(format!(
            "fi_info -v: provider {} listed: {provider_line}, capability names missing: {missing:?}\n{}",
            p.name,
            f.report()
        ));
    }
    let caps_line = f
        .stdout
        .lines()
        .find(|l| l.trim_start().starts_with("caps:"))
        .unwrap_or("")
        .trim();
    println!("fi_info: {} listed, {caps_line}", p.name);
    Ok(())
}

// ---- fi_pingpong -------------------------------------------------------------

/// One fi_pingpong result line: `(usec per transfer, MB/s)`.
pub fn parse_pingpong(text: &str) -> Option<(f64, f64)> {
    text.lines().find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() != 8 || !cols[0].starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        let mbps = cols[5].parse::<f64>().ok()?;
        let usec = cols[6].parse::<f64>().ok()?;
        Some((usec, mbps))
    })
}

/// A fi_pingpong result: the client's line, and whether both sides then
/// exited 0 (`Err` with both sides' output when not).
#[derive(Debug)]
pub struct Pong {
    pub usec: f64,
    pub mbps: f64,
    pub exits: Result<(), String>,
}

/// A fi_pingpong run: server and client on loopback. `Err` (with both
/// sides' output) unless the client printed its result line.
pub fn pingpong(
    p: &Provider,
    tagged: bool,
    size: usize,
    iters: u32,
    check: bool,
) -> Result<Pong, String> {
    let port = free_tcp_port().map_err(|e| e.to_string())?;
    let mut args: Vec<String> = vec!["-p".into(), p.name.clone(), "-e".into(), "rdm".into()];
    if tagged {
        args.extend(["-m".into(), "tagged".into()]);
    }
    if check {
        args.push("-c".into());
    }
    args.extend([
        "-S".into(),
        size.to_string(),
        "-I".into(),
        iters.to_string(),
    ]);
    let limit = Duration::from_secs(120);
    let mut server_cmd = p.command("fi_pingpong");
    server_cmd.args(&args).args(["-B", &port.to_string()]);
    let mut server = spawn(&mut server_cmd).map_err(|e| e.to_string())?;
    let ready = Instant::now();
    while !listening(port) {
        if server.exited() || ready.elapsed() > Duration::from_secs(20) {
            let f = server.stop();
            return Err(format!(
                "the fi_pingpong server never listened on control port {port}\n{}",
                f.report()
            ));
        }
        sleep(Duration::from_millis(20));
    }
    let mut client_cmd = p.command("fi_pingpong");
    client_cmd
        .args(&args)
        .args(["-P", &port.to_string(), "127.0.0.1"]);
    let client = spawn(&mut client_cmd)
        .map_err(|e| e.to_string())?
        .wait(limit);
    let server = if client.ok() {
        server.wait_more(Duration::from_secs(30))
    } else {
        // Give the server a moment to print its side of the failure.
        sleep(Duration::from_millis(500));
        server.wait_more(Duration::from_secs(3))
    };
    let both = || format!("{}{}", client.report(), server.report());
    // A client killed at its deadline printed nothing that counts.
    let result = parse_pingpong(&client.stdout).filter(|_| client.timed_out.is_none());
    let Some((usec, mbps)) = result else {
        return Err(format!(
            "fi_pingpong {}: client {} without a result line, server {}\n{}",
            p.name,
            client.outcome(),
            server.outcome(),
            both()
        ));
    };
    // After its result line fi_pingpong still exchanges a last message
    // (pp_finalize) and closes: a failure there fails the test, while the
    // bench keeps the figures and says so.
    let exits = if client.ok() && server.ok() {
        Ok(())
    } else {
        Err(format!(
            "fi_pingpong {}: the result line came ({usec:.1} usec/xfer) but client {}, server {}\n{}",
            p.name,
            client.outcome(),
            server.outcome(),
            both()
        ))
    };
    Ok(Pong { usec, mbps, exits })
}

// ---- C tests and MPI programs -------------------------------------------------

/// `N passed, N failed` at the end of a line (after any prefix).
pub fn passed_failed(line: &str) -> Option<(u64, u64)> {
    let (head, rest) = line.trim().split_once(" passed, ")?;
    let passed = head.split_whitespace().last()?.parse().ok()?;
    let failed = rest.split(" failed").next()?.trim().parse().ok()?;
    Some((passed, failed))
}

fn compile(compiler: &str, source: &Path, out: &Path, libs: &[&str]) -> Result<(), Error> {
    let mut cmd = Command::new(compiler);
    cmd.args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(source)
        .args(libs);
    let f = run_for(&mut cmd, Duration::from_secs(120))?;
    if f.ok() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "compiling {} failed\n{}",
            source.display(),
            f.report()
        )))
    }
}

/// The cases a C test program skipped, `skip NAME` lines, each with the
/// reason the case printed (its last indented line before).
pub fn skipped_cases(stdout: &str) -> Vec<(String, String)> {
    let mut skips = Vec::new();
    let mut last_note = "";
    for line in stdout.lines() {
        if let Some(case) = line.strip_prefix("skip ") {
            let reason = if last_note.is_empty() {
                "skipped by the program"
            } else {
                last_note
            };
            skips.push((case.trim().to_string(), reason.to_string()));
            last_note = "";
        } else if let Some(note) = line.strip_prefix("    ") {
            last_note = note.trim();
        } else {
            last_note = "";
        }
    }
    skips
}

/// The counts a program printed, or a failure with its output.
fn counted(f: &Finished, name: &str) -> (u64, u64, Option<String>) {
    let counts = f.stdout.lines().rev().find_map(passed_failed);
    match counts {
        Some((passed, failed)) if f.ok() && failed == 0 => (passed, 0, None),
        Some((passed, failed)) => (
            passed,
            failed.max(1),
            Some(format!(
                "{name}: {passed} passed, {failed} failed\n{}",
                f.report()
            )),
        ),
        None => (
            0,
            1,
            Some(format!("{name}: printed no counts\n{}", f.report())),
        ),
    }
}

fn mpirun(p: &Provider, np: u32, program: &Path, args: &[&str], verbose: bool) -> Command {
    let mut cmd = p.command("mpirun");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--timeout",
        "240",
        "-np",
        &np.to_string(),
        "--mca",
        "pml",
        "cm",
        "--mca",
        "mtl",
        "ofi",
        "--mca",
        "mtl_ofi_provider_include",
        &p.name,
        "--mca",
        "btl",
        "self",
    ]);
    if verbose {
        cmd.args(["--mca", "mtl_base_verbose", "100"]);
    }
    for (key, _) in &p.env {
        cmd.args(["-x", key]);
    }
    cmd.arg(program).args(args);
    cmd
}

// ---- the test step -------------------------------------------------------------

/// Failures of the step, collected so that every part runs and reports.
#[derive(Debug, Default)]
struct Outcome {
    passed: u64,
    failed: u64,
    failures: Vec<String>,
}

impl Outcome {
    fn pass(&mut self, what: &str) {
        println!("ok   {what}");
        self.passed += 1;
    }

    fn fail(&mut self, what: &str, why: String) {
        println!("FAIL {what}\n{why}");
        self.failed += 1;
        self.failures.push(what.to_string());
    }
}

/// Lints and unit-tests the provider crate (failures are recorded, and
/// the tools still run: their results say more than a lint).
fn lint_and_unit_tests(ctx: &mut Context, o: &mut Outcome) -> Result<(), Error> {
    let clippy = [
        "clippy",
        "-p",
        "metaroce-fabric",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ];
    if let Err(e) = util::run(&mut util::cargo(clippy)) {
        o.fail("cargo clippy -p metaroce-fabric", e.to_string());
    }
    let mut tally = crate::test::Tally::default();
    let skips = crate::test::SkipLog::new("fabric")?;
    let mut command = util::cargo(["test", "-p", "metaroce-fabric"]);
    skips.attach(&mut command);
    let ok = util::run_streaming(&mut command, |line| {
        tally.add_libtest_line(line);
    })?;
    skips.settle(&mut tally, ctx);
    ctx.add(tally);
    if !ok || tally.failed > 0 {
        if tally.failed == 0 {
            // A build error or a crashed test binary: one failure.
            ctx.tally.failed += 1;
        }
        o.failures.push(format!(
            "cargo test -p metaroce-fabric ({} passed, {} failed{})",
            tally.passed,
            tally.failed,
            if ok { "" } else { ", cargo failed: see above" }
        ));
    }
    Ok(())
}

/// This run's own folder, `target/fabric/run-PID/`: the copy of the
/// provider the tools load and the test programs, so that a rebuild or a
/// parallel run replacing a file in place (a truncated mapped file is a
/// SIGBUS) never touches the processes of this run. Folders of runs that
/// have ended are removed here (each stays until the next run, to debug).
pub fn run_dir() -> Result<PathBuf, Error> {
    let dir = util::target_dir().join("fabric");
    std::fs::create_dir_all(&dir)?;
    let own = format!("run-{}", std::process::id());
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(pid) = name.strip_prefix("run-") {
            if name != own && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let run = dir.join(own);
    std::fs::create_dir_all(run.join("bin"))?;
    Ok(run)
}

/// Builds the provider (release), installs it as
/// `target/fabric/libmetaroce-fi.so` and copies it into `run` (see
/// [`run_dir`]), the folder the tools load it from.
pub fn build_provider(run: &Path) -> Result<(), Error> {
    util::run(&mut util::cargo([
        "build",
        "--release",
        "-p",
        "metaroce-fabric",
    ]))?;
    let built = util::target_dir().join("release").join("libmetaroce_fi.so");
    let dir = util::target_dir().join("fabric");
    let installed = dir.join("libmetaroce-fi.so");
    // A new file renamed over the old one: processes that have the old one
    // mapped keep it.
    let tmp = dir.join(format!(".libmetaroce-fi.so.{}", std::process::id()));
    std::fs::copy(&built, &tmp)
        .map_err(|e| Error::new(format!("copying {}: {e}", built.display())))?;
    std::fs::rename(&tmp, &installed)?;
    std::fs::copy(&installed, run.join("libmetaroce-fi.so"))?;
    println!(
        "fabric: {} -> {} (this run loads {})",
        built.display(),
        installed.display(),
        run.join("libmetaroce-fi.so").display()
    );
    Ok(())
}

/// The provider to prove: `metaroce` (built here) unless
/// `METAROCE_FABRIC_PROVIDER` names one of libfabric's own.
fn provider_under_test(
    ctx: &mut Context,
    o: &mut Outcome,
    run: &Path,
    base: u16,
) -> Result<Provider, Error> {
    match std::env::var("METAROCE_FABRIC_PROVIDER") {
        Ok(name) if !name.is_empty() && name != PROVIDER => {
            println!(
                "fabric: METAROCE_FABRIC_PROVIDER={name}: the tools run against libfabric's {name} provider (the metaroce crate is not built)"
            );
            Ok(Provider::builtin(&name, base))
        }
        _ => {
            lint_and_unit_tests(ctx, o)?;
            build_provider(run)?;
            Ok(Provider::metaroce(run, base))
        }
    }
}

/// Test step `fabric`.
pub fn test_step(ctx: &mut Context) -> Result<(), Error> {
    ensure_packages()?;
    let base = free_range()?;
    let mut o = Outcome::default();
    let run = run_dir()?;
    let p = provider_under_test(ctx, &mut o, &run, base)?;

    println!("\n-- fi_info");
    match fi_info_check(&p) {
        Ok(()) => o.pass(&format!("fi_info -p {} lists its capabilities", p.name)),
        Err(why) => o.fail(&format!("fi_info -p {}", p.name), why),
    }

    println!("\n-- fi_pingpong -e rdm -c over loopback");
    for tagged in [false, true] {
        for &size in SIZES {
            let iters = if size >= 1 << 20 { 10 } else { 50 };
            let what = format!(
                "fi_pingpong -p {} -e rdm{} -c -S {size} -I {iters}",
                p.name,
                if tagged { " -m tagged" } else { "" }
            );
            match pingpong(&p, tagged, size, iters, true) {
                Ok(Pong {
                    usec,
                    mbps,
                    exits: Ok(()),
                }) => o.pass(&format!("{what} ({usec:.1} usec/xfer, {mbps:.2} MB/s)")),
                Ok(Pong {
                    exits: Err(why), ..
                }) => o.fail(&what, why),
                Err(why) => o.fail(&what, why),
            }
        }
    }

    println!("\n-- C tests (fabric/tests/c)");
    let root = util::project_root();
    let bin = run.join("bin");
    for name in C_TESTS {
        let source = root.join("fabric/tests/c").join(format!("{name}.c"));
        let exe = bin.join(name);
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        if let Err(e) = compile(&cc, &source, &exe, &["-lfabric", "-lpthread"]) {
            o.fail(&format!("C test {name} (build)"), e.to_string());
            continue;
        }
        let mut cmd = p.command(&exe);
        cmd.arg(&p.name);
        let f = run_for(&mut cmd, Duration::from_secs(900))?;
        print!("{}", f.stdout);
        let (passed, failed, why) = counted(&f, name);
        o.passed += passed;
        o.failed += failed;
        for (case, reason) in skipped_cases(&f.stdout) {
            ctx.skip(&format!("fabric C test {name} {case}"), &reason);
        }
        match why {
            None => println!("ok   C test {name}: {passed} passed"),
            Some(_) => {
                println!(
                    "FAIL C test {name} ({}): {failed} failed case(s) above\n{}",
                    f.outcome(),
                    f.stderr.trim_end()
                );
                o.failures.push(format!("C test {name}"));
            }
        }
    }

    println!("\n-- Open MPI through the ofi MTL, provider {}", p.name);
    let mut programs = Vec::new();
    for (name, args) in MPI_PROGRAMS {
        let source = root.join("fabric/tests/mpi").join(format!("{name}.c"));
        let exe = bin.join(format!("mpi-{name}"));
        match compile("mpicc", &source, &exe, &["-pthread"]) {
            Ok(()) => programs.push((*name, exe, *args)),
            Err(e) => o.fail(&format!("MPI {name} (build)"), e.to_string()),
        }
    }
    mpi_runs(&p, &programs, "", true, &mut o)?;

    println!(
        "\n-- fi_pingpong and Open MPI with 1 % random loss of the provider's packets (nftables)"
    );
    if !system::is_root() {
        ctx.skip(
            "fabric fi_pingpong and MPI under 1 % loss",
            "not running as root (nftables needs it)",
        );
    } else if p.ports.is_none() {
        ctx.skip(
            "fabric fi_pingpong and MPI under 1 % loss",
            &format!("provider {} has no port range to drop", p.name),
        );
    } else {
        let loss = Loss::start(&p, 1)?;
        // fi_pingpong's own data check through the loss first.
        for (tagged, size) in [(false, 65536), (true, 1 << 20)] {
            let what = format!(
                "fi_pingpong -p {} -e rdm{} -c -S {size} -I 20 under 1 % loss",
                p.name,
                if tagged { " -m tagged" } else { "" }
            );
            match pingpong(&p, tagged, size, 20, true) {
                Ok(Pong {
                    usec,
                    mbps,
                    exits: Ok(()),
                }) => o.pass(&format!("{what} ({usec:.1} usec/xfer, {mbps:.2} MB/s)")),
                Ok(Pong {
                    exits: Err(why), ..
                }) => o.fail(&what, why),
                Err(why) => o.fail(&what, why),
            }
        }
        mpi_runs(&p, &programs, " under 1 % loss", false, &mut o)?;
        let (seen, dropped) = loss.counts();
        drop(loss);
        if dropped == 0 {
            o.fail(
                "loss runs dropped packets",
                format!(
                    "the nftables rules dropped none of {seen} packets: the runs were not under loss"
                ),
            );
        }
    }

    ctx.tally.passed += o.passed;
    ctx.tally.failed += o.failed;
    ctx.ran_tests = true;
    println!(
        "fabric ({}): {} passed, {} failed",
        p.name, o.passed, o.failed
    );
    if o.failures.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "fabric against provider {}: {} failed: {}",
            p.name,
            o.failed,
            o.failures.join("; ")
        )))
    }
}

/// Every MPI program at -np 2 and 4; the first run verbose, to show that
/// the ofi MTL was selected with the provider.
fn mpi_runs(
    p: &Provider,
    programs: &[(&str, PathBuf, &[&str])],
    label: &str,
    verify: bool,
    o: &mut Outcome,
) -> Result<(), Error> {
    let mut first = verify;
    for np in [2u32, 4] {
        for (name, exe, args) in programs {
            let what = format!("MPI {name} -np {np} over {}{label}", p.name);
            let f = run_for(
                &mut mpirun(p, np, exe, args, first),
                Duration::from_secs(300),
            )?;
            if first {
                first = false;
                let selected = f.stdout.contains("select: component ofi selected")
                    || f.stderr.contains("select: component ofi selected");
                // Open MPI 4.1 prints the domain name of the fi_info it took.
                let domain = f
                    .stdout
                    .lines()
                    .chain(f.stderr.lines())
                    .find_map(|l| l.split("mtl:ofi:provider: ").nth(1))
                    .unwrap_or("?")
                    .trim()
                    .to_string();
                if selected {
                    o.pass(&format!(
                        "Open MPI selected the ofi MTL with mtl_ofi_provider_include {} (mtl_base_verbose: domain `{domain}`)",
                        p.name
                    ));
                } else {
                    o.fail(
                        "Open MPI selected the ofi MTL",
                        format!("no `select: component ofi selected`\n{}", f.report()),
                    );
                }
            }
            for line in f.stdout.lines().filter(|l| {
                l.starts_with("pingpong ")
                    || l.starts_with("allreduce ")
                    || l.starts_with("alltoall ")
            }) {
                println!("  {line}");
            }
            let (passed, failed, why) = counted(&f, &what);
            o.passed += passed;
            match why {
                None => println!(
                    "ok   {what}: {passed} passed ({})",
                    util::fmt_duration(f.took)
                ),
                Some(why) => {
                    o.failed += failed - 1;
                    o.fail(&what, why);
                }
            }
        }
    }
    Ok(())
}

// ---- the bench ------------------------------------------------------------------

/// One row of the bench.
#[derive(Debug, Clone)]
struct Row {
    test: &'static str,
    provider: String,
    bytes: usize,
    loss: u32,
    usec: Option<f64>,
    mbps: Option<f64>,
    ms: Option<f64>,
    /// Runs that gave a figure (the row holds their median).
    runs: usize,
    note: String,
}

/// fi_pingpong runs per bench row (the median is the row's figure).
const BENCH_RUNS: usize = 3;

fn iterations(size: usize) -> u32 {
    match size {
        0..=4096 => 1000,
        4097..=65536 => 300,
        _ => 50,
    }
}

/// Mean MPI_Allreduce 16 MiB time (ms) from the program's output.
pub fn parse_allreduce(text: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix("allreduce 16 MiB")?;
        let ms = rest.split(": ").nth(1)?.split_whitespace().next()?;
        ms.parse().ok()
    })
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`): the bench's
/// figures depend on what else the machine runs.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Entry point of `cargo xtask bench --fabric`.
pub fn bench() -> Result<(), Error> {
    ensure_packages()?;
    let load_before = load_average();
    let run = run_dir()?;
    build_provider(&run)?;
    let mut rows: Vec<Row> = Vec::new();
    let mut providers = vec![Provider::metaroce(&run, free_range()?)];
    for name in ["tcp", "udp"] {
        // Each its own range: a rule for one never drops another's.
        let base = loop {
            let b = free_range()?;
            if providers
                .iter()
                .all(|p| p.ports.is_none_or(|(_, lo, _)| lo != b))
            {
                break b;
            }
        };
        providers.push(Provider::builtin(name, base));
    }
    for loss in [0u32, 1] {
        for p in &providers {
            let guard = if loss > 0 {
                if p.ports.is_none() || !system::is_root() {
                    let why = if system::is_root() {
                        "n/a: no port range to drop"
                    } else {
                        "skipped: not root (nftables)"
                    };
                    for &size in SIZES {
                        rows.push(Row {
                            test: "fi_pingpong",
                            provider: p.name.clone(),
                            bytes: size,
                            loss,
                            usec: None,
                            mbps: None,
                            ms: None,
                            runs: 0,
                            note: why.to_string(),
                        });
                    }
                    continue;
                }
                Some(Loss::start(p, loss)?)
            } else {
                None
            };
            for &size in SIZES {
                // The median of BENCH_RUNS runs (by usec/xfer), so one
                // run disturbed by the shared machine does not decide.
                let mut results: Vec<(f64, f64)> = Vec::new();
                let mut notes: Vec<String> = Vec::new();
                for _ in 0..BENCH_RUNS {
                    match pingpong(p, false, size, iterations(size), false) {
                        Ok(Pong { usec, mbps, exits }) => {
                            // The figures stand; a side that failed after
                            // them (fi_pingpong's last exchange) is said.
                            if let Err(why) = exits {
                                println!("{why}");
                                notes.push(
                                    "a side exited non-zero after the result line (output above)"
                                        .into(),
                                );
                            }
                            results.push((usec, mbps));
                        }
                        Err(why) => {
                            println!("{why}");
                            notes.push("FAILED run (output above)".into());
                        }
                    }
                }
                results.sort_by(|a, b| a.0.total_cmp(&b.0));
                let median = results.get(results.len().saturating_sub(1) / 2).copied();
                // MB/s as fi_pingpong defines it (bytes per usec per
                // transfer), unrounded: it prints two decimals, 0.00 at 8 B.
                let (usec, mbps) = (median.map(|m| m.0), median.map(|m| size as f64 / m.0));
                notes.dedup();
                let mut note = notes.join("; ");
                if median.is_none() {
                    note = format!("FAILED: {note}");
                }
                rows.push(Row {
                    test: "fi_pingpong",
                    provider: p.name.clone(),
                    bytes: size,
                    loss,
                    usec,
                    mbps,
                    ms: None,
                    runs: results.len(),
                    note,
                });
            }
            drop(guard);
        }
    }

    // MPI_Allreduce 16 MiB: metaroce through the ofi MTL, Open MPI's TCP.
    let exe = run.join("bin").join("mpi-allreduce");
    compile(
        "mpicc",
        &util::project_root().join("fabric/tests/mpi/allreduce.c"),
        &exe,
        &[],
    )?;
    let metaroce = &providers[0];
    // Open MPI's TCP transport with its listening ports held to a range of
    // its own, so that the loss rows drop exactly its data packets.
    let ompi_lo = loop {
        let b = free_range()?;
        if providers
            .iter()
            .all(|p| p.ports.is_none_or(|(_, lo, _)| lo != b))
        {
            break b;
        }
    };
    let ompi_tcp = Provider {
        name: "ompi-tcp".into(),
        env: vec![],
        ports: Some(("tcp", ompi_lo, ompi_lo + RANGE_LEN - 1)),
    };
    let over_tcp = || {
        let mut cmd = Command::new("mpirun");
        cmd.args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--timeout",
            "240",
            "-np",
            "2",
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "tcp,self",
            "--mca",
            "btl_tcp_if_include",
            "lo",
            "--mca",
            "btl_tcp_port_min_v4",
            &ompi_lo.to_string(),
            "--mca",
            "btl_tcp_port_range_v4",
            &RANGE_LEN.to_string(),
        ])
        .arg(&exe)
        .arg("5");
        cmd
    };
    for loss in [0u32, 1] {
        for (p, mut cmd) in [
            (metaroce, mpirun(metaroce, 2, &exe, &["5"], false)),
            (&ompi_tcp, over_tcp()),
        ] {
            if loss > 0 && !system::is_root() {
                continue;
            }
            let guard = if loss > 0 {
                Some(Loss::start(p, loss)?)
            } else {
                None
            };
            let f = run_for(&mut cmd, Duration::from_secs(300))?;
            drop(guard);
            let ms = parse_allreduce(&f.stdout).filter(|_| f.ok());
            if ms.is_none() {
                println!("{}", f.report());
            }
            rows.push(Row {
                test: "mpi_allreduce_16MiB_np2",
                provider: p.name.clone(),
                bytes: 16 << 20,
                loss,
                usec: None,
                mbps: None,
                ms,
                runs: usize::from(ms.is_some()),
                note: if ms.is_some() {
                    String::new()
                } else {
                    "FAILED (output above)".into()
                },
            });
        }
    }

    write_csv(&rows)?;
    print_table(&rows);
    println!(
        "\nload average (1/5/15 min) at the start: {load_before}; at the end: {} ({} CPUs)",
        load_average(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if rows
        .iter()
        .any(|r| r.provider == PROVIDER && r.note.starts_with("FAILED"))
    {
        return Err(Error::new(
            "some metaroce runs failed (their output is above; rows marked FAILED)",
        ));
    }
    Ok(())
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}")).unwrap_or_default()
}

fn write_csv(rows: &[Row]) -> Result<(), Error> {
    let dir = util::target_dir().join("metaroce");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("bench-fabric.csv");
    let mut s = String::from(
        "test,provider,bytes,loss_percent,usec_per_xfer,mb_per_sec,allreduce_ms,runs,note\n",
    );
    for r in rows {
        s.push_str(&format!(
            "{},{},{},{},{},{},{},{},{}\n",
            r.test,
            r.provider,
            r.bytes,
            r.loss,
            opt(r.usec, 2),
            opt(r.mbps, 4),
            opt(r.ms, 2),
            r.runs,
            r.note.replace(',', ";")
        ));
    }
    std::fs::write(&path, s)?;
    println!("fabric bench: {}", path.display());
    Ok(())
}

fn find<'a>(rows: &'a [Row], provider: &str, bytes: usize, loss: u32) -> Option<&'a Row> {
    rows.iter().find(|r| {
        r.test == "fi_pingpong" && r.provider == provider && r.bytes == bytes && r.loss == loss
    })
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The goal of one comparison: `1.23x ok`, `0.80x MISSED`, or `-`.
fn goal(r: Option<f64>, met: impl Fn(f64) -> bool) -> String {
    match r {
        Some(r) => format!("{r:.2}x {}", if met(r) { "ok" } else { "MISSED" }),
        None => "-".into(),
    }
}

fn print_table(rows: &[Row]) {
    println!(
        "\nfi_pingpong -e rdm on loopback, this run, median of {BENCH_RUNS} runs (usec/xfer | MB/s):\n"
    );
    println!("| loss | bytes | metaroce | tcp | udp | bw metaroce/tcp (goal >= 1 at >= 64 KiB; >= 3 under loss) | latency metaroce/tcp (goal <= 2) |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for loss in [0u32, 1] {
        for &size in SIZES {
            let cell = |prov: &str| match find(rows, prov, size, loss) {
                Some(r) if r.usec.is_some() => {
                    let digits = if r.mbps.unwrap_or(0.0) < 1.0 { 4 } else { 2 };
                    format!("{} \\| {}", opt(r.usec, 1), opt(r.mbps, digits))
                }
                Some(r) => r.note.clone(),
                None => "-".into(),
            };
            let m = find(rows, PROVIDER, size, loss);
            let t = find(rows, "tcp", size, loss);
            let bw = ratio(m.and_then(|r| r.mbps), t.and_then(|r| r.mbps));
            let lat = ratio(m.and_then(|r| r.usec), t.and_then(|r| r.usec));
            let bw_goal = if loss > 0 {
                goal(bw, |r| r >= 3.0)
            } else if size >= 65536 {
                goal(bw, |r| r >= 1.0)
            } else {
                bw.map(|r| format!("{r:.2}x")).unwrap_or("-".into())
            };
            let lat_goal = if loss == 0 {
                goal(lat, |r| r <= 2.0)
            } else {
                lat.map(|r| format!("{r:.2}x")).unwrap_or("-".into())
            };
            println!(
                "| {loss} % | {size} | {} | {} | {} | {bw_goal} | {lat_goal} |",
                cell(PROVIDER),
                cell("tcp"),
                cell("udp")
            );
        }
    }
    println!(
        "\nMPI_Allreduce 16 MiB of doubles, -np 2 on loopback (mean of 5, slowest rank; loss: 1 % of each transport's own packets):\n"
    );
    for r in rows.iter().filter(|r| r.test.starts_with("mpi_allreduce")) {
        let how = if r.provider == "ompi-tcp" {
            "Open MPI over TCP (pml ob1, btl tcp,self)".to_string()
        } else {
            format!("{} (pml cm, mtl ofi)", r.provider)
        };
        let other = rows.iter().find(|o| {
            o.test == r.test
                && o.loss == r.loss
                && o.provider == "ompi-tcp"
                && r.provider != "ompi-tcp"
        });
        let vs = match (r.ms, other.and_then(|o| o.ms)) {
            (Some(m), Some(t)) if m > 0.0 && t >= m => {
                format!("  ({:.2}x faster than Open MPI over TCP)", t / m)
            }
            (Some(m), Some(t)) if t > 0.0 => {
                format!("  ({:.2}x slower than Open MPI over TCP)", m / t)
            }
            _ => String::new(),
        };
        match r.ms {
            Some(ms) => println!("  {} % loss  {how:<44} {ms:>10.2} ms{vs}", r.loss),
            None => println!("  {} % loss  {how:<44} {}", r.loss, r.note),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pingpong_result_lines_are_read() {
        let text =
            "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                    64k     100     =100     12m         0.40s     33.06    1982.14       0.00\n";
        assert_eq!(parse_pingpong(text), Some((1982.14, 33.06)));
        assert_eq!(parse_pingpong("bytes #sent\n"), None);
    }

    #[test]
    fn counts_lines_are_read() {
        assert_eq!(
            passed_failed("rma: 12 passed, 0 failed, 2 skipped"),
            Some((12, 0))
        );
        assert_eq!(passed_failed("pingpong: 8 passed, 1 failed"), Some((8, 1)));
        assert_eq!(passed_failed("ok   rma_write_8B (0.31 s)"), None);
    }

    #[test]
    fn skipped_cases_come_with_their_reason() {
        let out = "rma: provider tcp\n    wrote 8 B\nok   rma_write_8B (0.31 s)\n    contract of the metaroce provider only\nskip mr_reg_null_buffer\nskip bare\nrma: 1 passed, 0 failed, 2 skipped\n";
        assert_eq!(
            skipped_cases(out),
            vec![
                (
                    "mr_reg_null_buffer".to_string(),
                    "contract of the metaroce provider only".to_string()
                ),
                ("bare".to_string(), "skipped by the program".to_string()),
            ]
        );
    }

    #[test]
    fn allreduce_time_is_read() {
        let text =
            "allreduce 16 MiB of doubles over 4 ranks: 145.54 ms (mean of 3, slowest rank)\n\
                    allreduce: 3 passed, 0 failed\n";
        assert_eq!(parse_allreduce(text), Some(145.54));
        assert_eq!(parse_allreduce("allreduce: 3 passed, 0 failed"), None);
    }

    #[test]
    fn nft_counters_are_read() {
        let text = "table inet metaroce_fabric_1 {
	chain out {
		type filter hook output priority filter; policy accept;
		oifname \"lo\" udp dport 20000-20127 counter packets 1000 bytes 90000
		oifname \"lo\" udp sport 20000-20127 udp dport != 20000-20127 counter packets 3 bytes 300
		oifname \"lo\" udp dport 20000-20127 numgen random mod 100 < 1 counter packets 9 bytes 810 drop
		oifname \"lo\" udp sport 20000-20127 udp dport != 20000-20127 numgen random mod 100 < 1 counter packets 0 bytes 0 drop
	}
}
";
        assert_eq!(parse_counters(text), (1003, 9));
        assert_eq!(parse_counters(""), (0, 0));
    }

    #[test]
    fn ranges_are_free_and_in_bounds() {
        let base = free_range().unwrap();
        assert!((20000..30000).contains(&base));
        assert!(base + RANGE_LEN <= 30000);
    }

    #[test]
    fn hung_children_are_killed() {
        let f = run_for(
            Command::new("sh").args(["-c", "echo started; sleep 30"]),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(f.timed_out.is_some());
        assert!(!f.ok());
        assert_eq!(f.stdout.trim(), "started");
        assert!(f.took < Duration::from_secs(10));
    }
}

//! One QEMU node: its command line, its process, its console (a file the
//! PL011 writes) and its defmt stream (QEMU's standard output, where the
//! firmware's semihosting writes go).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

use crate::fabric::PortAddrs;

/// Everything one node is started with.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub index: usize,
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    /// The firmware configuration line (fw_cfg `opt/metaroce/config`).
    pub config: String,
    /// Cores of the emulated CPU (`-smp`).
    pub cores: usize,
    /// The host-interface memory: a file QEMU maps as the ivshmem-plain
    /// device's BAR2 (shared, so host processes map the same bytes), and
    /// its size.
    pub shm: Option<(PathBuf, u64)>,
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The QEMU arguments for a node.
pub fn qemu_args(elf: &Path, spec: &NodeSpec, port: &PortAddrs, console: &Path) -> Vec<String> {
    let mut args = base_args(elf, spec, port, console);
    if let Some((path, size)) = &spec.shm {
        args.extend([
            "-object".into(),
            format!(
                "memory-backend-file,id=hostmem,share=on,mem-path={},size={size}",
                path.display()
            ),
            "-device".into(),
            "ivshmem-plain,memdev=hostmem".into(),
        ]);
    }
    args
}

fn base_args(elf: &Path, spec: &NodeSpec, port: &PortAddrs, console: &Path) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-M".into(),
        "virt".into(),
        "-cpu".into(),
        "cortex-a72".into(),
        "-m".into(),
        "256M".into(),
        "-nodefaults".into(),
        "-display".into(),
        "none".into(),
        "-monitor".into(),
        "none".into(),
        "-serial".into(),
        format!("file:{}", console.display()),
        "-semihosting-config".into(),
        "enable=on,target=native".into(),
        "-kernel".into(),
        elf.display().to_string(),
        "-netdev".into(),
        format!(
            "dgram,id=net0,local.type=inet,local.host=127.0.0.1,local.port={},remote.type=inet,remote.host=127.0.0.1,remote.port={}",
            port.node.port(),
            port.fabric.port()
        ),
        "-device".into(),
        format!("virtio-net-device,netdev=net0,mac={}", mac_string(&spec.mac)),
        // The entropy source of the node's secrets (its default back end,
        // rng-builtin, reads the host's getrandom); the firmware refuses
        // to run without it.
        "-device".into(),
        "virtio-rng-device".into(),
        "-fw_cfg".into(),
        format!("name=opt/metaroce/config,string={}", spec.config),
    ];
    if spec.cores > 1 {
        args.extend(["-smp".into(), spec.cores.to_string()]);
    }
    args
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    pub spec: NodeSpec,
    pub console: PathBuf,
    child: Child,
    defmt: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<String>>,
    console_read: usize,
    pub exit_code: Option<i32>,
}

impl Node {
    /// Starts QEMU for `spec`.
    pub fn start(
        qemu: &str,
        elf: &Path,
        spec: NodeSpec,
        port: &PortAddrs,
        out_dir: &Path,
    ) -> std::io::Result<Node> {
        let console = out_dir.join(format!("node{}.console", spec.index));
        File::create(&console)?;
        let mut child = Command::new(qemu)
            .args(qemu_args(elf, &spec, port, &console))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("no stderr"))?;
        let defmt = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stdout.read_to_end(&mut bytes);
            bytes
        });
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        Ok(Node {
            spec,
            console,
            child,
            defmt: Some(defmt),
            stderr: Some(stderr),
            console_read: 0,
            exit_code: None,
        })
    }

    /// Console lines written since the last call.
    pub fn new_console_lines(&mut self) -> Vec<String> {
        let Ok(text) = std::fs::read(&self.console) else {
            return Vec::new();
        };
        let Some(fresh) = text.get(self.console_read..) else {
            return Vec::new();
        };
        // Only whole lines; a partial one is read next time.
        let Some(end) = fresh.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        self.console_read += end + 1;
        String::from_utf8_lossy(&fresh[..end])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Whether QEMU has exited (records its status).
    pub fn poll_exit(&mut self) -> bool {
        if self.exit_code.is_some() {
            return true;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exit_code = Some(status.code().unwrap_or(-1));
                true
            }
            Ok(None) => false,
            Err(_) => true,
        }
    }

    /// Kills QEMU (timeout).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The raw defmt stream and QEMU's stderr, once QEMU has exited.
    pub fn finish(&mut self) -> (Vec<u8>, String) {
        let defmt = self
            .defmt
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (defmt, stderr)
    }
}

//! The host side of a host-driven run: each emulated DPU's shared-memory
//! file (the `memory-backend-file` behind its ivshmem BAR2) and the host
//! process (`metaroce-host-app`) that drives it through the host library.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Queue sets the firmware lays out (its `hostif::QUEUE_SETS`): each host
/// process's window is a quarter of the data area.
const QUEUE_SETS: u64 = 4;
/// Bytes before the data area (spec 6.2).
const DATA_OFFSET: u64 = 1 << 20;

/// Size of a DPU's shared memory so each queue set's window holds
/// `window` bytes (ivshmem wants a power of two; 64 MiB at least).
pub fn shm_size(window: u64) -> u64 {
    (DATA_OFFSET + QUEUE_SETS * (window + 4096))
        .next_power_of_two()
        .max(64 << 20)
}

/// Creates (or empties) a DPU's shared-memory file of `len` bytes.
pub fn create_shm(path: &Path, len: u64) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    file.set_len(len)
}

/// The host program next to the running harness.
pub fn host_app_path() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let app = exe.with_file_name("metaroce-host-app");
    if app.exists() {
        Ok(app)
    } else {
        Err(std::io::Error::other(format!(
            "{} is missing: build it with `cargo build -p metaroce-qemu --bins` (cargo xtask qemu does)",
            app.display()
        )))
    }
}

/// A running host process and what it printed.
#[derive(Debug)]
pub struct HostProcess {
    pub pid: u32,
    /// Its command line, for the summary.
    pub command: String,
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
    taken: usize,
    pub exit_code: Option<i32>,
}

impl HostProcess {
    /// Starts `program` with `args`; standard output and error are
    /// collected line by line.
    pub fn start(program: &Path, args: &[String]) -> std::io::Result<HostProcess> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let stdout = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
        let stderr = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>);
        for stream in [stdout, stderr].into_iter().flatten() {
            let lines = lines.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    if let Ok(mut l) = lines.lock() {
                        l.push(line);
                    }
                }
            }));
        }
        let name = program.file_name().map_or_else(
            || program.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(HostProcess {
            pid: child.id(),
            command: format!("{name} {}", args.join(" ")),
            child,
            lines,
            readers,
            taken: 0,
            exit_code: None,
        })
    }

    /// Lines printed since the last call.
    pub fn new_lines(&mut self) -> Vec<String> {
        let Ok(lines) = self.lines.lock() else {
            return Vec::new();
        };
        let fresh = lines[self.taken.min(lines.len())..].to_vec();
        self.taken = lines.len();
        fresh
    }

    /// Whether it has exited (records its status).
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

    /// Kills it (timeout) and waits for its output to be read.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the output readers once the process has exited.
    pub fn finish(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }
}

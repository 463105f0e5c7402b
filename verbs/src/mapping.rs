//! The shared-memory file, mapped: the only place the host library asks
//! the operating system for memory (`mmap`, `munmap`).
//!
//! Under QEMU the file is the `memory-backend-file` behind the emulated
//! DPU's ivshmem BAR2; the firmware sees the same bytes. On a real DPU a
//! host driver would map the device's BAR (for example through
//! `/sys/bus/pci/devices/.../resource2` or a VFIO region) instead; the
//! rest of the library does not change.

use std::fs::{File, OpenOptions};
use std::num::NonZeroUsize;
use std::os::raw::c_void;
use std::path::Path;
use std::ptr::NonNull;

use metaroce_platform::shmem::SharedMemory;
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

/// A file mapped shared, read-write, for as long as this value lives.
#[derive(Debug)]
pub struct SharedFile {
    base: NonNull<c_void>,
    len: NonZeroUsize,
    _file: File,
}

// SAFETY: the mapping is plain shared memory, reached only through
// `SharedMemory` views (atomic, volatile and copy accesses); moving the
// owner to another thread changes nothing.
unsafe impl Send for SharedFile {}
// SAFETY: as above: `&SharedFile` only hands out such views.
unsafe impl Sync for SharedFile {}

impl SharedFile {
    /// Maps an existing file (its whole length).
    pub fn open(path: &Path) -> std::io::Result<SharedFile> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Self::map(file)
    }

    /// Creates (or truncates) a file of `len` bytes, zeroed, and maps it.
    pub fn create(path: &Path, len: u64) -> std::io::Result<SharedFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        file.set_len(len)?;
        Self::map(file)
    }

    fn map(file: File) -> std::io::Result<SharedFile> {
        let len = usize::try_from(file.metadata()?.len())
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| std::io::Error::other("the shared-memory file is empty"))?;
        // SAFETY: a fresh shared mapping of a file we hold open; the
        // kernel picks the address, so nothing else is overwritten.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &file,
                0,
            )
        }?;
        Ok(SharedFile {
            base,
            len,
            _file: file,
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len.get()
    }

    /// Whether nothing is mapped (never: mappings are not empty).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// A view of the mapping for as long as it is borrowed.
    pub fn view(&self) -> SharedMemory<'_> {
        // SAFETY: the mapping stays valid while `self` is borrowed (it is
        // unmapped only in `drop`), page-aligned, and this library never
        // makes Rust references into it: every access goes through the
        // view's atomic, volatile or copy operations.
        let view = unsafe { SharedMemory::new(self.base.as_ptr().cast(), self.len.get()) };
        view.expect("mmap returns a page-aligned, non-null address")
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; no view outlives
        // `self` (they borrow it).
        let _ = unsafe { munmap(self.base, self.len.get()) };
    }
}

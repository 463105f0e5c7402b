//! The shared-memory file, mapped: the only place the host library asks
//! the operating system for memory (`mmap`, `munmap`).
//!
//! Under QEMU the file is the `memory-backend-file` behind the emulated
//! DPU's ivshmem BAR2; the firmware sees the same bytes. On a real DPU a
//! host driver would map the device's BAR (for example through
//! `/sys/bus/pci/devices/.../resource2` or a VFIO region) instead; the
//! rest of the library does not change. A BAR may also be a window of a
//! larger file ([`SharedFile::open_window`]): the Elba twin's host
//! interface is a region of its RAM file (`[host_interface]` of its
//! `board.toml`), as the card's would be a region of its DRAM behind a BAR.

use std::fs::{File, OpenOptions};
use std::num::NonZeroUsize;
use std::os::raw::c_void;
use std::path::Path;
use std::ptr::NonNull;

use metaroce_abi::shmem::SharedMemory;
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

    /// Maps `len` bytes of an existing file from `offset` (a multiple of
    /// the page size), which must lie inside the file: a BAR that is a
    /// window of a larger memory.
    pub fn open_window(path: &Path, offset: u64, len: u64) -> std::io::Result<SharedFile> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let file_len = file.metadata()?.len();
        if offset.checked_add(len).is_none_or(|end| end > file_len) {
            return Err(std::io::Error::other(format!(
                "the window {offset:#x}+{len:#x} is not inside the file ({file_len:#x} bytes)"
            )));
        }
        Self::map_at(file, offset, len)
    }

    fn map(file: File) -> std::io::Result<SharedFile> {
        let len = file.metadata()?.len();
        Self::map_at(file, 0, len)
    }

    fn map_at(file: File, offset: u64, len: u64) -> std::io::Result<SharedFile> {
        let len = usize::try_from(len)
            .ok()
            .and_then(NonZeroUsize::new)
            .ok_or_else(|| std::io::Error::other("the shared memory is empty"))?;
        let offset = i64::try_from(offset)
            .map_err(|_| std::io::Error::other("the window's offset is too large"))?;
        // SAFETY: a fresh shared mapping of a file we hold open; the
        // kernel picks the address, so nothing else is overwritten (it
        // refuses an offset that is not page-aligned).
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                &file,
                offset,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_maps_that_part_of_the_file_and_nothing_outside_it() {
        let path = std::env::temp_dir().join(format!("metaroce-window-{}", std::process::id()));
        let whole = SharedFile::create(&path, 3 * 4096).unwrap();
        whole.view().store_u32(4096, 0x5a5a_0001).unwrap();
        whole.view().store_u32(2 * 4096 - 4, 0x5a5a_0002).unwrap();
        let window = SharedFile::open_window(&path, 4096, 4096).unwrap();
        assert_eq!(window.len(), 4096);
        assert_eq!(window.view().load_u32(0).unwrap(), 0x5a5a_0001);
        assert_eq!(window.view().load_u32(4092).unwrap(), 0x5a5a_0002);
        assert!(window.view().load_u32(4096).is_err());
        // The host's writes through the window are the device's bytes.
        window.view().store_u32(8, 7).unwrap();
        assert_eq!(whole.view().load_u32(4096 + 8).unwrap(), 7);
        // Beyond the file, or not on a page: refused.
        assert!(SharedFile::open_window(&path, 2 * 4096, 2 * 4096).is_err());
        assert!(SharedFile::open_window(&path, u64::MAX, 1).is_err());
        assert!(SharedFile::open_window(&path, 100, 4096).is_err());
        drop((window, whole));
        std::fs::remove_file(&path).unwrap();
    }
}

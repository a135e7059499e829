//! Attaching a file to a free loop device with `LOOP_CONFIGURE`, in one ioctl: direct I/O
//! (no second copy of the data in the page cache) and autoclear (the kernel detaches the
//! device when its last user — the filesystem mounted on it — goes away, so a killed
//! process or a plain unmount never leaks a loop device).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::last_errno;
use rustix::io::Errno;

/// `LOOP_CTL_GET_FREE` from `<linux/loop.h>`: returns the number of a free device.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CLR_FD` from `<linux/loop.h>`: unbind the backing file (or, while the device is
/// still open elsewhere, mark it to unbind on last close).
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
/// `LOOP_CONFIGURE` from `<linux/loop.h>` (Linux 5.8): bind a backing fd and set flags.
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// `LO_FLAGS_AUTOCLEAR`: detach when the last opener closes the device.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LO_FLAGS_DIRECT_IO`: read and write the backing file with O_DIRECT.
const LO_FLAGS_DIRECT_IO: u32 = 16;
/// `LO_NAME_SIZE` and `LO_KEY_SIZE` from `<linux/loop.h>`.
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

/// `struct loop_info64` from `<linux/loop.h>` (232 bytes).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

/// `struct loop_config` from `<linux/loop.h>` (304 bytes).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// How often to retry when another process configures the device we were handed first.
const CLAIM_ATTEMPTS: usize = 20;

/// A loop device this process holds open. Dropping it closes the device, and (autoclear)
/// detaches it unless a mount still uses it.
#[derive(Debug)]
pub struct LoopDevice {
    pub path: PathBuf,
    _device: File,
}

/// Attaches `backing` (opened read-write) to a free loop device with direct I/O and
/// autoclear.
pub fn attach(backing: &File) -> Result<LoopDevice, (&'static str, PathBuf, Errno)> {
    let control_path = PathBuf::from("/dev/loop-control");
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&control_path)
        .map_err(|e| ("open", control_path.clone(), errno(&e)))?;
    let mut last = Errno::BUSY;
    for _ in 0..CLAIM_ATTEMPTS {
        // SAFETY: `control` is an open /dev/loop-control for the duration of the call;
        // LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if number < 0 {
            return Err(("find a free loop device via", control_path, last_errno()));
        }
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| ("open", path.clone(), errno(&e)))?;
        match configure(&device, backing) {
            Ok(()) => {
                return Ok(LoopDevice {
                    path,
                    _device: device,
                });
            }
            // Another process configured this device between GET_FREE and ours.
            Err(Errno::BUSY) => last = Errno::BUSY,
            Err(e) => return Err(("configure loop device", path, e)),
        }
    }
    Err(("claim a loop device via", control_path, last))
}

/// Detaches the loop device at `path` from its backing file.
pub fn detach(path: &Path) -> Result<(), Errno> {
    let device = OpenOptions::new()
        .read(true)
        .open(path)
        .map_err(|e| errno(&e))?;
    // SAFETY: `device` is an open loop block device for the duration of the call;
    // LOOP_CLR_FD takes no argument.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD) };
    if rc == 0 { Ok(()) } else { Err(last_errno()) }
}

fn configure(device: &File, backing: &File) -> Result<(), Errno> {
    let fd = u32::try_from(backing.as_raw_fd()).map_err(|_| Errno::BADF)?;
    let config = LoopConfig {
        fd,
        block_size: 0,
        info: LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO,
            lo_file_name: [0; LO_NAME_SIZE],
            lo_crypt_name: [0; LO_NAME_SIZE],
            lo_encrypt_key: [0; LO_KEY_SIZE],
            lo_init: [0; 2],
        },
        reserved: [0; 8],
    };
    // SAFETY: `device` is an open loop block device and `backing` an open regular file,
    // both live for the call; `config` is a fully initialised `struct loop_config` with
    // the kernel's layout (size asserted above), borrowed for the whole call, and the
    // kernel only reads it.
    let rc = unsafe {
        libc::ioctl(
            device.as_raw_fd(),
            LOOP_CONFIGURE,
            &config as *const LoopConfig,
        )
    };
    if rc == 0 { Ok(()) } else { Err(last_errno()) }
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

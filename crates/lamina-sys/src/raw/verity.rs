//! `FS_IOC_ENABLE_VERITY` (fsverity(7)): seal a file so the kernel checks every block it
//! reads against a Merkle tree, and the file can never be written again.

use std::fs::File;
use std::os::fd::AsRawFd;

use rustix::io::Errno;

/// `_IOW('f', 133, struct fsverity_enable_arg)`: the argument is 128 bytes.
const FS_IOC_ENABLE_VERITY: libc::c_ulong = 0x4080_6685;

/// `FS_VERITY_HASH_ALG_SHA256`: what composefs names objects by.
const SHA256: u32 = 1;

/// `struct fsverity_enable_arg`.
#[repr(C)]
struct EnableArg {
    version: u32,
    hash_algorithm: u32,
    block_size: u32,
    salt_size: u32,
    salt_ptr: u64,
    sig_size: u32,
    reserved1: u32,
    sig_ptr: u64,
    reserved2: [u64; 11],
}

/// Enables fs-verity (SHA-256, 4 KiB blocks, no salt: the digest composefs computes in
/// userspace) on `file`, which must be open read-only with no writer anywhere.
/// Already enabled is success. `EOPNOTSUPP`/`ENOTTY`: no fs-verity on this kernel or
/// filesystem.
pub fn enable_verity(file: &File) -> Result<(), Errno> {
    let arg = EnableArg {
        version: 1,
        hash_algorithm: SHA256,
        block_size: 4096,
        salt_size: 0,
        salt_ptr: 0,
        sig_size: 0,
        reserved1: 0,
        sig_ptr: 0,
        reserved2: [0; 11],
    };
    // SAFETY: `file` is open for the call; `arg` is a valid `fsverity_enable_arg` with no
    // salt or signature pointers, which the kernel only reads.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_ENABLE_VERITY, &arg as *const _) };
    if rc == 0 {
        return Ok(());
    }
    match super::last_errno() {
        Errno::EXIST => Ok(()),
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_is_laid_out_as_the_kernel_reads_it() {
        assert_eq!(std::mem::size_of::<EnableArg>(), 128);
        assert_eq!(std::mem::offset_of!(EnableArg, sig_ptr), 32);
    }
}

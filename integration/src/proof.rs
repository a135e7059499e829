//! The script every boot test runs in the sample image, and what it must print: one line
//! per property of the merged layers (top-layer file, whiteout, opaque dir, setuid,
//! hardlinks within a layer, symlinks).

pub const SCRIPT: &str = "cat /top.txt; \
    test ! -e /old/gone.txt && echo whiteout-ok; \
    cat /old/kept.txt; \
    ls /opq; \
    stat -c 'suid %a' /usr/local/bin/suid-tool; \
    stat -c 'links %h' /top.hardlink /etc/hosts.hardlink; \
    readlink /bin/sh";

pub const EXPECTED: &str =
    "from the top layer\nwhiteout-ok\nkept\ntop-only.txt\nsuid 4755\nlinks 2\nlinks 2\nbusybox\n";

/// The superblock options of the mount at `target`, from /proc/self/mountinfo.
pub fn super_options(target: &std::path::Path) -> Option<String> {
    mount_field(target, 2)
}

/// The filesystem type of the mount at `target` (`overlay`, `ext4`, ...).
pub fn fstype(target: &std::path::Path) -> Option<String> {
    mount_field(target, 0)
}

/// Field `n` after the ` - ` separator of the top-most mount at `target`.
fn mount_field(target: &std::path::Path, n: usize) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let target = target.to_str()?;
    info.lines().rev().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        if before.split(' ').nth(4)? != target {
            return None;
        }
        after.split(' ').nth(n).map(str::to_string)
    })
}

/// What [`SCRIPT`] prints in the sample's base layer alone (its `rootfs.tar` form): no
/// top layer, so no whiteout applied, `opq` keeps its base file, and no setuid tool.
pub const BASE_EXPECTED: &str = "kept\nbase-only.txt\nlinks 2\nbusybox\n";

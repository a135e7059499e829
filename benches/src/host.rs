//! What the benchmarks read from the kernel to prove a scenario happened: reclaim
//! counters, slab usage, memory, and the kernel release the tables were measured on.

use std::fs;

/// Pages scanned by reclaim since boot (kswapd, direct and khugepaged): rising during a
/// run proves the host was reclaiming while it was measured.
pub fn pgscan() -> u64 {
    let vmstat = fs::read_to_string("/proc/vmstat").unwrap_or_default();
    sum_fields(&vmstat, |name| name.starts_with("pgscan_"))
}

fn sum_fields(text: &str, wanted: impl Fn(&str) -> bool) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(name, _)| wanted(name))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// Bytes held by the named slab caches (active objects × object size).
pub fn slab_bytes(caches: &[&str]) -> u64 {
    let slabinfo = fs::read_to_string("/proc/slabinfo").unwrap_or_default();
    slab_bytes_in(&slabinfo, caches)
}

fn slab_bytes_in(slabinfo: &str, caches: &[&str]) -> u64 {
    slabinfo
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next()?;
            if !caches.contains(&name) {
                return None;
            }
            let active: u64 = fields.next()?.parse().ok()?;
            let _total = fields.next()?;
            let size: u64 = fields.next()?.parse().ok()?;
            Some(active * size)
        })
        .sum()
}

/// Writes back and drops clean page cache, dentries and inodes, so a measurement of
/// slab growth starts from the same floor each time.
pub fn drop_caches() {
    rustix::fs::sync();
    let _ = fs::write("/proc/sys/vm/drop_caches", "3");
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> u64 {
    meminfo("MemAvailable:")
}

/// `Slab` from /proc/meminfo (every slab cache), in bytes.
pub fn slab_total() -> u64 {
    meminfo("Slab:")
}

/// Kernel memory nothing can reclaim, in bytes: unreclaimable slab, kernel stacks,
/// per-CPU allocations and page tables. Unlike `MemAvailable`, which moves by megabytes
/// on its own, this holds still enough to divide by a container count.
pub fn kernel_unreclaimable() -> u64 {
    ["SUnreclaim:", "KernelStack:", "Percpu:", "PageTables:"]
        .into_iter()
        .map(meminfo)
        .sum()
}

fn meminfo(key: &str) -> u64 {
    fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

pub fn kernel_release() -> String {
    rustix::system::uname()
        .release()
        .to_string_lossy()
        .into_owned()
}

/// "2 vCPU, 24 GiB RAM" for the report header.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gib = meminfo("MemTotal:") as f64 / (1u64 << 30) as f64;
    format!("{cpus} vCPU, {gib:.0} GiB RAM")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgscan_sums_every_reclaimer() {
        let vmstat = "pgscan_kswapd 10\npgscan_direct 5\npgsteal_kswapd 99\npgscan_khugepaged 1\n";
        assert_eq!(sum_fields(vmstat, |n| n.starts_with("pgscan_")), 16);
    }

    #[test]
    fn slab_bytes_are_active_objects_times_size() {
        let slabinfo = "slabinfo - version: 2.1\n# name <active_objs> <num_objs> <objsize> ...\novl_inode 100 120 680 24 4 : tunables\ndentry 1000 1100 192 21 1 : tunables\next4_inode_cache 5 5 1100 1 1\n";
        assert_eq!(
            slab_bytes_in(slabinfo, &["ovl_inode", "dentry"]),
            100 * 680 + 1000 * 192
        );
    }

    #[test]
    fn this_host_reports_its_kernel_and_memory() {
        assert!(!kernel_release().is_empty());
        assert!(mem_available() > 0);
    }
}

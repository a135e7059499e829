//! Who holds a lock file: the flock entries of `/proc/locks` for its inode, each pid with
//! its command line. A waiter that gives up names them, so an operator knows which process
//! to look at (a pull stuck on a registry, a create that hangs) instead of guessing.

use std::fs::File;
use std::os::unix::fs::MetadataExt;

/// Command lines are cut here, so an error line stays short.
const MAX_COMMAND: usize = 256;

/// `held by pid N (`CMD`)`, `held by pids N (`CMD`), M (`CMD`)`, or why nobody can be named.
pub(crate) fn describe(file: &File) -> String {
    let Ok(meta) = file.metadata() else {
        return "its holder is unknown".into();
    };
    let Ok(table) = std::fs::read_to_string("/proc/locks") else {
        return "its holder is unknown (/proc/locks is unreadable)".into();
    };
    let (major, minor) = (rustix::fs::major(meta.dev()), rustix::fs::minor(meta.dev()));
    // Device and inode both: an inode number alone names unrelated files on other
    // filesystems. A holder that cannot be named is said to be unknown, never guessed.
    let pids = holders(&table, (major, minor), meta.ino());
    if pids.is_empty() {
        return "its holder is unknown (not in /proc/locks for this file: it may have just \
                let go, run in another pid namespace, or the filesystem names its device \
                differently)"
            .into();
    }
    let shown: Vec<String> = pids
        .iter()
        .map(|pid| format!("{pid} (`{}`)", command_of(*pid)))
        .collect();
    let noun = if pids.len() == 1 { "pid" } else { "pids" };
    format!("held by {noun} {}", shown.join(", "))
}

/// Pids holding a granted flock on inode `ino` of device `dev` in
/// `/proc/locks` text; lines of waiters (`->`) and other lock kinds are skipped.
fn holders(table: &str, (major, minor): (u32, u32), ino: u64) -> Vec<u32> {
    let mut pids = Vec::new();
    for line in table.lines() {
        // `1: FLOCK  ADVISORY  WRITE 30662 fe:00:9977960 0 EOF`
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, kind, _, _, pid, file, ..] = fields.as_slice() else {
            continue; // a waiter's line (`-> FLOCK ...`) or something unexpected
        };
        if *kind != "FLOCK" {
            continue;
        }
        let mut parts = file.split(':');
        let (Some(maj), Some(min), Some(inode)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let same_dev =
            u32::from_str_radix(maj, 16) == Ok(major) && u32::from_str_radix(min, 16) == Ok(minor);
        if same_dev
            && inode.parse::<u64>() == Ok(ino)
            && let Ok(pid) = pid.parse::<u32>()
            && !pids.contains(&pid)
        {
            pids.push(pid);
        }
    }
    pids
}

/// `pid`'s command line: the program's file name, then its arguments, joined by spaces,
/// control characters escaped, any `--password` value hidden, cut to [`MAX_COMMAND`]
/// bytes.
fn command_of(pid: u32) -> String {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return "exited".into();
    };
    let mut words = Vec::new();
    let mut hide_next = false;
    for (i, arg) in raw.split(|b| *b == 0).filter(|a| !a.is_empty()).enumerate() {
        let mut arg = String::from_utf8_lossy(arg);
        if i == 0 {
            // `/long/path/to/target/debug/lamina` says no more than `lamina`.
            arg = arg
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string()
                .into();
        }
        if hide_next {
            words.push("***".to_string());
            hide_next = false;
        } else if arg == "--password" {
            words.push(arg.into_owned());
            hide_next = true;
        } else if arg.starts_with("--password=") {
            words.push("--password=***".to_string());
        } else {
            words.push(arg.escape_debug().to_string());
        }
    }
    let mut line = words.join(" ");
    if line.len() > MAX_COMMAND {
        let mut cut = MAX_COMMAND;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
        line.push('…');
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "1: FLOCK  ADVISORY  WRITE 30662 fe:00:9977960 0 EOF\n\
        1: -> FLOCK  ADVISORY  WRITE 30670 fe:00:9977960 0 EOF\n\
        2: FLOCK  ADVISORY  READ 40001 00:2a:77 0 EOF\n\
        3: FLOCK  ADVISORY  READ 40002 00:2a:77 0 EOF\n\
        4: POSIX  ADVISORY  WRITE 50000 fe:00:9977960 0 EOF\n";

    #[test]
    fn granted_flocks_of_the_inode_are_found_and_waiters_skipped() {
        assert_eq!(holders(TABLE, (0xfe, 0), 9977960), vec![30662]);
        assert_eq!(holders(TABLE, (0, 0x2a), 77), vec![40001, 40002]);
        assert_eq!(holders(TABLE, (0xfe, 1), 9977960), Vec::<u32>::new());
    }

    #[test]
    fn this_process_command_line_is_shown() {
        let line = command_of(std::process::id());
        assert!(!line.is_empty() && line.len() <= MAX_COMMAND + '…'.len_utf8());
    }
}

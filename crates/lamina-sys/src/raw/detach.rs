//! Forking this process so that a copy of it finishes work after the caller's command
//! has returned: a deferred delete's reap.
//!
//! Starting that work as a new `lamina reap` process (spawn and exec) cost a delete about
//! 0.2 ms of its own time here — the parent waits while the child resets every signal and
//! starts the exec — and the new process then spent about a millisecond of CPU starting
//! up beside the caller's next command on a 2-core host (docs/benchmarks.md, process per
//! call). A forked copy already has the store open and its code in memory. `fork` is only
//! sound in a process with one thread (the child gets one thread, with every lock another
//! thread held left held), so this refuses otherwise and the caller spawns as before.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Which side of [`fork_detached`] this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The caller, which goes on to answer its command.
    Parent,
    /// The copy, in a session of its own, with stdin and stdout on `/dev/null` and stderr
    /// on the given log file: it must end with `std::process::exit`, never return into the
    /// caller's command.
    Child,
}

/// Forks; in the child, moves it into a new session (a caller killing its process group,
/// as Garden may, does not reach it) and points its standard streams away from the
/// caller, which may be reading stdout to its end. Errors (more than one thread, fork
/// refused) leave nothing changed.
pub fn fork_detached(log: &File) -> io::Result<Side> {
    if !single_threaded()? {
        return Err(io::Error::other("more than one thread: not forking"));
    }
    let null = File::options().read(true).write(true).open("/dev/null")?;
    // SAFETY: the process has one thread (checked just above; nothing in lamina starts
    // one between that check and here), so the child's copy of the allocator's and
    // stdio's locks is consistent, and glibc's fork runs its own at-fork handlers.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // SAFETY: plain system calls on descriptors this function owns or that are
            // the process's standard streams; failures are ignored, since the child
            // cannot report them anywhere but its log and goes on regardless.
            unsafe {
                libc::setsid();
                libc::dup2(null.as_raw_fd(), 0);
                libc::dup2(null.as_raw_fd(), 1);
                libc::dup2(log.as_raw_fd(), 2);
            }
            Ok(Side::Child)
        }
        _ => Ok(Side::Parent),
    }
}

/// Whether this process has one thread: `/proc/self/task` holds a directory per thread.
fn single_threaded() -> io::Result<bool> {
    let mut tasks = std::fs::read_dir("/proc/self/task")?;
    Ok(tasks.next().is_some() && tasks.next().is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test runs beside the harness's main thread: a fork here would be unsound, and
    /// is refused before anything is forked or opened.
    #[test]
    fn refuses_to_fork_a_process_with_threads() {
        let log = tempfile::tempfile().expect("log file");
        let refused = fork_detached(&log).expect_err("refused");
        assert!(
            refused.to_string().contains("more than one thread"),
            "{refused}"
        );
    }
}

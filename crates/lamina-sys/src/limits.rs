//! Process limits lamina sets for itself at start.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Raises the soft limit on open files to the hard limit, as Go programs (containerd,
/// runc) do at start: a reaper holds a lock per pending container and walks up to four
/// containers' trees at once, which can pass the usual soft limit of 1024 that a daemon's
/// other calls share. Best effort: a limit that cannot be raised stays as it was.
pub fn raise_open_file_limit() {
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum)
        && current < maximum
    {
        let raised = Rlimit {
            current: Some(maximum),
            maximum: Some(maximum),
        };
        let _ = setrlimit(Resource::Nofile, raised);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_one() {
        raise_open_file_limit();
        let limit = getrlimit(Resource::Nofile);
        if limit.maximum.is_some() {
            assert_eq!(limit.current, limit.maximum);
        }
    }
}

//! Process limits lamina sets for itself at start.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Raises the soft limit on open files to the hard limit, as Go programs (containerd,
/// runc) do at start: a reaper holds a lock per pending container and walks up to four
/// containers' trees at once, which can pass the usual soft limit of 1024 that a daemon's
/// other calls share. Best effort: a limit that cannot be raised stays as it was. What
/// lamina starts (mkfs, unshare, credential helpers) inherits the raised limit. Returns
/// the soft limit now in force (`None`: unlimited).
pub fn raise_open_file_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum)
        && current < maximum
    {
        let raised = Rlimit {
            current: Some(maximum),
            maximum: Some(maximum),
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return Some(maximum);
        }
    }
    limit.current
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_one() {
        let now = raise_open_file_limit();
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(now, limit.current);
        if limit.maximum.is_some() {
            assert_eq!(limit.current, limit.maximum);
        }
    }
}

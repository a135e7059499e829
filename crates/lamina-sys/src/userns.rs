//! User namespaces to idmap layers with. An idmapped mount needs a user namespace's fd
//! for its mapping; one is made by starting util-linux's `unshare --user` (a child that
//! only sleeps), writing the maps from here (root in the parent namespace may write any
//! map), and opening its `ns/user`. The open fd keeps the namespace alive after the
//! child is killed, so no process outlives the mount that needed it.

use std::fs::{self, File};
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A user namespace's maps in `/proc/<pid>/uid_map` form (`"0 100000 65536\n"`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserNsMaps {
    pub uid_map: String,
    pub gid_map: String,
}

/// Kills and reaps the helper however we leave.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A new user namespace with `maps`, as an open `ns/user` fd.
pub fn user_namespace(maps: &UserNsMaps) -> io::Result<OwnedFd> {
    let child = Command::new("unshare")
        .args(["--user", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("starting `unshare --user`: {e}")))?;
    let helper = Helper(child);
    let proc = PathBuf::from(format!("/proc/{}", helper.0.id()));
    let ours = fs::read_link("/proc/self/ns/user")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    // The child forks before it unshares: wait until it is in a namespace of its own.
    while fs::read_link(proc.join("ns/user"))? == ours {
        if Instant::now() > deadline {
            return Err(io::Error::other(
                "`unshare --user` did not enter a new user namespace",
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let write = |file: &str, map: &str| {
        fs::write(proc.join(file), map)
            .map_err(|e| io::Error::new(e.kind(), format!("writing {file} `{}`: {e}", map.trim())))
    };
    write("uid_map", &maps.uid_map)?;
    write("gid_map", &maps.gid_map)?;
    let ns = File::open(proc.join("ns/user"))?;
    drop(helper);
    Ok(ns.into())
}

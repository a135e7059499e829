//! Fault injection for the fake: which seam call fails, when, and with which errno. A
//! test names the call ([`Call`]), a trigger ([`When`]) and an errno; the fake consults
//! the rules on every call of that kind before doing anything, so a failure is exactly
//! what the kernel refusing that one call would look like to the caller.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustix::io::Errno;

/// Every kind of call that goes through the seam ([`crate::Mounter`] and
/// [`crate::HostFs`]), as the fake records and fails them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// [`crate::Mounter::mount_overlay`].
    Mount,
    /// [`crate::Mounter::mount_upper_fs`] (a tmpfs, or an image on a loop device).
    MountUpperFs,
    /// [`crate::Mounter::mount_erofs`]: a composefs metadata image.
    MountErofs,
    Unmount,
    /// [`crate::Mounter::in_use`]: a fault makes the mount busy.
    InUse,
    IsMountpoint,
    BindReadOnly,
    /// [`crate::Mounter::sync_filesystem`]: syncfs of a mounted overlay's upper.
    Sync,
    MountsUnder,
    ProbeMountApi,
    /// [`crate::Mounter::probe_idmapped_layers`]: makes a user namespace and an idmapped
    /// mount; a failure makes the probe answer "unsupported".
    ProbeIdmappedLayers,
    DetachLoopDevice,
    LoopBackingFiles,
    /// [`crate::Mounter::create_subvolume`]: a subvolume and its qgroup limit.
    CreateSubvolume,
    /// [`crate::Mounter::delete_subvolume`].
    DeleteSubvolume,
    SubvolumeUsage,
    /// [`crate::Mounter::limit_subvolume`].
    LimitSubvolume,
    /// [`crate::HostFs::chown`].
    Chown,
    /// [`crate::HostFs::mknod`]: device nodes, whiteouts and FIFOs.
    Mknod,
    SetXattr,
    GetXattr,
    ListXattrs,
    Stat,
    /// [`crate::HostFs::write_all`]: the data of a durable record or marker.
    Write,
    /// [`crate::HostFs::fsync`]: a durable file or its directory.
    Fsync,
    /// [`crate::HostFs::syncfs`]: an imported layer or flattened tree made durable.
    Syncfs,
    /// [`crate::HostFs::write_back`]: a layer file's pages written ahead of its publish.
    WriteBack,
    /// [`crate::HostFs::share_extents`]: a layer file deduplicated against an object.
    ShareExtents,
    /// [`crate::HostFs::enable_verity`]: a composefs object or image sealed.
    EnableVerity,
    /// [`crate::HostFs::set_mode`].
    SetMode,
    /// [`crate::HostFs::copy_range`]: a composefs object copied.
    CopyRange,
}

/// When a rule fires.
#[derive(Clone)]
pub enum When {
    /// The n-th call of the kind from when the rule was added (1 is the next), once.
    Nth(u64),
    /// Every call of the kind.
    Always,
    /// Every call of the kind whose path satisfies the predicate.
    Path(Arc<dyn Fn(&Path) -> bool + Send + Sync>),
}

impl When {
    /// Every call whose path contains `part` (compared as text): `When::path_contains
    /// ("container.json")` fails every write of a container record.
    pub fn path_contains(part: &str) -> When {
        let part = part.to_string();
        When::Path(Arc::new(move |p| p.to_string_lossy().contains(&part)))
    }
}

impl fmt::Debug for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Nth(n) => write!(f, "Nth({n})"),
            When::Always => f.write_str("Always"),
            When::Path(_) => f.write_str("Path(..)"),
        }
    }
}

#[derive(Debug)]
struct Rule {
    /// The kinds of call the rule counts and fails (one, but for the legacy
    /// "next mount of either kind").
    calls: Vec<Call>,
    when: When,
    errno: Errno,
    /// Calls of the kind seen since the rule was added.
    seen: u64,
    spent: bool,
}

/// The rules of one fake, in the order they were added; the first that fires wins.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    rules: Vec<Rule>,
}

impl Faults {
    pub(crate) fn add(&mut self, call: Call, when: When, errno: Errno) {
        self.add_any(&[call], when, errno);
    }

    /// A rule counting calls of any of the kinds in `calls` together.
    pub(crate) fn add_any(&mut self, calls: &[Call], when: When, errno: Errno) {
        self.rules.push(Rule {
            calls: calls.to_vec(),
            when,
            errno,
            seen: 0,
            spent: false,
        });
    }

    /// The errno `call` on `path` must fail with, if any. Every rule for the kind
    /// counts the call, whether or not an earlier rule fired.
    pub(crate) fn check(&mut self, call: Call, path: &Path) -> Option<Errno> {
        let mut fired = None;
        for rule in self
            .rules
            .iter_mut()
            .filter(|r| r.calls.contains(&call) && !r.spent)
        {
            rule.seen += 1;
            let hit = match &rule.when {
                When::Nth(n) => rule.seen == *n,
                When::Always => true,
                When::Path(matches) => matches(path),
            };
            if hit {
                rule.spent = matches!(rule.when, When::Nth(_));
                fired = fired.or(Some(rule.errno));
            }
        }
        fired
    }
}

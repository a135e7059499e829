//! The store's memory of rootfs tar digests (`run/tar-digests/`), so a warm create from
//! Garden's rootfs tar does not read the whole tar to name its layer. One small file per
//! tar path, named by the path's digest; what it holds is checked against the file's
//! identity (lamina-image's `tar_memo`) before it is believed.
//!
//! Nothing here needs to survive a crash: a memo lost or torn is a memo missing, and the
//! next create hashes the tar again and writes it anew.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use lamina_image::{Digest, FileIdentity, TarMemo};
use serde::{Deserialize, Serialize};

use crate::Store;

/// A memo is a path, an identity and a digest: far below this.
const MAX_MEMO_BYTES: u64 = 8 << 10;

#[derive(Serialize, Deserialize)]
struct Memo {
    path: PathBuf,
    identity: FileIdentity,
    diff_id: Digest,
}

impl Store {
    fn tar_memo_path(&self, path: &Path) -> PathBuf {
        self.layout()
            .run()
            .join("tar-digests")
            .join(Digest::of(path.as_os_str().as_bytes()).hex())
    }
}

impl TarMemo for Store {
    fn recall(&self, path: &Path, identity: &FileIdentity) -> Option<Digest> {
        let mut bytes = Vec::new();
        crate::open_regular_file(&self.tar_memo_path(path))
            .ok()?
            .take(MAX_MEMO_BYTES)
            .read_to_end(&mut bytes)
            .ok()?;
        let memo: Memo = serde_json::from_slice(&bytes).ok()?;
        (memo.path == path && memo.identity == *identity).then_some(memo.diff_id)
    }

    fn remember(&self, path: &Path, identity: &FileIdentity, diff_id: &Digest) {
        let memo = Memo {
            path: path.to_path_buf(),
            identity: identity.clone(),
            diff_id: diff_id.clone(),
        };
        let target = self.tar_memo_path(path);
        let written = (|| -> std::io::Result<()> {
            // Only the last directory is made: a store deleted meanwhile (`run/` gone) is
            // not made again by a memo.
            match std::fs::DirBuilder::new()
                .mode(0o700)
                .create(target.parent().unwrap_or(self.root()))
            {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            // Written beside the target and renamed over it: a reader sees a whole memo
            // or the previous one. The process ID keeps concurrent creates apart.
            let tmp = target.with_extension(format!("tmp.{}", std::process::id()));
            let bytes = serde_json::to_vec(&memo)?;
            let result = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .and_then(|mut file| std::io::Write::write_all(&mut file, &bytes))
                .and_then(|()| std::fs::rename(&tmp, &target));
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result
        })();
        if let Err(e) = written {
            tracing::debug!("not remembering the digest of {}: {e}", path.display());
        }
    }

    fn forget(&self, path: &Path) {
        let _ = std::fs::remove_file(self.tar_memo_path(path));
    }
}

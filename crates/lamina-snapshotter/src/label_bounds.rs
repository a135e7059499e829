//! How much label text one snapshot may carry. CRI passes a pod's `containerd.io/snapshot/`
//! annotations through as labels, so a pod author sets them; containerd bounds each label
//! (4 KiB) but not how many there are. Without a bound per snapshot, a few snapshots with
//! large labels made a `List` answer larger than containerd's receive limit for proxy
//! plugins (16 MiB), and every unfiltered Walk on the node failed.

use std::collections::BTreeMap;

use crate::SnapshotError;

/// The most bytes of keys and values one snapshot's labels may hold: Kubernetes' bound on
/// all of an object's annotations together (256 KiB).
pub const MAX_LABEL_BYTES: usize = 256 * 1024;

/// Refuses labels past [`MAX_LABEL_BYTES`], naming the snapshot.
pub fn check(key: &str, labels: &BTreeMap<String, String>) -> Result<(), SnapshotError> {
    let bytes: usize = labels.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_LABEL_BYTES {
        return Err(SnapshotError::InvalidArgument(format!(
            "snapshot `{key}`: its labels hold {bytes} bytes, more than the {MAX_LABEL_BYTES} one snapshot may"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_by_their_bytes_together() {
        let mut labels = BTreeMap::new();
        for n in 0..63 {
            labels.insert(format!("k{n:02}"), "v".repeat(4096));
        }
        assert!(check("s", &labels).is_ok());
        labels.insert("k63".into(), "v".repeat(4096));
        let err = check("s", &labels).unwrap_err().to_string();
        assert!(
            err.contains("snapshot `s`") && err.contains("262144"),
            "{err}"
        );
    }
}

//! The YAML config file, with GrootFS's key names. Unknown keys are ignored so a GrootFS
//! config works unchanged; command-line flags win over anything set here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Config {
    /// Kept even when empty: GrootFS's tooling writes every key, `store: ""` among them,
    /// beside a `--store` flag. With no flag, an empty store is refused where the store
    /// path is settled ([`Config::store_path`]), not taken as the default store: every
    /// command, `delete-store` among them, would act on it, where an operator running two
    /// stores from two configs meant another.
    pub store: Option<PathBuf>,
    #[serde(deserialize_with = "empty_is_none")]
    pub log_level: Option<String>,
    #[serde(deserialize_with = "empty_is_none")]
    pub log_file: Option<PathBuf>,
    /// As `--log-format`: `lager` or `json`.
    #[serde(deserialize_with = "empty_is_none")]
    pub log_format: Option<String>,
    /// As `--max-layer-bytes`: the per-layer cap on uncompressed bytes.
    pub max_layer_bytes: Option<u64>,
    /// As `--registry-timeout-seconds`: how long a registry may send nothing.
    pub registry_timeout_seconds: Option<u64>,
    /// As `--registry-auth-file`: a Docker config.json with registry credentials.
    #[serde(deserialize_with = "empty_is_none")]
    pub registry_auth_file: Option<PathBuf>,
    /// As `--registry-certs-dir`: per-registry CAs and client certificates.
    #[serde(deserialize_with = "empty_is_none")]
    pub registry_certs_dir: Option<PathBuf>,
    /// As `--lock-timeout-seconds`: the longest wait for a store lock.
    pub lock_timeout_seconds: Option<u64>,
    pub create: CreateConfig,
    pub clean: CleanConfig,
    pub init: InitConfig,
    pub pool: PoolConfig,
    pub daemon: DaemonConfig,
}

/// `lamina daemon`'s settings (the packaged /etc/lamina/config.yaml sets them).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DaemonConfig {
    /// As `--containerd-socket`: serve containerd's snapshots service there.
    #[serde(deserialize_with = "empty_is_none")]
    pub containerd_socket: Option<PathBuf>,
    /// As `--snapshot-strategy`.
    #[serde(deserialize_with = "empty_is_none")]
    pub snapshot_strategy: Option<String>,
    /// As `--interval-ms`.
    pub interval_ms: Option<u64>,
    /// As `--label-strategies`: what a snapshot's strategy label may name.
    #[serde(deserialize_with = "empty_is_none")]
    pub label_strategies: Option<String>,
    /// As `--metrics-address`: HOST:PORT of the Prometheus endpoint (off without it).
    #[serde(deserialize_with = "empty_is_none")]
    pub metrics_address: Option<String>,
    /// As `--remote-snapshots`: the registries remote snapshots may come from.
    #[serde(deserialize_with = "empty_is_none")]
    pub remote_snapshots: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CleanConfig {
    /// As `clean --threshold-bytes`; also what `create --with-clean` passes.
    pub threshold_bytes: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct InitConfig {
    /// As `init-store --store-size-bytes`; what `capacity` reports.
    pub store_size_bytes: Option<u64>,
    /// As `init-store --uid-mapping` / `--gid-mapping` (`NS:HOST:SIZE` strings).
    pub uid_mappings: Vec<String>,
    pub gid_mappings: Vec<String>,
    /// As `init-store --share-file-content`.
    pub share_file_content: bool,
    /// As `init-store --layer-data`: `objects` or `files`.
    pub layer_data: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PoolConfig {
    /// Ready overlays to keep per image: `pool fill`'s default size and the level the
    /// background refill restores after a claim.
    pub size: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CreateConfig {
    pub without_mount: bool,
    /// Comma-separated strategies, as `--strategy`.
    #[serde(deserialize_with = "empty_is_none")]
    pub strategy: Option<String>,
    /// As `--disk-limit-size-bytes`.
    pub disk_limit_size_bytes: Option<u64>,
    /// As `--exclude-image-from-quota`.
    pub exclude_image_from_quota: bool,
    /// What isolated uppers on disk are formatted with: `ext4` (default) or `xfs`.
    #[serde(deserialize_with = "empty_is_none")]
    pub isolated_filesystem: Option<String>,
    /// As `--with-clean`: after each create, clean in the background.
    pub with_clean: bool,
    /// As `--insecure-registry`, for every command that pulls.
    pub insecure_registries: Vec<String>,
}

impl CreateConfig {
    /// The disk limit flags ask for, falling back to this config.
    pub fn disk_limit(&self, bytes: Option<u64>, exclude: bool) -> Option<lamina_mount::DiskLimit> {
        bytes
            .or(self.disk_limit_size_bytes)
            .filter(|b| *b > 0)
            .map(|bytes| lamina_mount::DiskLimit {
                bytes,
                exclude_image: exclude || self.exclude_image_from_quota,
            })
    }

    pub fn disk_fs(&self) -> anyhow::Result<lamina_sys::DiskFs> {
        match &self.isolated_filesystem {
            None => Ok(lamina_sys::DiskFs::default()),
            Some(name) => lamina_mount::isolated::disk_fs(name)
                .map_err(|e| anyhow::anyhow!("config create.isolated_filesystem: {e}")),
        }
    }
}

impl Config {
    /// The store `flag` names, else this config's, else `default`; an empty `store` key
    /// with no flag is an error (see [`Config::store`]).
    pub fn store_path(&self, flag: Option<PathBuf>, default: &str) -> anyhow::Result<PathBuf> {
        match flag.or_else(|| self.store.clone()) {
            Some(path) if path.as_os_str().is_empty() => Err(anyhow::anyhow!(
                "`store` is empty in the config: name the store, or leave the key out for the default"
            )),
            Some(path) => Ok(path),
            None => Ok(PathBuf::from(default)),
        }
    }

    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?;
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_yaml_ng::from_str(&text)
            .map_err(|e| anyhow::anyhow!("config {}: {}", path.display(), one_line(&e.to_string())))
    }
}

/// A string key that is present but empty is unset: GrootFS's tooling writes every key,
/// `log_file: ""` among them, and an empty path is no path.
fn empty_is_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: From<String>,
{
    let text: Option<String> = Option::deserialize(deserializer)?;
    Ok(text.filter(|t| !t.is_empty()).map(T::from))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packaged_config_sets_the_daemon_up_for_containerd() {
        let packaged = include_str!("../../../packaging/config.yaml");
        let config: Config = serde_yaml_ng::from_str(packaged).unwrap();
        assert_eq!(config.store, Some(PathBuf::from("/var/lib/lamina")));
        assert_eq!(
            config.daemon.containerd_socket,
            Some(PathBuf::from("/run/lamina/snapshotter.sock"))
        );
        assert_eq!(config.daemon.snapshot_strategy.as_deref(), Some("auto"));
        assert_eq!(config.daemon.interval_ms, None);
    }

    #[test]
    fn grootfs_configs_parse_with_unknown_keys_ignored() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            tmp.path(),
            "store: /var/vcap/data/grootfs/store\nlog_level: debug\ncreate:\n  without_mount: true\n  strategy: metacopy,deferred\n  with_clean: false\n  insecure_registries: []\nclean:\n  threshold_bytes: 1000\n",
        )
        .unwrap();
        let config = Config::load(tmp.path()).unwrap();
        assert_eq!(
            config.store.as_deref(),
            Some(Path::new("/var/vcap/data/grootfs/store"))
        );
        assert_eq!(config.log_level.as_deref(), Some("debug"));
        assert!(config.create.without_mount);
        assert_eq!(config.create.strategy.as_deref(), Some("metacopy,deferred"));
        assert_eq!(config.pool.size, None);
        assert_eq!(config.clean.threshold_bytes, Some(1000));
        assert!(!config.create.with_clean);
    }

    #[test]
    fn empty_strings_are_unset() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            tmp.path(),
            "log_file: \"\"\nlog_level: \"\"\ncreate:\n  strategy: \"\"\n",
        )
        .unwrap();
        let config = Config::load(tmp.path()).unwrap();
        assert_eq!(config.store, None);
        assert_eq!(config.log_file, None);
        assert_eq!(config.log_level, None);
        assert_eq!(config.create.strategy, None);
        // An empty store is refused unless a flag names one (GrootFS's runner passes
        // `--store` beside a config that says `store: ""`).
        std::fs::write(tmp.path(), "store: \"\"\n").unwrap();
        let config = Config::load(tmp.path()).unwrap();
        let err = config.store_path(None, "/default").unwrap_err();
        assert!(format!("{err:#}").contains("`store` is empty"), "{err:#}");
        let flag = Some(PathBuf::from("/flag"));
        assert_eq!(
            config.store_path(flag, "/default").unwrap(),
            Path::new("/flag")
        );
        let unset = Config::default().store_path(None, "/default").unwrap();
        assert_eq!(unset, Path::new("/default"));
    }

    #[test]
    fn registry_and_lock_timeouts_are_top_level_keys() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            tmp.path(),
            "registry_timeout_seconds: 5\nlock_timeout_seconds: 7\n",
        )
        .unwrap();
        let config = Config::load(tmp.path()).unwrap();
        assert_eq!(config.registry_timeout_seconds, Some(5));
        assert_eq!(config.lock_timeout_seconds, Some(7));
    }

    #[test]
    fn malformed_yaml_is_one_line_naming_the_file() {
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), "store: [unclosed\n").unwrap();
        let err = Config::load(tmp.path()).unwrap_err().to_string();
        assert!(
            !err.contains('\n') && err.contains(&tmp.path().display().to_string()),
            "{err}"
        );
    }
}

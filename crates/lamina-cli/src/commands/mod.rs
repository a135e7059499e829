//! One function per subcommand, after flags and config are merged.

mod absent;
mod background;
mod create;
pub(crate) mod daemon;
mod image_texts;
mod lazy_server;
mod pool;
mod stats;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use lamina_mount::Deleted;
use lamina_store::{IdMap, IdMapping, ImportProgress, Store, StoreError, StoreProperties};
use lamina_sys::RealMounter;

use crate::config::Config;
use crate::{Cli, Command, DEFAULT_STORE};

/// Runs `lamina daemon`; only `lamina-daemon` links one in (`crate::Daemon`).
pub(crate) type DaemonMain = fn(&Ctx, RealMounter, daemon::Flags) -> anyhow::Result<()>;

/// A failure whose report the command already printed: exit 1 without another line.
#[derive(Debug, thiserror::Error)]
#[error("already reported")]
pub struct AlreadyReported;

/// What every command needs: merged settings and the store path.
pub(crate) struct Ctx {
    pub config: Config,
    pub store_path: PathBuf,
    pub log_file: Option<PathBuf>,
    /// This command's log level, which the work it starts in the background logs at too.
    pub log_level: String,
    /// Per-layer cap on uncompressed bytes for every import this command runs.
    pub max_layer_bytes: u64,
    /// How docker:// images are fetched.
    pub pull: lamina_registry::PullOptions,
    /// Where imports report progress: bars on a terminal, log lines otherwise.
    pub progress: Arc<dyn ImportProgress>,
    /// The longest any wait for a store lock lasts.
    pub lock_timeout: std::time::Duration,
    /// `--config`, which a daemon this command starts reads too.
    pub config_path: Option<PathBuf>,
}

impl Ctx {
    /// Opens the store and, as every start does, hands trash a crash left to a reaper.
    pub fn open_store(&self) -> anyhow::Result<Store> {
        let store = self
            .open_bare_store()?
            .with_max_layer_bytes(self.max_layer_bytes)
            .with_import_progress(self.progress.clone());
        background::finish_crashed_deletes(&store, self.background_log());
        Ok(store)
    }

    /// Opens the store with only the lock timeout applied: for commands that import
    /// nothing and must not start a reaper (check, reap, clean).
    pub fn open_bare_store(&self) -> anyhow::Result<Store> {
        Ok(Store::open(&self.store_path)?.with_lock_timeout(self.lock_timeout))
    }

    pub fn spawn(&self, store: &Store, args: &[&str]) {
        background::spawn(store, self.background_log(), args);
    }

    /// Where and at what level work this command starts in the background logs.
    pub fn background_log(&self) -> background::Log<'_> {
        background::Log {
            file: self.log_file.as_deref(),
            level: &self.log_level,
        }
    }
}

/// Whether a new store keeps layer data in `objects/`: as the flag says, else the
/// config's `init.layer_data`, else yes for a store whose configured strategy is
/// composefs (each content once is what a composefs store is for).
fn layer_data_in_objects(
    ctx: &Ctx,
    flag: Option<&str>,
    properties: &StoreProperties,
) -> anyhow::Result<bool> {
    let config = &ctx.config;
    match flag.or(config.init.layer_data.as_deref()) {
        Some("objects") => Ok(true),
        Some("files") => Ok(false),
        Some(other) => Err(anyhow!(
            "init.layer_data `{}` in the config: expected `objects` or `files`",
            lamina_image::shown(other)
        )),
        // composefs is refused for a mapped store, and a sharing store has its one copy.
        None => Ok(!properties.mapped()
            && !properties.shared_file_content
            && config
                .create
                .strategy
                .as_deref()
                .is_some_and(|s| s.split(',').any(|name| name.trim() == "composefs"))),
    }
}

/// Flags win over the config; mappings are a store property, recorded once.
fn init_store(
    ctx: &Ctx,
    store_size_bytes: Option<u64>,
    (uid_mappings, gid_mappings): (Vec<String>, Vec<String>),
    chown_layers: bool,
    (share_file_content, layer_data): (bool, Option<String>),
) -> anyhow::Result<()> {
    let init = &ctx.config.init;
    let parse = |flags: Vec<String>, config: &[String]| -> anyhow::Result<Vec<IdMapping>> {
        let texts = if flags.is_empty() {
            config.to_vec()
        } else {
            flags
        };
        texts
            .iter()
            .map(|t| IdMapping::parse(t).map_err(|e| anyhow!(e)))
            .collect()
    };
    let properties = StoreProperties {
        id_map: IdMap {
            uids: parse(uid_mappings, &init.uid_mappings)?,
            gids: parse(gid_mappings, &init.gid_mappings)?,
        },
        store_size_bytes: store_size_bytes.or(init.store_size_bytes),
        chowned_layers: chown_layers,
        shared_file_content: share_file_content || init.share_file_content,
        layer_data_in_objects: false,
    };
    let properties = StoreProperties {
        layer_data_in_objects: layer_data_in_objects(ctx, layer_data.as_deref(), &properties)?,
        ..properties
    };
    let path = &ctx.store_path;
    // GrootFS's text (init_store_test.go, "when the user is not root"): a store is made
    // private to root, with root's chowns and mounts.
    if !lamina_sys::HostFs::may_chown(&lamina_sys::RealHost) {
        anyhow::bail!(
            "store {} can only be initialized by Root user",
            path.display()
        );
    }
    let existed = Store::open(path).is_ok();
    let properties = lamina_mount::init_store(path, properties)?
        .properties()
        .clone();
    if existed {
        // GrootFS's event name, which init_store_test.go reads in the log.
        tracing::info!(store = %path.display(), "store-already-initialized");
    }
    let how = if properties.idmaps_layers() {
        " (layers idmapped at mount)"
    } else if properties.chowns_layers() {
        " (layers chowned at import)"
    } else {
        ""
    };
    let shared = if properties.shared_file_content {
        " (file content shared across images)"
    } else if properties.layer_data_in_objects {
        " (layer data in objects, each content once)"
    } else {
        ""
    };
    println!("initialised store {}{how}{shared}", path.display());
    Ok(())
}

/// A missing store is already deleted (Garden calls this on every teardown); anything
/// that is not a lamina store is refused untouched.
fn delete_store(ctx: &Ctx, mounter: &RealMounter) -> anyhow::Result<()> {
    let path = &ctx.store_path;
    if !path.exists() {
        println!("store {} does not exist: nothing to delete", path.display());
        return Ok(());
    }
    let store = match Store::open(path) {
        Ok(store) => store.with_lock_timeout(ctx.lock_timeout),
        Err(StoreError::NotInitialised(_) | StoreError::NotAStore(_)) => anyhow::bail!(
            "refusing to delete {}: it is not a lamina store (no valid store marker)",
            path.display()
        ),
        Err(e) => return Err(e.into()),
    };
    let unmounted = lamina_mount::delete_store(&store, mounter)?;
    println!(
        "deleted store {} ({unmounted} mounts released)",
        path.display()
    );
    Ok(())
}

/// Where per-registry TLS files are looked for when none is configured.
const DEFAULT_CERTS_DIR: &str = "/etc/lamina/certs.d";

pub fn run(cli: Cli, daemon_main: Option<DaemonMain>) -> anyhow::Result<()> {
    let Cli {
        globals: cli,
        command,
        ..
    } = cli;
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let level = cli
        .log_level
        .or(config.log_level.clone())
        .unwrap_or_else(|| default_log_level(&command).into());
    let log_file = cli.log_file.or(config.log_file.clone());
    let bars = crate::progress::Bars::on_terminal();
    let format = crate::logging::Format::named(
        cli.log_format.as_deref().or(config.log_format.as_deref()),
        command.name(),
    )?;
    crate::logging::init(
        &level,
        log_file.as_deref(),
        bars.as_ref().map(crate::progress::Bars::multi),
        format,
    )?;
    let progress: Arc<dyn ImportProgress> = match bars {
        Some(bars) => Arc::new(bars),
        None => Arc::new(crate::progress::LogLines::default()),
    };
    let store_path = absolute(config.store_path(cli.store, DEFAULT_STORE)?)?;
    let max_layer_bytes = cli
        .max_layer_bytes
        .or(config.max_layer_bytes)
        .unwrap_or(lamina_store::DEFAULT_MAX_LAYER_BYTES);
    let credentials = match (cli.username, cli.password) {
        (Some(username), Some(password)) => {
            Some(lamina_registry::Credentials { username, password })
        }
        (None, None) => None,
        // A password from the environment alone is the operator's for `docker://` pulls
        // that name a user; exported for every command (as docs/registry.md advises),
        // it must not fail the ones that name none (a delete, say).
        (None, Some(password)) if password_from_environment(&password) => None,
        _ => return Err(anyhow!("--username and --password go together")),
    };
    let mut insecure_registries = cli.insecure_registries;
    insecure_registries.extend(config.create.insecure_registries.iter().cloned());
    let stall_timeout = cli
        .registry_timeout_seconds
        .or(config.registry_timeout_seconds)
        .map_or(lamina_registry::DEFAULT_STALL_TIMEOUT, |secs| {
            std::time::Duration::from_secs(secs.max(1))
        });
    let lock_timeout = cli
        .lock_timeout_seconds
        .or(config.lock_timeout_seconds)
        .map_or(
            lamina_store::DEFAULT_LOCK_TIMEOUT,
            std::time::Duration::from_secs,
        );
    let certs_dir = cli
        .registry_certs_dir
        .or(config.registry_certs_dir.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CERTS_DIR));
    // Only a file the operator names: root's own `docker login` must not serve whatever
    // images tenants name.
    let auth_file = cli.registry_auth_file.or(config.registry_auth_file.clone());
    let pull = lamina_registry::PullOptions {
        credentials,
        insecure_registries,
        stall_timeout,
        certs_dir: Some(certs_dir),
        auth_file,
        ..lamina_registry::PullOptions::default()
    };
    let ctx = Ctx {
        config,
        store_path,
        log_file,
        log_level: level,
        max_layer_bytes,
        pull,
        progress,
        lock_timeout,
        config_path: cli.config.clone(),
    };
    let mounter = RealMounter::new();

    match command {
        Command::InitStore {
            rootless: Some(user),
            ..
        } => {
            return Err(anyhow!(
                "init-store --rootless `{}`: lamina does not read /etc/subuid; pass the mappings with --uid-mapping and --gid-mapping",
                lamina_image::shown(&user)
            ));
        }
        Command::InitStore {
            store_size_bytes,
            uid_mappings,
            gid_mappings,
            chown_layers,
            share_file_content,
            layer_data,
            ..
        } => init_store(
            &ctx,
            store_size_bytes,
            (uid_mappings, gid_mappings),
            chown_layers,
            (share_file_content, layer_data),
        )?,
        Command::Create(args) => create::run(&ctx, &mounter, args)?,
        Command::Delete { id_or_path } => delete(&ctx, &mounter, &id_or_path)?,
        Command::Pull {
            image,
            platform,
            lazy,
        } => {
            let store = ctx.open_store()?;
            let resolved = ctx.resolve_image(&store, &image, platform.as_deref())?;
            let _in_use = store.use_layers()?;
            let chain_ids = if lazy {
                let server = lazy_server::starter(&ctx);
                lamina_mount::pull_lazily(&store, &mounter, &resolved, Some(&server))?
            } else {
                store.import(&resolved)?
            };
            let top = chain_ids.last().map(ToString::to_string);
            println!(
                "{}",
                crate::output::json_line(
                    &serde_json::json!({ "image": resolved.source, "layers": chain_ids.len(), "top_chain_id": top })
                )?
            );
        }
        Command::Check { repair, verify } => {
            let store = ctx.open_bare_store()?;
            let report = lamina_mount::check_verified(&store, &mounter, repair, verify)?;
            println!("{}", crate::output::json_line(&report)?);
            if !report.ok {
                return Err(AlreadyReported.into());
            }
        }
        Command::List => {
            if !ctx.store_path.exists() {
                anyhow::bail!(absent::no_store(&ctx.store_path));
            }
            let store = ctx.open_store()?;
            let scan = lamina_mount::record::scan(&store)?;
            // GrootFS's list_test.go: each image's directory, or `Store empty`.
            if scan.containers.is_empty() && scan.bad.is_empty() {
                println!("Store empty");
            }
            for container in &scan.containers {
                let dir = store.layout().container(container.id());
                println!("{}", lamina_store::printable(&dir.display().to_string()));
            }
            // One container's torn record must not hide the others: it is named on
            // stderr (a log line each) and the listing still succeeds.
            for bad in &scan.bad {
                tracing::warn!(
                    container = %bad.id,
                    record = %bad.path.display(),
                    why = %bad.why,
                    "container not listed: its record is unreadable (see `lamina check`)"
                );
            }
        }
        Command::DeleteStore => delete_store(&ctx, &mounter)?,
        Command::BuildMetadataImage { chain_ids } => {
            let store = ctx.open_bare_store()?;
            let chain_ids = chain_ids
                .iter()
                .map(|c| lamina_image::Digest::parse(c))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("invalid chain ID: {e}"))?;
            // Only a real chain of imported layers: a list of some of them would build
            // an image that shows as the whole one's.
            if !lamina_mount::composefs_auto::is_imported_chain(&store, &chain_ids)? {
                anyhow::bail!(
                    "the chain IDs are not a chain of layers imported into this store, bottom first"
                );
            }
            let built = match lamina_mount::composefs_auto::build_for(&store, &mounter, &chain_ids)?
            {
                lamina_mount::composefs_auto::Built::Built => "built".to_string(),
                lamina_mount::composefs_auto::Built::NothingToBuild => "nothing to build".into(),
                lamina_mount::composefs_auto::Built::Busy => "busy".into(),
                lamina_mount::composefs_auto::Built::Refused(why) => format!("refused: {why}"),
                lamina_mount::composefs_auto::Built::Failed(why) => format!("not built: {why}"),
            };
            let top = chain_ids.last().map(ToString::to_string);
            println!(
                "{}",
                serde_json::json!({ "image": top, "metadata_image": built })
            );
        }
        Command::Reap { linger_ms } => {
            let store = ctx.open_bare_store()?;
            let linger = std::time::Duration::from_millis(linger_ms);
            let reaped = lamina_mount::reap_lingering(&store, &mounter, linger)?;
            println!("{}", crate::output::json_line(&reaped)?);
        }
        Command::Clean { threshold_bytes } => {
            let threshold =
                crate::usage::bytes(threshold_bytes).or(ctx.config.clean.threshold_bytes);
            let report = match absent::clean(&ctx, threshold) {
                Some(nothing) => nothing,
                None => lamina_mount::clean(&ctx.open_bare_store()?, &mounter, threshold)?,
            };
            println!("{}", crate::output::json_line(&report)?);
        }
        Command::Stats { id_or_path } => stats::run(&ctx, &mounter, &id_or_path)?,
        Command::Capacity => {
            let capacity = stats::capacity(&ctx, ctx.config.init.store_size_bytes)?;
            println!(
                "{}",
                crate::output::json_line(&serde_json::json!({ "capacity": capacity }))?
            );
        }
        Command::Mount { id_or_path } => {
            let store = ctx.open_store()?;
            let id = container_id(&store, &id_or_path)?;
            lamina_mount::mount(&store, &mounter, &id)?;
            let rootfs = store.rootfs_path(&id).display().to_string();
            println!("{}", lamina_store::printable(&rootfs));
        }
        Command::Unmount { id_or_path } => {
            let store = ctx.open_store()?;
            let id = container_id(&store, &id_or_path)?;
            lamina_mount::unmount(&store, &mounter, &id)?;
            println!("unmounted container `{}`", lamina_store::printable(&id));
        }
        Command::Pool(command) => pool::run(&ctx, &mounter, command)?,
        Command::Daemon {
            interval_ms,
            containerd_socket,
            snapshot_strategy,
            label_strategies,
            metrics_address,
            remote_snapshots,
        } => {
            let main =
                daemon_main.ok_or_else(|| anyhow!("daemon: this binary has no daemon built in"))?;
            main(
                &ctx,
                mounter,
                daemon::Flags {
                    interval_ms,
                    containerd_socket,
                    snapshot_strategy,
                    label_strategies,
                    metrics_address,
                    remote_snapshots,
                },
            )?;
        }
        Command::Probe { refresh } => {
            let store = ctx.open_store()?;
            let probe =
                lamina_mount::probe::probe(&store, &mounter, refresh).with_context(|| {
                    format!("probing overlay support in {}", ctx.store_path.display())
                })?;
            println!("{}", crate::output::json_line(&probe)?);
        }
        Command::SampleImage { out_dir, busybox } => {
            let out_dir = absolute(out_dir)?;
            let image = lamina_sample::busybox_image(&busybox)?;
            let files = lamina_sample::write_all_formats(&image, &out_dir)
                .with_context(|| format!("writing sample image to {}", out_dir.display()))?;
            let [oci, oci_archive, docker_archive, rootfs_tar] = files.references();
            let refs = serde_json::json!({
                "oci": oci, "oci_archive": oci_archive, "docker_archive": docker_archive, "rootfs_tar": rootfs_tar
            });
            println!("{refs}");
        }
    }
    Ok(())
}

/// GrootFS's delete (delete_test.go): whatever is not there is already deleted, so an
/// unknown ID, a path outside the store and a store that does not exist all exit 0 with
/// a line saying why nothing was done.
fn delete(ctx: &Ctx, mounter: &RealMounter, id_or_path: &str) -> anyhow::Result<()> {
    let outside = || format!("path `{id_or_path}` is outside store path");
    // Each skip is logged with the ID or path asked about, as GrootFS logs it
    // (delete_test.go, "when the store doesn't exist").
    let skipped = |why: &str| {
        tracing::info!(id = %lamina_image::shown(id_or_path), why, "nothing to delete");
    };
    if !ctx.store_path.exists() {
        skipped(&absent::no_store(&ctx.store_path));
        match id_or_path.contains('/') {
            true => say(&outside()),
            false => say(&format!("Image `{id_or_path}` not found. Skipping delete.")),
        }
        return Ok(());
    }
    let store = ctx.open_store()?;
    let id = match container_id(&store, id_or_path) {
        Ok(id) => id,
        // GrootFS's answer for a path that is no rootfs of this store, exit 0. A path
        // that exists but names the store another way (a symlink) is an error, not a
        // delete that silently did nothing.
        Err(e) if std::path::Path::new(id_or_path).exists() => return Err(e),
        Err(_) => {
            skipped("outside the store");
            say(&outside());
            return Ok(());
        }
    };
    match lamina_mount::delete(&store, mounter, &id)? {
        Deleted::Removed => say(&format!("deleted container `{id}`")),
        Deleted::Deferred => {
            if !lamina_mount::reaper_running(&store) {
                background::spawn_reaper(&store, ctx.background_log());
            }
            say(&format!("deleted container `{id}`"));
        }
        Deleted::NotFound => {
            skipped("not found");
            say(&format!("Image `{id}` not found. Skipping delete."));
        }
    }
    Ok(())
}

/// GrootFS's default, `fatal`, for the commands Garden and operators run per call (their
/// failures reach stdout regardless); `info` for the daemon, whose log is all it says.
fn default_log_level(command: &Command) -> &'static str {
    match command {
        Command::Daemon { .. } => "info",
        _ => "fatal",
    }
}

/// One line on stdout naming what the caller gave, its control characters escaped.
fn say(line: &str) {
    println!("{}", crate::output::error_line(line));
}

/// An ID, or the ID of the rootfs path given (Garden passes either).
fn container_id(store: &Store, arg: &str) -> anyhow::Result<String> {
    if !arg.contains('/') {
        return Ok(arg.to_string());
    }
    let path = absolute(PathBuf::from(arg))?;
    store.id_from_path(&path).ok_or_else(|| {
        anyhow!(
            "path `{}` is outside store path {}",
            path.display(),
            store.root().display()
        )
    })
}

fn absolute(path: PathBuf) -> anyhow::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path);
    }
    Ok(std::env::current_dir()
        .context("current directory")?
        .join(path))
}

impl Ctx {
    /// Resolves an image reference for `platform` (default: this host's): a registry for
    /// `docker://`, the local file or layout otherwise. A rootfs tar's digest is taken from
    /// `store`'s memo of it when the file has not changed since it was hashed.
    pub fn resolve_image(
        &self,
        store: &Store,
        image: &str,
        platform: Option<&str>,
    ) -> anyhow::Result<lamina_image::Image> {
        let platform = platform
            .map(lamina_image::Platform::parse)
            .transpose()?
            .unwrap_or_else(lamina_image::Platform::host);
        if let Some(reference) = lamina_registry::RegistryRef::parse(image) {
            return Ok(lamina_registry::resolve(
                &reference?,
                &self.pull,
                &platform,
            )?);
        }
        let reference = lamina_image::ImageRef::parse(image)?;
        image_texts::check_local(&reference)?;
        Ok(lamina_image::resolve_remembering(
            &reference,
            &platform,
            self.max_layer_bytes,
            store,
        )?)
    }
}

/// Whether `password` is the one in the environment (so it need not have been given as a
/// flag), in which case it alone asks for nothing.
fn password_from_environment(password: &str) -> bool {
    std::env::var_os(crate::PASSWORD_ENV).is_some_and(|value| value == password)
}

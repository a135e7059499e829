//! `lamina`: a GrootFS-compatible image plugin. Results and errors go to stdout (one
//! line each, as Garden expects), logs to stderr as JSON lines; exit 1 on any error.
//!
//! Two binaries run this library: `lamina` (src/main.rs), which Garden spawns per create
//! and delete and which leaves the daemon out, and `lamina-daemon`
//! (src/bin/lamina-daemon.rs), the same commands with the daemon's gRPC and HTTP stack
//! linked in. `lamina daemon …` execs `lamina-daemon` beside it.

mod commands;
mod config;
mod fast_args;
mod lager;
mod logging;
mod output;
mod progress;
mod usage;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Where `--password` may come from instead (flags show in `ps`).
const PASSWORD_ENV: &str = "LAMINA_REGISTRY_PASSWORD";

/// What `--version` prints after the name: the release, the commit built, and what the
/// binary holds (none of it is a cargo feature a build could leave out; the daemon is a
/// binary of its own, which `lamina daemon` runs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LAMINA_COMMIT"),
    ", ",
    env!("LAMINA_TARGET"),
    ", ",
    env!("LAMINA_PROFILE"),
    "; built in: garden image plugin, registry client, composefs; containerd snapshotter and daemon: lamina-daemon)"
);

/// The daemon's binary, installed beside `lamina`.
pub const DAEMON_BINARY: &str = "lamina-daemon";

/// The store GrootFS-style deployments use when none is configured.
const DEFAULT_STORE: &str = "/var/lib/lamina";

#[derive(Debug, Parser)]
#[command(
    name = "lamina",
    version = VERSION,
    about = "Container root filesystems from OCI images, on OverlayFS"
)]
pub struct Cli {
    #[command(flatten)]
    globals: Globals,
    #[command(flatten)]
    grootfs: usage::GrootfsGlobals,
    #[command(subcommand)]
    command: Command,
}

/// The flags every command takes (`global`: before or after the command's name).
#[derive(Debug, Default, clap::Args)]
pub struct Globals {
    /// Store directory [default: /var/lib/lamina, or `store` in --config]
    #[arg(long, global = true)]
    store: Option<PathBuf>,
    /// YAML config file (GrootFS keys; unknown keys ignored; flags win)
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// fatal (GrootFS's default, and lamina's but for the daemon's info; as error here), error, warn, info, debug or trace [default: fatal; info for daemon]
    #[arg(long, global = true)]
    log_level: Option<String>,
    /// Append logs to this file instead of stderr
    #[arg(long, global = true)]
    log_file: Option<PathBuf>,
    /// Log lines as `lager` (Cloud Foundry's, which Garden parses; GrootFS's format) or `json` (tracing's) [default: lager, `json` for `daemon`, or `log_format` in --config]
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<String>,
    /// Refuse a layer that unpacks to more than this many bytes (a decompression bomb) [default: `max_layer_bytes` in --config, else 64 GiB]
    #[arg(long, global = true, value_name = "N")]
    max_layer_bytes: Option<u64>,
    /// Registry username for docker:// images (Basic, or traded for a Bearer token)
    #[arg(long, global = true)]
    username: Option<String>,
    /// Registry password for docker:// images (prefer the environment variable: flags show in ps)
    #[arg(
        long,
        global = true,
        env = PASSWORD_ENV,
        hide_env_values = true
    )]
    password: Option<String>,
    /// HOST[:PORT] to pull docker:// images from over plain HTTP, repeatable [default: `create.insecure_registries` in --config]
    #[arg(long = "insecure-registry", global = true, value_name = "HOST")]
    insecure_registries: Vec<String>,
    /// A Docker config.json to take registry credentials from when none are given: `auths`, `credHelpers`, `credsStore` (e.g. /root/.docker/config.json) [default: `registry_auth_file` in --config, else none]
    #[arg(long, global = true, value_name = "FILE")]
    registry_auth_file: Option<PathBuf>,
    /// Per-registry TLS files, Docker's and containerd's certs.d: DIR/HOST[:PORT]/*.crt (CAs to trust beside the system's), client.cert and client.key [default: `registry_certs_dir` in --config, else /etc/lamina/certs.d]
    #[arg(long, global = true, value_name = "DIR")]
    registry_certs_dir: Option<PathBuf>,
    /// Fail a registry connection, lookup or request that gets nothing, or under 1 KiB/s, for this many seconds [default: `registry_timeout_seconds` in --config, else 60]
    #[arg(long, global = true, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    registry_timeout_seconds: Option<u64>,
    /// Give up waiting for a store lock another process holds after this many seconds, naming the holder [default: `lock_timeout_seconds` in --config, else 600]
    #[arg(long, global = true, value_name = "SECONDS")]
    lock_timeout_seconds: Option<u64>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the store's directories (again: fine with the same properties)
    InitStore {
        /// The store's size, which `capacity` reports [default: `init.store_size_bytes` in --config]
        #[arg(long)]
        store_size_bytes: Option<u64>,
        /// NS_ID:HOST_ID:SIZE, repeatable: containers run in a user namespace with these uid mappings, and their rootfs appears owned by the mapped root [default: `init.uid_mappings` in --config]
        #[arg(long = "uid-mapping", value_name = "NS:HOST:SIZE")]
        uid_mappings: Vec<String>,
        /// NS_ID:HOST_ID:SIZE, repeatable, as --uid-mapping for groups
        #[arg(long = "gid-mapping", value_name = "NS:HOST:SIZE")]
        gid_mappings: Vec<String>,
        /// With mappings: chown layers to the mapped ids at import instead of idmapping them at mount (the default where the kernel can; needed for --without-mount)
        #[arg(long)]
        chown_layers: bool,
        /// Store each file content once across images on any filesystem: an import links a file whose content, owner, mode, time and xattrs another image's file has to that file's inode (every view of it then shows the link count: see docs/security.md)
        #[arg(long)]
        share_file_content: bool,
        /// Where layer file data lives: `objects` keeps each content once in `objects/` and leaves metadata-only stubs in the layers, which overlay reads with metacopy (no inode shared between images: see docs/store.md); `files` keeps every layer's own copy [default: `init.layer_data` in --config, else `objects` when `create.strategy` there names composefs, else `files`]
        #[arg(long, value_name = "objects|files", value_parser = ["objects", "files"])]
        layer_data: Option<String>,
        /// Ignored (GrootFS's direct I/O for its loop-mounted XFS store; lamina mounts no store filesystem)
        #[arg(long)]
        with_direct_io: bool,
        /// GrootFS's `USER:GROUP` whose subordinate ids map a rootless store: refused, since
        /// accepting and ignoring it would make an unmapped store where a mapped one was
        /// meant (pass --uid-mapping and --gid-mapping)
        #[arg(long, value_name = "USER:GROUP")]
        rootless: Option<String>,
    },
    /// Create a container rootfs from IMAGE and print its runtime-spec JSON
    Create(CreateArgs),
    /// Import IMAGE's layers into the store without making a container (warms it for creates); a second pull of the same image fetches nothing
    Pull {
        image: String,
        /// OS/ARCH[/VARIANT] to choose from a multi-platform image [default: this host's]
        #[arg(long)]
        platform: Option<String>,
        /// Fetch only the index of each layer that carries one (eStargz, zstd:chunked) and leave the rest to `lamina daemon`, which it starts if none serves the store (strategy lazy); other layers are pulled whole
        #[arg(long)]
        lazy: bool,
    },
    /// Verify the store's invariants (layers, records, mounts, temp dirs, loop devices); print a JSON report; exit 1 if anything is left broken
    Check {
        /// Fix what is safe to fix: abandoned work, crashed creates, pending deletes, orphan mounts, leaked loop devices, unused broken layers, unmounted rootfses
        #[arg(long)]
        repair: bool,
        /// Also re-hash every composefs metadata image and object (reads all of them)
        #[arg(long)]
        verify: bool,
    },
    /// Unmount and remove a container (by ID or rootfs path); a missing one is not an error
    Delete {
        /// Container ID or <store>/images/<ID>/rootfs
        id_or_path: String,
    },
    /// Print each container's directory (<store>/images/<ID>), one per line, or `Store empty`
    List,
    /// Unmount everything in the store (containers, pools, shared mounts) and remove it; refuses a directory that is not a lamina store
    DeleteStore,
    /// Finish deferred deletes now: unmount and remove what is in the store's trash
    Reap {
        /// Then look for more trash this long before exiting (what the reaper a delete
        /// starts does: deletes meanwhile start no reaper of their own)
        #[arg(long, hide = true, default_value_t = 0)]
        linger_ms: u64,
    },
    /// Build the composefs metadata image of the image made of these layers (chain IDs,
    /// bottom first): what `create` starts in the background when `auto` served a deep
    /// image from its layers (docs/strategies.md, auto). Prints a JSON line
    #[command(hide = true)]
    BuildMetadataImage {
        #[arg(required = true)]
        chain_ids: Vec<String>,
    },
    /// Finish work a crash left (trash, half-made containers, tmp/); then, unless the store uses no more than the threshold, release unused shared mounts and pool entries and remove layers no container uses. Prints a JSON report
    Clean {
        /// Remove unused layers only when the store uses more than this many bytes (0: always) [default: `clean.threshold_bytes` in --config]
        #[arg(long, allow_negative_numbers = true)]
        threshold_bytes: Option<i64>,
    },
    /// Print a container's disk usage as JSON: {"disk_usage":{"total_bytes_used":N,"exclusive_bytes_used":N,"quota_size_bytes":N,"committed_space_bytes":N}}
    Stats {
        /// Container ID or <store>/images/<ID>/rootfs
        id_or_path: String,
    },
    /// Print the store's capacity as JSON: {"capacity":N} (`init.store_size_bytes`, else what init-store recorded, else the size of the store's filesystem)
    Capacity,
    /// Mount a container's rootfs again (after `unmount`, or after a host restart)
    Mount {
        /// Container ID or <store>/images/<ID>/rootfs
        id_or_path: String,
    },
    /// Unmount a container's rootfs and keep its files (a volatile upper is checked for writeback errors and synced)
    Unmount {
        /// Container ID or <store>/images/<ID>/rootfs
        id_or_path: String,
    },
    /// Pre-mounted read-write overlays that `create` claims with no mount syscall
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Run the store's background work as tasks: reap deferred deletes as they arrive and keep pools filled (stateless: safe to kill at any time); with --containerd-socket, also serve containerd's snapshots API (docs/containerd.md)
    Daemon {
        /// How often to look for work, in milliseconds [default: `daemon.interval_ms` in --config, else 200]
        #[arg(long)]
        interval_ms: Option<u64>,
        /// Serve containerd's snapshots gRPC service on this unix socket (a proxy snapshotter) [default: `daemon.containerd_socket` in --config, else none]
        #[arg(long, value_name = "PATH")]
        containerd_socket: Option<PathBuf>,
        /// Strategies for snapshots without a containerd.io/snapshot/lamina.strategy label [default: `daemon.snapshot_strategy` in --config, else auto]
        #[arg(long)]
        snapshot_strategy: Option<String>,
        /// The strategies a snapshot's containerd.io/snapshot/lamina.strategy label may name, comma-separated (through CRI, pod authors set it) [default: `daemon.label_strategies` in --config, else every one]
        #[arg(long, value_name = "LIST")]
        label_strategies: Option<String>,
        /// Serve Prometheus metrics at http://HOST:PORT/metrics [default: `daemon.metrics_address` in --config, else off]
        #[arg(long, value_name = "HOST:PORT")]
        metrics_address: Option<String>,
        /// Serve containerd's remote snapshots from these registries (HOST[:PORT], or HOST[:PORT]/REPO for the repositories under it; `*` for any), comma-separated: an indexed layer (eStargz, zstd:chunked) containerd asks for with its remote-snapshot labels is served lazily and not downloaded; whoever may push there is trusted not to claim other images' layers (docs/containerd.md) [default: `daemon.remote_snapshots` in --config, else off]
        #[arg(long, value_name = "REGISTRIES")]
        remote_snapshots: Option<String>,
    },
    /// Print what this kernel's overlay supports, as JSON (probed on the store's filesystem, cached per boot)
    Probe {
        /// Probe again even if this boot's result is cached
        #[arg(long)]
        refresh: bool,
    },
    /// Write the built-in busybox sample image in every source format and print their references
    SampleImage {
        /// Directory to write layout/, image.oci.tar, image.docker.tar and rootfs.tar into
        out_dir: PathBuf,
        /// A static busybox binary (Debian's busybox-static)
        #[arg(long, default_value = lamina_sample::DEFAULT_BUSYBOX)]
        busybox: PathBuf,
    },
}

#[derive(Debug, Default, clap::Args)]
pub struct CreateArgs {
    /// oci:///layout[:REF], oci-archive:///image.tar[:REF], docker-archive:///saved.tar[:REPO:TAG], or /rootfs.tar
    pub image: String,
    /// Container ID (becomes <store>/images/<ID>/rootfs)
    pub id: String,
    /// Mount nothing; print the overlay to mount under "mounts"
    #[arg(long)]
    pub without_mount: bool,
    /// Mount the rootfs (the default; overrides `create.without_mount` in --config; --without-mount wins over it, as in GrootFS)
    #[arg(long)]
    pub with_mount: bool,
    /// Comma-separated mount strategies: auto, classic, shared-ro, direct, composefs, lazy, isolated, isolated-memory, isolated-quota, pooled, metacopy, volatile, deferred [default: auto, or `create.strategy` in --config]
    #[arg(long)]
    pub strategy: Option<String>,
    /// The most the container may use, image included unless --exclude-image-from-quota: its upper gets a filesystem of its own of that size (strategy isolated), or on a btrfs store with quotas a subvolume with a qgroup limit (isolated-quota) [default: `create.disk_limit_size_bytes` in --config]
    #[arg(long, allow_negative_numbers = true)]
    pub disk_limit_size_bytes: Option<i64>,
    /// The disk limit counts only what the container writes, not the image
    #[arg(long)]
    pub exclude_image_from_quota: bool,
    /// A read-only rootfs (printed with root.readonly, which runc enforces)
    #[arg(long)]
    pub read_only: bool,
    /// The container's writes need not survive a crash: adds the volatile strategy
    #[arg(long)]
    pub ephemeral: bool,
    /// Platform to pick from a multi-platform image, os/arch[/variant] [default: linux/<host arch>]
    #[arg(long)]
    pub platform: Option<String>,
    /// After the create returns, clean the store in the background (with `clean.threshold_bytes`) [default: `create.with_clean` in --config]
    #[arg(long)]
    pub with_clean: bool,
    /// Do not clean after this create, whatever the config says
    #[arg(long)]
    pub without_clean: bool,
    /// The threshold the --with-clean clean uses [default: `clean.threshold_bytes` in --config]
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    pub threshold_bytes: Option<i64>,
    /// Where the --with-clean clean logs [default: --log-file]
    #[arg(long, value_name = "PATH")]
    pub clean_log_file: Option<PathBuf>,
    /// Ignored: lamina always checks every layer's digest and size against the manifest
    #[arg(long)]
    pub skip_layer_validation: bool,
}

#[derive(Debug, Subcommand)]
enum PoolCommand {
    /// Mount overlays of IMAGE until its pool holds --size of them; with no IMAGE and an isolated strategy, make bare upper filesystems any image's isolated create claims
    Fill {
        image: Option<String>,
        /// How many ready overlays to keep [default: `pool.size` in --config]
        #[arg(long)]
        size: Option<usize>,
        /// Mount flavour, as create's --strategy (auto: what create would pick) [default: auto]
        #[arg(long)]
        strategy: Option<String>,
        /// Fill the pool `create --ephemeral` claims from (volatile overlays)
        #[arg(long)]
        ephemeral: bool,
        /// Upper filesystems sized for creates with this disk limit (as create's flag)
        #[arg(long)]
        disk_limit_size_bytes: Option<u64>,
        #[arg(long)]
        exclude_image_from_quota: bool,
        #[arg(long)]
        platform: Option<String>,
    },
    /// Refill every pool to the size its last `fill` set (what runs in the background after a claim)
    Refill,
    /// Unmount and remove every unclaimed pool entry
    Drain,
}

impl Command {
    /// The command's name as typed: the middle of each lager message (`lamina.create.…`).
    fn name(&self) -> &'static str {
        match self {
            Command::InitStore { .. } => "init-store",
            Command::Create(_) => "create",
            Command::Pull { .. } => "pull",
            Command::Check { .. } => "check",
            Command::Delete { .. } => "delete",
            Command::List => "list",
            Command::DeleteStore => "delete-store",
            Command::Reap { .. } => "reap",
            Command::BuildMetadataImage { .. } => "build-metadata-image",
            Command::Clean { .. } => "clean",
            Command::Stats { .. } => "stats",
            Command::Capacity => "capacity",
            Command::Mount { .. } => "mount",
            Command::Unmount { .. } => "unmount",
            Command::Pool(_) => "pool",
            Command::Daemon { .. } => "daemon",
            Command::Probe { .. } => "probe",
            Command::SampleImage { .. } => "sample-image",
        }
    }
}

/// How a binary runs `lamina daemon`: [`Daemon::EXEC`], or [`daemon_in_process`].
#[derive(Clone, Copy, Debug)]
pub struct Daemon(Option<commands::DaemonMain>);

impl Daemon {
    /// Exec `lamina-daemon` from the directory this binary is in, with the same arguments:
    /// what `lamina` does, so the per-call binary links no gRPC, HTTP or async runtime
    /// (docs/benchmarks.md, "Process per call"). The process keeps its pid, which a
    /// systemd unit of `Type=notify` relies on.
    pub const EXEC: Daemon = Daemon(None);
}

/// The daemon run in this process, as `lamina-daemon` does; naming it is what links it in.
pub fn daemon_in_process() -> Daemon {
    Daemon(Some(commands::daemon::main))
}

/// Both binaries' `main`.
pub fn main(daemon: Daemon) -> ExitCode {
    lamina_store::use_fixed_umask();
    lamina_sys::raise_open_file_limit();
    let cli = match usage::parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    if daemon.0.is_none() && matches!(cli.command, Command::Daemon { .. }) {
        return exec_daemon();
    }
    match commands::run(cli, daemon.0) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<commands::AlreadyReported>() => ExitCode::FAILURE,
        Err(e) => {
            let message = output::error_line(&one_line(&e));
            tracing::error!(error = %message, "command failed");
            println!("{message}");
            ExitCode::FAILURE
        }
    }
}

/// Replaces this process with `lamina-daemon` from this binary's directory; returns only
/// when that fails, having said why.
fn exec_daemon() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().ok();
    let beside = exe
        .as_deref()
        .and_then(|exe| Some(exe.parent()?.join(DAEMON_BINARY)));
    let Some(daemon) = beside.filter(|path| path.is_file()) else {
        println!(
            "{}",
            output::error_line(&format!(
                "daemon: {DAEMON_BINARY} is not installed beside this lamina (the daemon is a binary of its own)"
            ))
        );
        return ExitCode::FAILURE;
    };
    if let Err(why) = trusted_beside(exe.as_deref(), &daemon) {
        println!("{}", output::error_line(&format!("daemon: {why}")));
        return ExitCode::FAILURE;
    }
    let error = std::process::Command::new(&daemon)
        .args(std::env::args_os().skip(1))
        .exec();
    println!(
        "{}",
        output::error_line(&format!("daemon: running {}: {error}", daemon.display()))
    );
    ExitCode::FAILURE
}

/// `lamina-daemon` runs as whoever runs `lamina`, root mostly: it, and the directory it
/// is in, must be owned by root or by `lamina`'s own owner and writable by no one else —
/// else anyone who may add a file beside a root-owned `lamina` could have root run it.
fn trusted_beside(exe: Option<&Path>, daemon: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let owner = exe
        .and_then(|exe| std::fs::metadata(exe).ok())
        .map_or(0, |meta| meta.uid());
    for path in [daemon, daemon.parent().unwrap_or(Path::new("/"))] {
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.uid() != 0 && meta.uid() != owner {
            return Err(format!(
                "{} is owned by uid {}, neither root nor lamina's owner: not running it",
                path.display(),
                meta.uid()
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(format!(
                "{} is writable by its group or others (mode {:o}): not running {DAEMON_BINARY} from it",
                path.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// The error and its causes on one line. Our errors already name their cause in their
/// own text (`removing X: Directory not empty`), so a cause that the line already
/// ends with is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

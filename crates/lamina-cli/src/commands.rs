//! One function per subcommand, after flags and config are merged.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use lamina_image::{ImageRef, Platform};
use lamina_mount::{CreateOptions, Deleted, Strategies};
use lamina_store::Store;
use lamina_sys::RealMounter;

use crate::config::Config;
use crate::output::RuntimeSpec;
use crate::{Cli, Command, DEFAULT_STORE};

pub fn run(cli: Cli) -> anyhow::Result<()> {
    let config = match &cli.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let level = cli
        .log_level
        .or(config.log_level.clone())
        .unwrap_or_else(|| "info".into());
    crate::logging::init(
        &level,
        cli.log_file.as_deref().or(config.log_file.as_deref()),
    )?;
    let store_path = absolute(
        cli.store
            .or(config.store.clone())
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STORE)),
    )?;

    match cli.command {
        Command::InitStore => {
            Store::init(&store_path)?;
            println!("initialised store {}", store_path.display());
        }
        Command::Create {
            image,
            id,
            without_mount,
            strategy,
            ephemeral,
            platform,
        } => {
            let list = strategy
                .or(config.create.strategy.clone())
                .unwrap_or_else(|| "classic".into());
            let mut strategies = Strategies::parse(&list).map_err(|e| anyhow!(e))?;
            strategies.volatile |= ephemeral;
            let store = Store::open(&store_path)?;
            let platform = platform
                .as_deref()
                .map(Platform::parse)
                .transpose()?
                .unwrap_or_else(Platform::host);
            let image = lamina_image::resolve(&ImageRef::parse(&image)?, &platform)?;
            let options = CreateOptions {
                without_mount: without_mount || config.create.without_mount,
                strategies,
            };
            let created = lamina_mount::create(&store, &RealMounter::new(), &image, &id, &options)?;
            let mounts = options.without_mount.then(|| created.spec.option_strings());
            let spec = RuntimeSpec::new(
                created.record.env,
                created.rootfs.display().to_string(),
                mounts,
            );
            println!("{}", serde_json::to_string(&spec)?);
        }
        Command::Delete { id_or_path } => {
            let store = Store::open(&store_path)?;
            let id = container_id(&store, &id_or_path)?;
            match lamina_mount::delete(&store, &RealMounter::new(), &id)? {
                Deleted::Removed => println!("deleted container `{id}`"),
                Deleted::NotFound => println!(
                    "container `{id}` not found in store {}: nothing to delete",
                    store_path.display()
                ),
            }
        }
        Command::List => {
            let store = Store::open(&store_path)?;
            for record in store.containers()? {
                println!("{}", store.rootfs_path(&record.id).display());
            }
        }
        Command::Probe { refresh } => {
            let store = Store::open(&store_path)?;
            let probe = lamina_mount::probe::probe(&store, &RealMounter::new(), refresh)
                .with_context(|| format!("probing overlay support in {}", store_path.display()))?;
            println!("{}", serde_json::to_string(&probe)?);
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

/// An ID, or the ID of the rootfs path given (Garden passes either).
fn container_id(store: &Store, arg: &str) -> anyhow::Result<String> {
    if !arg.contains('/') {
        return Ok(arg.to_string());
    }
    let path = absolute(PathBuf::from(arg))?;
    store.id_from_path(&path).ok_or_else(|| {
        anyhow!(
            "{} is not a container rootfs in store {}",
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

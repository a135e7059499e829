//! `lamina create`: resolve the image, create the rootfs, print the runtime-spec JSON
//! Garden merges; after a pooled claim, start a background refill of that pool.

use anyhow::anyhow;
use lamina_mount::{CreateOptions, Strategies, ToMount};
use lamina_sys::Mounter;

use super::{Ctx, resolve_image};
use crate::CreateArgs;
use crate::output::{Mount, RuntimeSpec};

pub fn run(ctx: &Ctx, mounter: &dyn Mounter, args: CreateArgs) -> anyhow::Result<()> {
    let list = args
        .strategy
        .or(ctx.config.create.strategy.clone())
        .unwrap_or_else(|| "auto".into());
    let strategies = Strategies::parse(&list).map_err(|e| anyhow!(e))?;
    let store = ctx.open_store()?;
    let image = resolve_image(&args.image, args.platform.as_deref())?;
    let options = CreateOptions {
        without_mount: args.without_mount || ctx.config.create.without_mount,
        strategies,
        read_only: args.read_only,
        ephemeral: args.ephemeral,
        disk_limit: ctx
            .config
            .create
            .disk_limit(args.disk_limit_size_bytes, args.exclude_image_from_quota),
        disk_fs: ctx.config.create.disk_fs()?,
        extra_overlay_options: Vec::new(),
    };
    let created = lamina_mount::create(&store, mounter, &image, &args.id, &options)?;

    // A claim (of an overlay or of a bare isolated upper) leaves its pool one short.
    if created.claimed_from_pool {
        ctx.spawn(&store, &["pool", "refill"]);
    }

    let mounts = options.without_mount.then(|| {
        vec![match created.to_mount {
            ToMount::Overlay(spec) => Mount::overlay(spec.option_strings()),
            ToMount::Bind(source) => Mount::read_only_bind(source.display().to_string()),
        }]
    });
    let spec = RuntimeSpec::new(
        created.record.env,
        created.rootfs.display().to_string(),
        created.record.read_only,
        mounts,
    );
    println!("{}", serde_json::to_string(&spec)?);
    Ok(())
}

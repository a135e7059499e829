//! `lamina create`: resolve the image, create the rootfs, print the runtime-spec JSON
//! Garden merges; then start, in the background, the follow-ups the create returned.

use anyhow::anyhow;
use lamina_mount::{CreateOptions, FollowUp, Strategies, ToMount};
use lamina_sys::Mounter;

use super::Ctx;
use crate::CreateArgs;
use crate::output::{Mount, RuntimeSpec};

pub fn run(ctx: &Ctx, mounter: &dyn Mounter, args: CreateArgs) -> anyhow::Result<()> {
    let list = args
        .strategy
        .or(ctx.config.create.strategy.clone())
        .unwrap_or_else(|| "auto".into());
    let strategies = Strategies::parse(&list).map_err(|e| anyhow!(e))?;
    let store = ctx.open_store()?;
    let image = ctx.resolve_image(&store, &args.image, args.platform.as_deref())?;
    let options = CreateOptions {
        without_mount: args.without_mount || (ctx.config.create.without_mount && !args.with_mount),
        strategies,
        read_only: args.read_only,
        ephemeral: args.ephemeral,
        disk_limit: ctx.config.create.disk_limit(
            crate::usage::bytes(args.disk_limit_size_bytes),
            args.exclude_image_from_quota,
        ),
        disk_fs: ctx.config.create.disk_fs()?,
        extra_overlay_options: Vec::new(),
        // Garden's --without-mount caller mounts everything itself.
        claim_pooled_without_mount: false,
        mount_volatile_without_mount: false,
        // A uid-mapped container is a uid-mapped store's (`init-store --uid-mapping`).
        idmap: None,
        remake: false,
        lazy_server: Some(super::lazy_server::starter(ctx)),
    };
    let created = lamina_mount::create(&store, mounter, &image, &args.id, &options)
        .map_err(|e| quota_text(e, &image))?;

    for follow_up in &created.follow_ups {
        match follow_up {
            FollowUp::RefillPools => ctx.spawn(&store, &["pool", "refill"]),
            // A child process is handed only a chain it can check by diff IDs; the
            // daemon builds containerd's committed chains itself.
            FollowUp::BuildMetadataImage {
                chain_ids,
                imported: true,
            } => {
                let chain: Vec<String> = chain_ids.iter().map(ToString::to_string).collect();
                let mut build = vec!["build-metadata-image"];
                build.extend(chain.iter().map(String::as_str));
                ctx.spawn(&store, &build);
            }
            FollowUp::BuildMetadataImage {
                imported: false, ..
            } => {}
        }
    }
    // GrootFS's --with-clean, after the create rather than before it: the caller gets
    // its rootfs without waiting, and the new container's layers are already in use.
    let with_clean = args.with_clean || (ctx.config.create.with_clean && !args.without_clean);
    if with_clean {
        let threshold = crate::usage::bytes(args.threshold_bytes)
            .or(ctx.config.clean.threshold_bytes)
            .unwrap_or(0)
            .to_string();
        let log = super::background::Log {
            file: args.clean_log_file.as_deref().or(ctx.log_file.as_deref()),
            ..ctx.background_log()
        };
        super::background::spawn(&store, log, &["clean", "--threshold-bytes", &threshold]);
    }

    let mounts = options.without_mount.then(|| {
        vec![match created.to_mount {
            ToMount::Overlay(spec) => Mount::overlay(spec.option_strings()),
            ToMount::Bind(source) => Mount::read_only_bind(source.display().to_string()),
        }]
    });
    let read_only = created.container.model().read_only();
    let spec = RuntimeSpec::new(
        created.container.record.env,
        created.rootfs.display().to_string(),
        read_only,
        mounts,
    );
    println!("{}", crate::output::json_line(&spec)?);
    Ok(())
}

/// GrootFS words a limit the image fills in two ways (create_oci_test.go): `layers exceed
/// disk quota` when the layers as stored already exceed it, `uncompressed layer size
/// exceeds quota` when only their unpacked size does. lamina checks the unpacked size
/// alone, and takes GrootFS's wording from the stored sizes the image declares.
fn quota_text(error: lamina_mount::RootfsError, image: &lamina_image::Image) -> anyhow::Error {
    let lamina_mount::RootfsError::DiskLimitTooSmall {
        limit,
        image: unpacked,
    } = error
    else {
        return error.into();
    };
    // Only where every layer declares its stored size (a plain rootfs tar declares none).
    let stored: Option<u64> = image.layers.iter().map(|l| l.size).sum();
    let Some(stored) = stored.filter(|stored| *stored <= limit) else {
        return error.into();
    };
    anyhow!(
        "uncompressed layer size exceeds quota: disk limit of {limit} bytes leaves no room to write: the image unpacks to {unpacked} bytes, {stored} as stored (raise the limit, or pass --exclude-image-from-quota)"
    )
}

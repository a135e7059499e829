//! `lamina pool fill|refill|drain`: keep pre-mounted overlays (and bare isolated upper
//! filesystems) ready for `create` to claim.

use anyhow::anyhow;
use lamina_mount::Strategies;
use lamina_mount::pool::FillRequest;
use lamina_sys::Mounter;

use super::Ctx;
use crate::PoolCommand;

pub fn run(ctx: &Ctx, mounter: &dyn Mounter, command: PoolCommand) -> anyhow::Result<()> {
    let store = ctx.open_store()?;
    match command {
        PoolCommand::Fill {
            image,
            size,
            strategy,
            ephemeral,
            platform,
            disk_limit_size_bytes,
            exclude_image_from_quota,
        } => {
            let list = strategy.unwrap_or_else(|| "auto".into());
            let strategies = Strategies::parse(&list).map_err(|e| anyhow!(e))?;
            let resolved = image
                .map(|image| ctx.resolve_image(&store, &image, platform.as_deref()))
                .transpose()?;
            let request = FillRequest {
                image: resolved.as_ref(),
                strategies,
                ephemeral,
                disk_limit: ctx
                    .config
                    .create
                    .disk_limit(disk_limit_size_bytes, exclude_image_from_quota),
                disk_fs: ctx.config.create.disk_fs()?,
                size: size.or(ctx.config.pool.size),
            };
            let filled = lamina_mount::pool::fill_for(&store, mounter, &request)?;
            println!("{}", crate::output::json_line(&filled)?);
        }
        PoolCommand::Refill => {
            let added = lamina_mount::pool::refill_all(&store, mounter)?;
            println!(
                "{}",
                crate::output::json_line(&serde_json::json!({ "added": added }))?
            );
        }
        PoolCommand::Drain => {
            let released = lamina_mount::pool::drain(&store, mounter)?;
            println!(
                "{}",
                crate::output::json_line(&serde_json::json!({ "released": released }))?
            );
        }
    }
    Ok(())
}

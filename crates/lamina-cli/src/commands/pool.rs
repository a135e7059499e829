//! `lamina pool fill|refill|drain`: keep pre-mounted overlays (and bare isolated upper
//! filesystems) ready for `create` to claim.

use anyhow::{Context, anyhow};
use lamina_mount::pool::PoolKind;
use lamina_mount::{Pools, Request, Strategies};
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
            let requested = Strategies::parse(&list).map_err(|e| anyhow!(e))?;
            if let Some(kind) = requested.read_only_kind() {
                return Err(anyhow!(
                    "pools hold read-write overlays; strategy `{kind}` is read-only"
                ));
            }
            let limit = ctx
                .config
                .create
                .disk_limit(disk_limit_size_bytes, exclude_image_from_quota);
            let disk_fs = ctx.config.create.disk_fs()?;
            let size = size.or(ctx.config.pool.size);
            // From import until the slots are mounted, `clean` must not take the layers.
            let _layers_in_use = store.use_layers()?;
            let kind = match image {
                Some(image) => {
                    let resolved = ctx.resolve_image(&image, platform.as_deref())?;
                    let probe = lamina_mount::probe::probe(&store, mounter, false)
                        .context("probing overlay support")?;
                    // The flavor create would mount for this request, so its claims find these.
                    let request = Request {
                        strategies: requested,
                        read_only: false,
                        ephemeral,
                        disk_limit: limit.is_some(),
                        idmapped_layers: store.properties().idmaps_layers(),
                    };
                    let choice = lamina_mount::choose(
                        &request,
                        &probe,
                        resolved.layers.len(),
                        &Pools::EMPTY,
                    )?;
                    let flavor = choice.strategies.mount_flavor();
                    let chain_ids = store.import(&resolved)?;
                    let upper = flavor
                        .isolated
                        .map(|backend| {
                            lamina_mount::isolated::plan_for(
                                &store, &chain_ids, backend, limit, disk_fs,
                            )
                        })
                        .transpose()?;
                    PoolKind::overlays(&chain_ids, flavor, upper)
                }
                None => {
                    let backend = requested.isolated.ok_or_else(|| {
                        anyhow!(
                            "pool fill without an IMAGE makes bare upper filesystems: pass --strategy isolated or isolated-memory"
                        )
                    })?;
                    // No image, no layers to count: the upper is the limit as given.
                    PoolKind::uppers(lamina_mount::isolated::plan_for(
                        &store,
                        &[],
                        backend,
                        limit,
                        disk_fs,
                    )?)
                }
            };
            let filled = lamina_mount::pool::fill(&store, mounter, &kind, size)?;
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

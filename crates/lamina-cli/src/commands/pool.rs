//! `lamina pool fill|drain`: keep pre-mounted overlays ready for `create` to claim.

use anyhow::{Context, anyhow};
use lamina_mount::{Request, Strategies};
use lamina_sys::Mounter;

use super::{Ctx, resolve_image};
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
        } => {
            let list = strategy.unwrap_or_else(|| "auto".into());
            let requested = Strategies::parse(&list).map_err(|e| anyhow!(e))?;
            if let Some(kind) = requested.read_only_kind() {
                return Err(anyhow!(
                    "pools hold read-write overlays; strategy `{kind}` is read-only"
                ));
            }
            let resolved = resolve_image(&image, platform.as_deref())?;
            let probe = lamina_mount::probe::probe(&store, mounter, false)
                .context("probing overlay support")?;
            // The flavor create would mount for this request, so its claims find these.
            let request = Request {
                strategies: requested,
                read_only: false,
                ephemeral,
            };
            let flavor = lamina_mount::choose(&request, &probe, resolved.layers.len(), &|_| false)?
                .strategies
                .mount_flavor();
            let chain_ids = store.import(&resolved)?;
            let size = size.or(ctx.config.pool.size);
            let filled = lamina_mount::pool::fill(&store, mounter, &chain_ids, flavor, size)?;
            println!("{}", serde_json::to_string(&filled)?);
        }
        PoolCommand::Refill => {
            let added = lamina_mount::pool::refill_all(&store, mounter)?;
            println!("{}", serde_json::json!({ "added": added }));
        }
        PoolCommand::Drain => {
            let released = lamina_mount::pool::drain(&store, mounter)?;
            println!("{}", serde_json::json!({ "released": released }));
        }
    }
    Ok(())
}

//! Turning what a caller asked for into the strategies one create will use: checks an
//! explicit list against what the kernel supports (as probed), and resolves `auto` to
//! the fastest safe combination, with the reason, which `create` logs.

use crate::probe::Probe;
use crate::{RootfsError, Strategies};

/// What the caller asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Request {
    pub strategies: Strategies,
    /// The container's rootfs must be read-only (`--read-only`).
    pub read_only: bool,
    /// The container's writes need not survive a crash (`--ephemeral`).
    pub ephemeral: bool,
}

/// What one create will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Concrete strategies: never `auto`.
    pub strategies: Strategies,
    pub read_only: bool,
    /// Why, for the log line.
    pub reason: String,
}

/// Resolves `request`. `layers` is the image's layer count; `pool_ready` says whether
/// the image's pool holds an entry of the given mount flavor.
pub fn choose(
    request: &Request,
    probe: &Probe,
    layers: usize,
    pool_ready: &dyn Fn(Strategies) -> bool,
) -> Result<Choice, RootfsError> {
    if request.strategies.auto {
        return Ok(choose_auto(request, probe, layers, pool_ready));
    }
    let mut strategies = request.strategies;
    let read_only = request.read_only || strategies.read_only_kind().is_some();
    if request.ephemeral && strategies.read_only_kind().is_none() {
        strategies.volatile = true;
    }
    let unsupported = |strategy, why| Err(RootfsError::Unsupported { strategy, why });
    if strategies.metacopy && !probe.metacopy {
        return unsupported(
            "metacopy",
            "metadata-only copy-up did not happen in the probe",
        );
    }
    if strategies.volatile && !probe.volatile {
        return unsupported("volatile", "overlay refused the volatile option");
    }
    if let Some(kind) = strategies.read_only_kind()
        && !probe.new_mount_api
    {
        return unsupported(
            kind,
            "read-only binds need the new mount API (open_tree, mount_setattr)",
        );
    }
    Ok(Choice {
        strategies,
        read_only,
        reason: "requested".into(),
    })
}

fn choose_auto(
    request: &Request,
    probe: &Probe,
    layers: usize,
    pool_ready: &dyn Fn(Strategies) -> bool,
) -> Choice {
    let mut s = Strategies {
        deferred: true,
        ..Strategies::CLASSIC
    };
    let mut why = vec!["deferred delete always"];
    if request.read_only {
        if !probe.new_mount_api {
            why.push("read-only, but no new mount API for binds: a classic overlay");
        } else if layers == 1 {
            s.direct = true;
            why.push("read-only single-layer image: bind the layer, no overlay");
        } else {
            s.shared_ro = true;
            why.push("read-only multi-layer image: bind the image's shared read-only overlay");
        }
        return Choice {
            strategies: s,
            read_only: true,
            reason: why.join("; "),
        };
    }
    if probe.metacopy {
        s.metacopy = true;
        why.push("metacopy passed the probe");
    } else {
        why.push("metacopy failed the probe: full copy-up");
    }
    if request.ephemeral {
        if probe.volatile {
            s.volatile = true;
            why.push("ephemeral: volatile upper");
        } else {
            why.push("ephemeral, but overlay refused volatile");
        }
    }
    if pool_ready(s.mount_flavor()) {
        s.pooled = true;
        why.push("a pre-mounted overlay is ready in the pool");
    }
    Choice {
        strategies: s,
        read_only: false,
        reason: why.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(metacopy: bool) -> Probe {
        Probe {
            kernel: "6.18".into(),
            boot_id: "b".into(),
            new_mount_api: true,
            lowerdir_plus: true,
            metacopy,
            volatile: true,
            redirect_dir: true,
            idmapped_layers: true,
            max_lower_layers: 500,
        }
    }

    fn auto(read_only: bool, ephemeral: bool) -> Request {
        Request {
            strategies: Strategies::AUTO,
            read_only,
            ephemeral,
        }
    }

    fn chosen(request: Request, probe: &Probe, layers: usize, pool: bool) -> String {
        choose(&request, probe, layers, &|_| pool)
            .unwrap()
            .strategies
            .to_string()
    }

    #[test]
    fn auto_picks_the_fastest_safe_combination() {
        let good = probe(true);
        assert_eq!(chosen(auto(true, false), &good, 1, true), "direct,deferred");
        assert_eq!(
            chosen(auto(true, false), &good, 3, true),
            "shared-ro,deferred"
        );
        assert_eq!(
            chosen(auto(false, false), &good, 3, false),
            "metacopy,deferred"
        );
        assert_eq!(
            chosen(auto(false, true), &good, 3, true),
            "pooled,metacopy,volatile,deferred"
        );
        assert_eq!(
            chosen(auto(false, false), &probe(false), 3, false),
            "deferred"
        );
    }

    #[test]
    fn the_pool_is_asked_for_the_flavor_auto_would_mount() {
        let asked = std::cell::RefCell::new(Vec::new());
        choose(&auto(false, true), &probe(true), 2, &|f| {
            asked.borrow_mut().push(f.to_string());
            false
        })
        .unwrap();
        assert_eq!(asked.into_inner(), vec!["metacopy,volatile"]);
    }

    #[test]
    fn explicit_lists_are_checked_against_the_probe() {
        let request = Request {
            strategies: Strategies::parse("metacopy").unwrap(),
            ..Request::default()
        };
        let err = choose(&request, &probe(false), 2, &|_| false).unwrap_err();
        assert!(
            err.to_string()
                .contains("strategy metacopy is not available")
        );
        let ephemeral = Request {
            ephemeral: true,
            ..Request::default()
        };
        assert_eq!(chosen(ephemeral, &probe(false), 2, false), "volatile");
        let direct = Request {
            strategies: Strategies::parse("direct").unwrap(),
            ..Request::default()
        };
        assert!(
            choose(&direct, &probe(false), 2, &|_| false)
                .unwrap()
                .read_only,
            "a read-only strategy makes the rootfs read-only"
        );
    }
}

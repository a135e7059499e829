//! Mount strategies a caller can ask for. Each answers one documented overlay stall
//! (docs/strategies.md); they combine, and `classic` alone is GrootFS's behaviour.

use std::fmt;

/// The strategies `--strategy` accepts, as a set: `classic` is the empty set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Strategies {
    /// `metacopy=on`: chown/chmod/touch copy up metadata only (stall S3).
    pub metacopy: bool,
    /// `volatile`: no sync of the upper filesystem at unmount (stall S1); the container's
    /// writes do not survive a crash, which an ephemeral container never needs.
    pub volatile: bool,
}

/// Names issue-tracked strategies that are not built yet, so asking for one says so
/// instead of silently getting something else.
const PLANNED: &[&str] = &["shared-ro", "direct", "deferred", "pooled", "auto"];

impl Strategies {
    /// Parses a comma-separated list such as `metacopy,volatile`.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut set = Strategies::default();
        for name in list.split(',').map(str::trim) {
            match name {
                "classic" => {}
                "metacopy" => set.metacopy = true,
                "volatile" => set.volatile = true,
                planned if PLANNED.contains(&planned) => {
                    return Err(format!(
                        "strategy `{planned}` is not implemented yet (available: classic, metacopy, volatile)"
                    ));
                }
                other => {
                    return Err(format!(
                        "unknown strategy `{other}` (available: classic, metacopy, volatile)"
                    ));
                }
            }
        }
        Ok(set)
    }

    /// Overlay options this set adds to a read-write mount.
    pub fn overlay_options(&self) -> Vec<(String, Option<String>)> {
        let mut options = Vec::new();
        if self.metacopy {
            // metacopy needs redirect_dir; say so rather than rely on the kernel's implication.
            options.push(("redirect_dir".to_string(), Some("on".to_string())));
            options.push(("metacopy".to_string(), Some("on".to_string())));
        }
        if self.volatile {
            options.push(("volatile".to_string(), None));
        }
        options
    }
}

impl fmt::Display for Strategies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [(self.metacopy, "metacopy"), (self.volatile, "volatile")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
        if names.is_empty() {
            f.write_str("classic")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_combine_and_print_back() {
        assert_eq!(Strategies::parse("classic").unwrap(), Strategies::default());
        let both = Strategies::parse("volatile, metacopy").unwrap();
        assert_eq!(both.to_string(), "metacopy,volatile");
        assert_eq!(both.overlay_options().len(), 3);
        assert!(
            Strategies::parse("pooled")
                .unwrap_err()
                .contains("not implemented yet")
        );
        assert!(
            Strategies::parse("fast")
                .unwrap_err()
                .contains("unknown strategy `fast`")
        );
    }
}

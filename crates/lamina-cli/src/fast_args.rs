//! The command lines Garden runs once per container — `create` and `delete` with their
//! flags — read without clap. clap builds its whole command (every flag, with its help
//! text) before it parses one argument, and in a process that lives for one call that
//! was the largest single cost after the mount: about 0.2 ms of a 2 ms create, most of
//! it first touches of clap's code (docs/benchmarks.md, process per call).
//!
//! This reader is deliberately narrow: it accepts only lines whose meaning is plain —
//! known flags, each at most once (`--insecure-registry` may repeat), values that are
//! neither empty nor start with `-`, numbers as plain digits, exactly the positionals the
//! command takes — and answers `None` for anything else, which clap then parses and
//! words exactly as before (help, version, mistakes, negative numbers, `--`, short
//! flags, the password in the environment). Where it answers, it answers what clap
//! would: `tests::agrees_with_clap_on_generated_lines` checks that on thousands of lines.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::PathBuf;

use crate::usage::GrootfsGlobals;
use crate::{Cli, Command, CreateArgs, Globals};

/// The environment variables clap reads flags from (`--password`'s); when one is set the
/// line is clap's to read (its rules for an empty or non-UTF-8 value are its own).
/// `tests::every_flag_clap_reads_from_the_environment_is_deferred` keeps this list whole.
pub const DEFERRED_ENV: &[&str] = &[crate::PASSWORD_ENV];

/// `args` is the whole command line, program name first.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Option<Cli> {
    parse_with(args, |name| std::env::var_os(name).is_some())
}

/// [`parse`], with `is_set` saying whether an environment variable is set.
fn parse_with(
    args: impl IntoIterator<Item = OsString>,
    is_set: impl Fn(&str) -> bool,
) -> Option<Cli> {
    if DEFERRED_ENV.iter().any(|name| is_set(name)) {
        return None;
    }
    let args: Vec<String> = args
        .into_iter()
        .skip(1)
        .map(|a| a.into_string().ok())
        .collect::<Option<_>>()?;
    let mut line = Line::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (long, None),
            };
            if !line.first_use(name) {
                return None;
            }
            if line.set_switch(name)? {
                if inline.is_some() {
                    return None;
                }
                continue;
            }
            let value = match inline {
                Some(value) => value,
                None => rest.next()?,
            };
            if value.is_empty() || value.starts_with('-') {
                return None;
            }
            line.set_value(name, value)?;
        } else if arg.is_empty() || arg.starts_with('-') {
            return None;
        } else if line.command.is_none() {
            line.command = Some(match arg.as_str() {
                "create" => Hot::Create,
                "delete" => Hot::Delete,
                _ => return None,
            });
        } else {
            line.positionals.push(arg.clone());
        }
    }
    line.finish()
}

#[derive(Clone, Copy, PartialEq)]
enum Hot {
    Create,
    Delete,
}

/// What has been read so far.
#[derive(Default)]
struct Line {
    command: Option<Hot>,
    positionals: Vec<String>,
    seen: HashSet<String>,
    /// Whether `--insecure-registry` came after the command's name, once it has come.
    registries_after_command: Option<bool>,
    globals: Globals,
    grootfs: GrootfsGlobals,
    /// `create`'s flags; its positionals, in [`Line::positionals`], are set last.
    create: CreateArgs,
}

impl Line {
    /// Whether this use of flag `name` is one clap reads plainly: its first, or one more
    /// `--insecure-registry` on the same side of the command's name (clap keeps the
    /// values given before and after the name apart, and the later side wins).
    fn first_use(&mut self, name: &str) -> bool {
        if name == "insecure-registry" {
            let after = self.command.is_some();
            return *self.registries_after_command.get_or_insert(after) == after;
        }
        self.seen.insert(name.to_string())
    }

    /// Sets the switch `name` (a flag without a value): `Some(true)` if it is one,
    /// `Some(false)` if `name` is not a switch, `None` if it is one this line cannot take.
    fn set_switch(&mut self, name: &str) -> Option<bool> {
        let flags = &mut self.create;
        let switch = match name {
            "without-mount" => &mut flags.without_mount,
            "with-mount" => &mut flags.with_mount,
            "exclude-image-from-quota" => &mut flags.exclude_image_from_quota,
            "read-only" => &mut flags.read_only,
            "ephemeral" => &mut flags.ephemeral,
            "with-clean" => &mut flags.with_clean,
            "without-clean" => &mut flags.without_clean,
            "skip-layer-validation" => &mut flags.skip_layer_validation,
            _ => return Some(false),
        };
        // `create`'s own flags come after its name, as clap reads them.
        if self.command != Some(Hot::Create) {
            return None;
        }
        *switch = true;
        Some(true)
    }

    /// Sets the flag `name` to `value`; `None` for a flag this reader does not know, in
    /// a place it cannot be, or a value clap would read otherwise.
    fn set_value(&mut self, name: &str, value: &str) -> Option<()> {
        let text = || Some(value.to_string());
        let path = || Some(PathBuf::from(value));
        let g = &mut self.globals;
        let gg = &mut self.grootfs;
        match name {
            "store" => g.store = path(),
            "config" => g.config = path(),
            "log-level" => g.log_level = text(),
            "log-file" => g.log_file = path(),
            "log-format" => g.log_format = text(),
            "max-layer-bytes" => g.max_layer_bytes = Some(digits(value)?),
            "username" => g.username = text(),
            "password" => g.password = text(),
            "insecure-registry" => g.insecure_registries.push(value.to_string()),
            "registry-certs-dir" => g.registry_certs_dir = path(),
            "registry-auth-file" => g.registry_auth_file = path(),
            "registry-timeout-seconds" => {
                g.registry_timeout_seconds = Some(digits(value).filter(|&s| s >= 1)?)
            }
            "lock-timeout-seconds" => g.lock_timeout_seconds = Some(digits(value)?),
            "tardis-bin" => gg.tardis_bin = text(),
            "newuidmap-bin" => gg.newuidmap_bin = text(),
            "newgidmap-bin" => gg.newgidmap_bin = text(),
            "metron-endpoint" => gg.metron_endpoint = text(),
            "driver" => gg.driver = text(),
            _ => return self.set_create_value(name, value),
        }
        Some(())
    }

    fn set_create_value(&mut self, name: &str, value: &str) -> Option<()> {
        if self.command != Some(Hot::Create) {
            return None;
        }
        let signed = || i64::try_from(digits(value)?).ok();
        let flags = &mut self.create;
        match name {
            "strategy" => flags.strategy = Some(value.to_string()),
            "disk-limit-size-bytes" => flags.disk_limit_size_bytes = Some(signed()?),
            "platform" => flags.platform = Some(value.to_string()),
            "threshold-bytes" => flags.threshold_bytes = Some(signed()?),
            "clean-log-file" => flags.clean_log_file = Some(PathBuf::from(value)),
            _ => return None,
        }
        Some(())
    }

    fn finish(self) -> Option<Cli> {
        let command = match (self.command?, self.positionals.as_slice()) {
            (Hot::Create, [image, id]) => Command::Create(CreateArgs {
                image: image.clone(),
                id: id.clone(),
                ..self.create
            }),
            (Hot::Delete, [id_or_path]) => Command::Delete {
                id_or_path: id_or_path.clone(),
            },
            _ => return None,
        };
        Some(Cli {
            globals: self.globals,
            grootfs: self.grootfs,
            command,
        })
    }
}

/// A number written as plain decimal digits (what every caller writes); anything else
/// (a sign, spaces, too many digits) is clap's to read and to refuse.
fn digits(value: &str) -> Option<u64> {
    if value.bytes().all(|b| b.is_ascii_digit()) {
        value.parse().ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::usage::tests::argv;

    /// This reader with no environment variable set, as clap is in [`assert_agrees`].
    fn fast(line: &[&str]) -> Option<Cli> {
        parse_with(argv(line), |_| false)
    }

    /// Where this reader answers, clap answers the same; where clap refuses, this
    /// reader does not answer.
    fn assert_agrees(line: &[&str]) {
        let fast = fast(line);
        // Parsed as if no environment variable clap reads were set: this test must not
        // depend on the shell it runs in.
        let clap = Cli::command()
            .mut_arg("password", |a| a.env(None::<&str>))
            .try_get_matches_from(argv(line))
            .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
        match (fast, clap) {
            (Some(fast), Ok(clap)) => {
                assert_eq!(format!("{fast:?}"), format!("{clap:?}"), "{line:?}")
            }
            (Some(fast), Err(e)) => panic!("{line:?}: read as {fast:?}, clap refuses: {e}"),
            (None, _) => {}
        }
    }

    #[test]
    fn reads_the_lines_garden_and_operators_write() {
        for line in crate::usage::tests::LINES {
            assert_agrees(line);
            let expected = !line.iter().any(|a| *a == "-1" || a.is_empty());
            assert_eq!(fast(line).is_some(), expected, "{line:?}");
        }
    }

    #[test]
    fn leaves_to_clap_what_it_does_not_read_plainly() {
        for line in [
            &["list"][..],
            &["--help"],
            &["--version"],
            &["-V"],
            &["create", "--help"],
            &["create", "-h", "i", "c"],
            &["create", "only-image"],
            &["create", "i", "c", "extra"],
            &["delete"],
            &["delete", "a", "b"],
            &["create", "--no-such-flag", "i", "c"],
            &["--read-only", "create", "i", "c"],
            &["delete", "--read-only", "c"],
            &["delete", "--strategy", "auto", "c"],
            &["create", "--read-only=true", "i", "c"],
            &["create", "--read-only", "--read-only", "i", "c"],
            &["--store", "/a", "--store", "/b", "delete", "c"],
            &["--store", "-x", "delete", "c"],
            &["--store=", "delete", "c"],
            &["--store"],
            &["create", "--disk-limit-size-bytes", "+5", "i", "c"],
            &[
                "create",
                "--disk-limit-size-bytes",
                "99999999999999999999",
                "i",
                "c",
            ],
            &["--registry-timeout-seconds", "0", "delete", "c"],
            &[
                "create",
                "--disk-limit-size-bytes",
                "9223372036854775808",
                "i",
                "c",
            ],
            &[
                "create",
                "--threshold-bytes",
                "18446744073709551615",
                "i",
                "c",
            ],
            &["--max-layer-bytes", "18446744073709551616", "delete", "c"],
            &["create", "--", "i", "c"],
            &["create", "i", "-"],
            &["pool", "fill", "i"],
        ] {
            assert!(fast(line).is_none(), "{line:?}");
        }
    }

    #[test]
    fn agrees_with_clap_on_generated_lines() {
        // Tokens that make every kind of line: commands, flags of each kind in and out
        // of place, values, numbers clap reads or refuses, and stray words.
        const TOKENS: &[&str] = &[
            "create",
            "delete",
            "list",
            "i",
            "c",
            "/p",
            "create",
            "--store",
            "--store=/s",
            "--config",
            "--log-level",
            "--log-file",
            "--log-format",
            "--max-layer-bytes",
            "--username",
            "--password",
            "--insecure-registry",
            "--insecure-registry=r:1",
            "--registry-certs-dir",
            "--registry-auth-file",
            "--registry-timeout-seconds",
            "--lock-timeout-seconds",
            "--driver",
            "--tardis-bin",
            "--metron-endpoint=h:1",
            "--without-mount",
            "--with-mount",
            "--strategy",
            "--strategy=classic",
            "--disk-limit-size-bytes",
            "--exclude-image-from-quota",
            "--read-only",
            "--ephemeral",
            "--platform",
            "--with-clean",
            "--without-clean",
            "--threshold-bytes",
            "--clean-log-file",
            "--skip-layer-validation",
            "--unknown",
            "0",
            "1",
            "007",
            "-1",
            "+1",
            "18446744073709551616",
            "18446744073709551615",
            "9223372036854775808",
            "9223372036854775807",
            "",
            "--",
            "-h",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |bound: usize| {
            // xorshift: the same lines on every run.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % bound as u64).expect("small")
        };
        // Well-formed pieces, so that many lines are ones this reader answers.
        const GLOBALS: &[&[&str]] = &[
            &["--store", "/s"],
            &["--store=/t"],
            &["--log-level", "debug"],
            &["--insecure-registry", "r:1"],
            &["--insecure-registry=r:2"],
            &["--lock-timeout-seconds", "0"],
            &["--registry-timeout-seconds", "5"],
            &["--driver", "overlay-xfs"],
        ];
        const CREATE_FLAGS: &[&[&str]] = &[
            &["--read-only"],
            &["--with-clean"],
            &["--without-clean"],
            &["--disk-limit-size-bytes", "10"],
            &["--threshold-bytes=0"],
            &["--strategy", "auto"],
            &["--clean-log-file", "/l"],
            &["--threshold-bytes", "9223372036854775808"],
        ];
        let mut answered = 0;
        for _ in 0..4_000 {
            // Shaped as real lines are (flags, a command, flags, positionals); one
            // token in two lines is then replaced by any token, in or out of place.
            let mut line: Vec<&str> = Vec::new();
            for _ in 0..next(3) {
                line.extend(GLOBALS[next(GLOBALS.len())]);
            }
            line.push(["create", "delete", "list"][next(3)]);
            for _ in 0..next(4) {
                let pieces = if next(2) == 0 { GLOBALS } else { CREATE_FLAGS };
                line.extend(pieces[next(pieces.len())]);
            }
            for _ in 0..next(4) {
                line.push(["i", "c", "/p", "create", "0"][next(5)]);
            }
            if next(2) == 0 {
                let at = next(line.len());
                line[at] = TOKENS[next(TOKENS.len())];
            }
            if fast(&line).is_some() {
                answered += 1;
            }
            assert_agrees(&line);
        }
        // The generator must reach lines this reader answers, or it proves nothing.
        assert!(answered > 200, "only {answered} lines read");
    }

    /// A line is clap's whenever a variable it reads a flag from is set: read here, the
    /// variable's value would be lost (an operator's `LAMINA_REGISTRY_PASSWORD`).
    #[test]
    fn defers_to_clap_when_a_variable_it_reads_is_set() {
        let line = ["--username", "u", "create", "i", "c"];
        assert!(parse_with(argv(&line), |_| false).is_some());
        for name in DEFERRED_ENV {
            assert!(parse_with(argv(&line), |n| n == *name).is_none(), "{name}");
        }
    }

    /// Every flag clap can take from the environment — of the whole command line, and of
    /// `create` and `delete` — is one whose variable makes this reader defer.
    #[test]
    fn every_flag_clap_reads_from_the_environment_is_deferred() {
        let cli = Cli::command();
        let commands = std::iter::once(&cli).chain(
            cli.get_subcommands()
                .filter(|c| matches!(c.get_name(), "create" | "delete")),
        );
        for command in commands {
            for arg in command.get_arguments() {
                if let Some(name) = arg.get_env() {
                    let name = name.to_str().expect("utf-8 variable name");
                    assert!(
                        DEFERRED_ENV.contains(&name),
                        "--{} reads {name}, which fast_args does not defer on",
                        arg.get_id()
                    );
                }
            }
        }
    }
}

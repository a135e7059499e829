//! Usage errors as GrootFS reports them: Garden and operators' scripts read one line on
//! stdout and exit status 1, whatever was wrong with the command line. clap's own report
//! (several lines on stderr, exit 2) is kept only for `--help` and `--version`, which
//! succeed. The texts are GrootFS's (its `integration/*_test.go` specs grep for them).

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser};

use crate::{Cli, Command, CreateArgs, Globals};

/// Flags GrootFS accepts that mean nothing to lamina. They are parsed, so a Garden or a
/// BOSH job written for GrootFS runs lamina unchanged, and otherwise ignored.
#[derive(Debug, Default, clap::Args)]
pub struct GrootfsGlobals {
    /// Ignored (GrootFS's setuid helper for XFS quotas; lamina needs none)
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) tardis_bin: Option<String>,
    /// Ignored (GrootFS maps ids for rootless stores with it; lamina runs as root)
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) newuidmap_bin: Option<String>,
    /// Ignored (as --newuidmap-bin, for groups)
    #[arg(long, global = true, value_name = "PATH")]
    pub(crate) newgidmap_bin: Option<String>,
    /// Ignored (GrootFS's metrics go to metron; lamina logs its measurements)
    #[arg(long, global = true, value_name = "HOST:PORT")]
    pub(crate) metron_endpoint: Option<String>,
    /// Ignored (GrootFS's filesystem driver; lamina always uses overlay)
    #[arg(long, global = true, value_name = "NAME")]
    pub(crate) driver: Option<String>,
}

/// The parsed command line, or the exit code after printing why there is none.
pub fn parse() -> Result<Cli, ExitCode> {
    let parsed = match crate::fast_args::parse(std::env::args_os()) {
        Some(cli) => Ok(cli),
        None => match HotCli::try_parse() {
            Ok(hot) => Ok(hot.into()),
            // Anything else, `--help` and every mistake included, is the whole CLI's to
            // parse and to word.
            Err(_) => Cli::try_parse(),
        },
    };
    match parsed {
        Ok(cli) => match check(&cli.command) {
            Ok(()) => Ok(cli),
            Err(line) => Err(report(&line)),
        },
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            // `--help` and `--version` are answers, not errors.
            let _ = e.print();
            Err(ExitCode::SUCCESS)
        }
        Err(e) => Err(report(&line_for(&e, subcommand().as_deref()))),
    }
}

/// The command line of the two commands Garden runs once per container, `create` and
/// `delete`: the same flag definitions as [`Cli`] (its [`Globals`], [`GrootfsGlobals`]
/// and [`CreateArgs`]) under a command that has no other subcommands. clap builds every
/// subcommand and copies each global flag into it before parsing; for the whole CLI
/// that was about a fifth of a create called as a process (docs/benchmarks.md,
/// process per call). A line this does not parse goes to [`Cli`], so help texts and
/// errors are the whole CLI's.
#[derive(Debug, Parser)]
#[command(name = "lamina")]
struct HotCli {
    #[command(flatten)]
    globals: Globals,
    #[command(flatten)]
    grootfs: GrootfsGlobals,
    #[command(subcommand)]
    command: HotCommand,
}

#[derive(Debug, clap::Subcommand)]
enum HotCommand {
    Create(CreateArgs),
    Delete { id_or_path: String },
}

impl From<HotCli> for Cli {
    fn from(hot: HotCli) -> Self {
        Cli {
            globals: hot.globals,
            grootfs: hot.grootfs,
            command: match hot.command {
                HotCommand::Create(args) => Command::Create(args),
                HotCommand::Delete { id_or_path } => Command::Delete { id_or_path },
            },
        }
    }
}

fn report(line: &str) -> ExitCode {
    println!("{}", crate::output::error_line(line));
    ExitCode::FAILURE
}

/// The one line for a clap error: GrootFS's wording where it has one, else clap's first
/// line without its `error: ` prefix.
fn line_for(e: &clap::Error, command: Option<&str>) -> String {
    let positional = matches!(
        e.get(ContextKind::InvalidArg),
        Some(ContextValue::String(arg)) if !arg.starts_with('-')
    );
    match (e.kind(), command) {
        // create_test.go, "when two arguments are not given": `invalid arguments`.
        (ErrorKind::MissingRequiredArgument, Some("create")) => CREATE_USAGE.into(),
        (ErrorKind::UnknownArgument, Some("create")) if positional => CREATE_USAGE.into(),
        // stats_test.go, "when the image id is not provided": `invalid arguments`.
        (ErrorKind::MissingRequiredArgument, Some("stats")) => STATS_USAGE.into(),
        // delete_test.go, "when the id is not provided": `id was not specified`.
        (ErrorKind::MissingRequiredArgument, Some("delete" | "mount" | "unmount")) => {
            "id was not specified".into()
        }
        (ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand, _) => {
            "invalid arguments: no command given (see `lamina --help`)".into()
        }
        _ => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            first.strip_prefix("error: ").unwrap_or(first).to_string()
        }
    }
}

/// The subcommand named on the command line, if any: the first argument that is one.
fn subcommand() -> Option<String> {
    let cli = Cli::command();
    let names: Vec<&str> = cli.get_subcommands().map(clap::Command::get_name).collect();
    std::env::args()
        .skip(1)
        .find(|a| names.contains(&a.as_str()))
}

/// What clap cannot say: GrootFS's checks on values (`commands/config/builder.go`'s
/// `Build` and create's `validateOptions`), run before anything touches the store.
fn check(command: &Command) -> Result<(), String> {
    match command {
        Command::Create(args) => {
            if args.disk_limit_size_bytes.is_some_and(|b| b < 0) {
                return Err("invalid argument: disk limit cannot be negative".into());
            }
            if args.threshold_bytes.is_some_and(|b| b < 0) {
                return Err(NEGATIVE_THRESHOLD.into());
            }
            if args.with_clean && args.without_clean {
                return Err("with-clean and without-clean cannot be used together".into());
            }
            Ok(())
        }
        Command::Clean { threshold_bytes } if threshold_bytes.is_some_and(|b| b < 0) => {
            Err(NEGATIVE_THRESHOLD.into())
        }
        Command::Delete { id_or_path } if id_or_path.is_empty() => {
            Err("id was not specified".into())
        }
        Command::Stats { id_or_path } if id_or_path.is_empty() => Err(STATS_USAGE.into()),
        _ => Ok(()),
    }
}

const CREATE_USAGE: &str = "invalid arguments - usage: create [options] <image> <id>";
const STATS_USAGE: &str = "invalid arguments - usage: stats [options] <id|image path>";
const NEGATIVE_THRESHOLD: &str = "invalid argument: clean threshold cannot be negative";

/// A byte count [`check`] has already refused if negative.
pub fn bytes(value: Option<i64>) -> Option<u64> {
    value.and_then(|v| u64::try_from(v).ok())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Command lines Garden, GrootFS's specs and operators use for create and delete.
    pub(crate) const LINES: &[&[&str]] = &[
        &["create", "oci:///img:latest", "c1"],
        &["--store", "/s", "create", "/rootfs.tar", "c1"],
        &[
            "create",
            "--store=/s",
            "--strategy",
            "auto",
            "oci:///i",
            "c1",
        ],
        &[
            "--config",
            "/etc/l.yml",
            "--log-level",
            "fatal",
            "--driver",
            "overlay-xfs",
            "--tardis-bin",
            "/t",
            "--newuidmap-bin",
            "/u",
            "--newgidmap-bin",
            "/g",
            "--metron-endpoint",
            "h:1",
            "create",
            "--disk-limit-size-bytes",
            "10485760",
            "--exclude-image-from-quota",
            "--without-mount",
            "--with-clean",
            "--threshold-bytes",
            "0",
            "--clean-log-file",
            "/l",
            "--skip-layer-validation",
            "--insecure-registry",
            "r:5000",
            "--username",
            "u",
            "--password",
            "p",
            "docker://r:5000/i:t",
            "c2",
        ],
        &[
            "create",
            "--read-only",
            "--ephemeral",
            "--platform",
            "linux/amd64",
            "i",
            "c",
        ],
        &[
            "create",
            "--with-mount",
            "--without-clean",
            "--disk-limit-size-bytes",
            "-1",
            "i",
            "c",
        ],
        &[
            "--max-layer-bytes",
            "9",
            "--registry-timeout-seconds",
            "3",
            "create",
            "i",
            "c",
        ],
        &[
            "--lock-timeout-seconds",
            "1",
            "--log-file",
            "/f",
            "delete",
            "c1",
        ],
        &["delete", "/s/images/c1/rootfs"],
        &["delete", "--store", "/s", "c1"],
        &["delete", ""],
    ];

    /// `line` as a process's arguments, program name first.
    pub(crate) fn argv(line: &[&str]) -> Vec<std::ffi::OsString> {
        std::iter::once("lamina")
            .chain(line.iter().copied())
            .map(std::ffi::OsString::from)
            .collect()
    }

    #[test]
    fn the_hot_path_parses_create_and_delete_as_the_whole_cli_does() {
        for line in LINES {
            let hot =
                HotCli::try_parse_from(argv(line)).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            let whole = Cli::try_parse_from(argv(line)).unwrap();
            assert_eq!(
                format!("{:?}", Cli::from(hot)),
                format!("{whole:?}"),
                "{line:?}"
            );
        }
    }

    /// What the hot path refuses falls to the whole CLI: other commands, help, and the
    /// mistakes whose GrootFS wording `line_for` gives.
    #[test]
    fn the_hot_path_refuses_what_only_the_whole_cli_answers() {
        for line in [
            &["list"][..],
            &["--help"],
            &["--version"],
            &["create", "--help"],
            &["create", "only-image"],
            &["create", "i", "c", "extra"],
            &["delete"],
            &["create", "--no-such-flag", "i", "c"],
            &["pool", "fill", "i"],
        ] {
            assert!(HotCli::try_parse_from(argv(line)).is_err(), "{line:?}");
        }
    }
}

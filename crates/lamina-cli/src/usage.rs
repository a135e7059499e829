//! Usage errors as GrootFS reports them: Garden and operators' scripts read one line on
//! stdout and exit status 1, whatever was wrong with the command line. clap's own report
//! (several lines on stderr, exit 2) is kept only for `--help` and `--version`, which
//! succeed. The texts are GrootFS's (its `integration/*_test.go` specs grep for them).

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, Parser};

use crate::{Cli, Command};

/// Flags GrootFS accepts that mean nothing to lamina. They are parsed, so a Garden or a
/// BOSH job written for GrootFS runs lamina unchanged, and otherwise ignored.
#[derive(Debug, clap::Args)]
pub struct GrootfsGlobals {
    /// Ignored (GrootFS's setuid helper for XFS quotas; lamina needs none)
    #[arg(long, global = true, value_name = "PATH")]
    tardis_bin: Option<String>,
    /// Ignored (GrootFS maps ids for rootless stores with it; lamina runs as root)
    #[arg(long, global = true, value_name = "PATH")]
    newuidmap_bin: Option<String>,
    /// Ignored (as --newuidmap-bin, for groups)
    #[arg(long, global = true, value_name = "PATH")]
    newgidmap_bin: Option<String>,
    /// Ignored (GrootFS's metrics go to metron; lamina logs its measurements)
    #[arg(long, global = true, value_name = "HOST:PORT")]
    metron_endpoint: Option<String>,
    /// Ignored (GrootFS's filesystem driver; lamina always uses overlay)
    #[arg(long, global = true, value_name = "NAME")]
    driver: Option<String>,
}

/// The parsed command line, or the exit code after printing why there is none.
pub fn parse() -> Result<Cli, ExitCode> {
    match Cli::try_parse() {
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
        // delete_test.go, "when the id is not provided": `id was not specified`.
        (ErrorKind::MissingRequiredArgument, Some("delete" | "stats" | "mount" | "unmount")) => {
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
        Command::Delete { id_or_path } | Command::Stats { id_or_path } if id_or_path.is_empty() => {
            Err("id was not specified".into())
        }
        _ => Ok(()),
    }
}

const CREATE_USAGE: &str = "invalid arguments - usage: create [options] <image> <id>";
const NEGATIVE_THRESHOLD: &str = "invalid argument: clean threshold cannot be negative";

/// A byte count [`check`] has already refused if negative.
pub fn bytes(value: Option<i64>) -> Option<u64> {
    value.and_then(|v| u64::try_from(v).ok())
}

//! Runs lamina's benchmark scenarios (see `lamina_benches::scenarios`). Needs root.
//!
//! `cargo bench -p lamina-benches --bench scenarios` runs the full sizes (cargo passes
//! `--bench`); `cargo test` runs the same binary without it, a smoke pass at tiny sizes
//! that proves every scenario still executes. Options (after `--`):
//!   --only NAME[,NAME]   scenarios to run (default all: s1-teardown, s2-reclaim, ...)
//!   --fs ext4[,xfs]      store filesystems (default both)
//!   --smoke              tiny sizes even under `cargo bench`
//!   --json PATH          where the results go (default <workspace>/target/lamina-bench/<mode>.json)
//!   --docs PATH          rewrite the tables in this markdown file (docs/benchmarks.md)
//!   --criterion DIR      also tabulate criterion's create_delete results from DIR

use std::path::PathBuf;
use std::process::ExitCode;

use lamina_benches::report::Report;
use lamina_benches::scenarios::{ALL, Ctx, Mode, progress};
use lamina_benches::{criterion_table, host};
use lamina_integration::{FsKind, require_root};

#[derive(Debug)]
struct Args {
    mode: Mode,
    only: Option<Vec<String>>,
    filesystems: Vec<FsKind>,
    json: Option<PathBuf>,
    docs: Option<PathBuf>,
    criterion: Option<PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        mode: Mode::Smoke,
        only: None,
        filesystems: vec![FsKind::Ext4, FsKind::Xfs],
        json: None,
        docs: None,
        criterion: None,
    };
    let mut smoke = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--bench" => args.mode = Mode::Full,
            "--smoke" => smoke = true,
            "--only" => {
                let names: Vec<String> = value("--only")?.split(',').map(str::to_string).collect();
                if let Some(bad) = names.iter().find(|n| !ALL.iter().any(|(s, _)| s == n)) {
                    let known: Vec<_> = ALL.iter().map(|(s, _)| *s).collect();
                    return Err(format!("no scenario `{bad}` (known: {})", known.join(", ")));
                }
                args.only = Some(names);
            }
            "--fs" => {
                args.filesystems = value("--fs")?
                    .split(',')
                    .map(|f| match f {
                        "ext4" => Ok(FsKind::Ext4),
                        "xfs" => Ok(FsKind::Xfs),
                        other => Err(format!("--fs: `{other}` is not ext4 or xfs")),
                    })
                    .collect::<Result<_, _>>()?;
            }
            "--json" => args.json = Some(value("--json")?.into()),
            "--docs" => args.docs = Some(value("--docs")?.into()),
            "--criterion" => args.criterion = Some(value("--criterion")?.into()),
            // libtest flags cargo may pass when this runs as a smoke test.
            other if other.starts_with("--") || other.is_empty() => {}
            other => return Err(format!("unexpected argument `{other}`")),
        }
    }
    if smoke {
        args.mode = Mode::Smoke;
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("scenarios: {e}");
            return ExitCode::from(2);
        }
    };
    require_root();
    let ctx = Ctx {
        mode: args.mode,
        filesystems: args.filesystems.clone(),
    };
    progress(&format!("lamina benchmark scenarios, {:?} sizes", ctx.mode));
    let mut tables = Vec::new();
    let (mut passed, mut failed) = (0, 0);
    for (name, scenario) in ALL {
        if args
            .only
            .as_ref()
            .is_some_and(|o| !o.iter().any(|n| n == name))
        {
            continue;
        }
        progress(&format!("== {name}"));
        match std::panic::catch_unwind(|| scenario(&ctx)) {
            Ok(result) => {
                for table in &result {
                    println!("\n{}:\n{}", table.id, table.markdown());
                }
                tables.extend(result);
                passed += 1;
            }
            Err(_) => {
                progress(&format!("{name} FAILED"));
                failed += 1;
            }
        }
    }
    if let Some(dir) = &args.criterion {
        match criterion_table::create_delete(dir) {
            Ok(table) => tables.push(table),
            Err(e) => {
                progress(&format!("criterion results: {e}"));
                failed += 1;
            }
        }
    }
    let report = Report {
        command: std::env::var("LAMINA_BENCH_COMMAND")
            .unwrap_or_else(|_| "cargo bench -p lamina-benches --bench scenarios".into()),
        kernel: host::kernel_release(),
        machine: format!(
            "{}; stores on loop-backed filesystems with direct I/O",
            host::machine()
        ),
        tables,
    };
    let json = args.json.unwrap_or_else(|| {
        let mode = match args.mode {
            Mode::Full => "full",
            Mode::Smoke => "smoke",
        };
        // cargo runs benches from the package directory; results go beside criterion's.
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../target/lamina-bench/{mode}.json"))
    });
    if let Err(e) = report.save_json(&json) {
        progress(&format!("writing {}: {e}", json.display()));
        failed += 1;
    }
    if let Some(docs) = &args.docs {
        let updated = std::fs::read_to_string(docs).map(|doc| report.update_doc(&doc));
        match updated.and_then(|doc| std::fs::write(docs, doc)) {
            Ok(()) => progress(&format!("tables written to {}", docs.display())),
            Err(e) => {
                progress(&format!("updating {}: {e}", docs.display()));
                failed += 1;
            }
        }
    }
    // The line scripts/test totals, as libtest prints it: one check per scenario.
    println!(
        "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

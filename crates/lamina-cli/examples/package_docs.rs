//! Writes the man pages (`lamina.1`, one page per command) and shell completions (bash,
//! zsh, fish) from the CLI's own definition, so they cannot drift from it:
//! `cargo run --example package_docs -- OUT_DIR` (scripts/package runs it).

use std::path::PathBuf;

use clap::CommandFactory;
use clap_complete::Shell;

fn main() -> std::io::Result<()> {
    let Some(out) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: package_docs OUT_DIR");
        std::process::exit(2);
    };
    let man = out.join("man");
    let completions = out.join("completions");
    std::fs::create_dir_all(&man)?;
    std::fs::create_dir_all(&completions)?;
    let cli = lamina_cli::Cli::command();
    clap_mangen::generate_to(cli.clone(), &man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cli.clone(), "lamina", &completions)?;
    }
    Ok(())
}

//! Records what `lamina --version` says of the build: the commit it was built from (and
//! whether the tree had changes), read from git when this workspace is a checkout of its
//! own. Packagers building from a tarball may pass `LAMINA_COMMIT` instead.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    // No optional locks: `status` would otherwise refresh the index, which this script
    // watches, and every build would run it again.
    let out = Command::new("git")
        .arg("--no-optional-locks")
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=LAMINA_COMMIT");
    // The workspace root: this crate is `crates/lamina-cli`.
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    let workspace = manifest.ancestors().nth(2).map(Path::to_path_buf);
    let own_checkout = git(&["rev-parse", "--show-toplevel"])
        .map(PathBuf::from)
        .and_then(|top| top.canonicalize().ok())
        .zip(workspace.and_then(|w| w.canonicalize().ok()))
        .is_some_and(|(top, workspace)| top == workspace);
    let commit = match std::env::var("LAMINA_COMMIT") {
        Ok(given) if !given.is_empty() => given,
        _ if own_checkout => from_git().unwrap_or_else(|| "unknown".into()),
        _ => "unknown".into(),
    };
    println!("cargo:rustc-env=LAMINA_COMMIT={commit}");
    println!(
        "cargo:rustc-env=LAMINA_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    println!(
        "cargo:rustc-env=LAMINA_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_default()
    );
}

/// The checkout's commit, `-dirty` if tracked files changed; and what to watch so a new
/// commit or checkout rebuilds the version string (only files that exist: cargo takes a
/// missing one for always changed).
fn from_git() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec!["HEAD".to_string(), "index".into(), "packed-refs".into()];
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(reference);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|changes| !changes.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

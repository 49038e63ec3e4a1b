//! Build facts for the `agentrt_build_info` series, read without a
//! network: the git revision of the source tree (`git rev-parse`, or the
//! `AGENTRT_GIT_REVISION` variable when building outside a checkout, as an
//! image build does) and the compiler's version (`$RUSTC --version`).
//! Either is left empty when it cannot be found.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=AGENTRT_GIT_REVISION");
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
    let revision = std::env::var("AGENTRT_GIT_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
        .or_else(|| manifest_dir.as_deref().and_then(git_revision))
        .unwrap_or_default();
    println!("cargo:rustc-env=AGENTRT_GIT_REVISION={}", revision.trim());
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let rustc_version = output(Command::new(rustc).arg("--version"))
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_default();
    println!("cargo:rustc-env=AGENTRT_RUSTC_VERSION={rustc_version}");
}

/// The checkout's `HEAD` revision (12 hex digits), watching the files that
/// change with it so a new commit rebuilds.
fn git_revision(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| output(Command::new("git").arg("-C").arg(dir).args(args));
    let revision = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(revision)
}

/// The command's trimmed stdout when it succeeds.
fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

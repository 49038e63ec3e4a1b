//! Python venvs the bench runs tools from: created with `python3 -m venv`
//! next to the bench executable and filled with `pip` from a checked-in
//! directory's pinned `requirements.txt` and `constraints.txt`, again only
//! when they are missing or were filled from other pins.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// The file in a venv recording which pins it was filled from.
const STAMP: &str = ".agentrt-bench-pins";

/// What a venv is for: where its pins are, the executable that shows it is
/// filled, and a name for progress lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pins {
    /// The checked-in directory holding `requirements.txt` and
    /// `constraints.txt`.
    pub(crate) dir: &'static str,
    /// An executable in the venv's `bin` once the requirements are in.
    pub(crate) marker: &'static str,
    /// The part it serves, for progress lines ("langgraph", "plots").
    pub(crate) part: &'static str,
}

/// Why a venv could not be had: a machine without what it needs (the part
/// is skipped with a note), or a real failure.
#[derive(Debug)]
pub(crate) enum Unavailable {
    Skip(String),
    Failed(String),
}

/// A filled venv.
#[derive(Debug, Clone)]
pub(crate) struct Venv {
    pub(crate) dir: PathBuf,
}

impl Venv {
    pub(crate) fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }
}

/// `name` in the target directory of this executable
/// (`target/release/agentrt-bench` → `target/NAME`).
pub(crate) fn beside_target(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(Path::parent)
        .map_or_else(|| PathBuf::from("target"), Path::to_path_buf)
        .join(name)
}

/// The pins a venv must match: requirements then constraints.
pub(crate) fn pins(pins: Pins) -> Result<String, String> {
    let read = |name: &str| {
        let path = Path::new(pins.dir).join(name);
        std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))
    };
    Ok(read("requirements.txt")? + &read("constraints.txt")?)
}

/// Runs `cmd` to its end, with nothing on stdin, for at most `limit`.
pub(crate) async fn output(
    cmd: &mut Command,
    limit: Duration,
) -> Result<std::process::Output, String> {
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    match tokio::time::timeout(limit, cmd.output()).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("took longer than {limit:?}")),
    }
}

/// The last lines of a process's output.
pub(crate) fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// The venv at `dir`, created with `python3 -m venv` and filled with `pip`
/// from `what`'s pins when it is missing or was filled from other pins.
/// Skips (rather than fails) when there is no `python3` 3.11+ or it cannot
/// make a venv.
pub(crate) async fn ensure(dir: &Path, what: Pins) -> Result<Venv, Unavailable> {
    let venv = Venv {
        dir: dir.to_path_buf(),
    };
    let pins = pins(what).map_err(Unavailable::Failed)?;
    let stamp = dir.join(STAMP);
    if venv.bin(what.marker).is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == pins) {
        return Ok(venv);
    }
    if !venv.bin("python").is_file() {
        let check = "import sys; print('%d.%d' % sys.version_info[:2]); \
                     sys.exit(0 if sys.version_info >= (3, 11) else 3)";
        let out = output(
            Command::new("python3").args(["-c", check]),
            Duration::from_secs(30),
        )
        .await
        .map_err(|e| Unavailable::Skip(format!("python3 is not available: {e}")))?;
        if !out.status.success() {
            let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            return Err(Unavailable::Skip(format!(
                "python3 is {version}; the {} part needs 3.11 or newer",
                what.part
            )));
        }
        eprintln!(
            "agentrt-bench: {}: creating the venv {}",
            what.part,
            dir.display()
        );
        let out = output(
            Command::new("python3").arg("-m").arg("venv").arg(dir),
            Duration::from_secs(120),
        )
        .await
        .map_err(|e| Unavailable::Skip(format!("python3 -m venv: {e}")))?;
        if !out.status.success() {
            return Err(Unavailable::Skip(format!(
                "python3 -m venv {} failed (on Debian: apt-get install python3-venv): {}",
                dir.display(),
                tail(&out.stderr)
            )));
        }
    }
    eprintln!(
        "agentrt-bench: {}: installing the pinned packages into {} (pip, once)",
        what.part,
        dir.display()
    );
    let from = Path::new(what.dir);
    let out = output(
        Command::new(venv.bin("python"))
            .args(["-m", "pip", "install", "--disable-pip-version-check", "-q"])
            .arg("-r")
            .arg(from.join("requirements.txt"))
            .arg("-c")
            .arg(from.join("constraints.txt")),
        Duration::from_secs(900),
    )
    .await
    .map_err(|e| Unavailable::Failed(format!("pip install: {e}")))?;
    if !out.status.success() {
        return Err(Unavailable::Failed(format!(
            "pip install into {} failed: {}",
            dir.display(),
            tail(&out.stderr)
        )));
    }
    std::fs::write(&stamp, pins)
        .map_err(|e| Unavailable::Failed(format!("write {}: {e}", stamp.display())))?;
    Ok(venv)
}

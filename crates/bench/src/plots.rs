//! `--plots DIR`: the run's scaling curves as PNG files, drawn from its
//! JSON by `crates/bench/plot/plot.py` (matplotlib, pinned, in a venv of
//! its own next to the bench executable).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

use crate::venv::{self, Pins, Unavailable, output, tail};

/// The checked-in directory with `plot.py` and its pins.
const PLOT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/plot");

const PINS: Pins = Pins {
    dir: PLOT_DIR,
    marker: "python",
    part: "plots",
};

/// `plot-venv` in the target directory of this executable.
pub(crate) fn default_venv() -> PathBuf {
    venv::beside_target("plot-venv")
}

/// Draws the figures of the run whose JSON is at `json` into `dir`;
/// returns the files written.
pub(crate) async fn draw(json: &Path, dir: &Path, venv_dir: &Path) -> Result<Vec<PathBuf>, String> {
    let venv = match venv::ensure(venv_dir, PINS).await {
        Ok(v) => v,
        Err(Unavailable::Skip(why) | Unavailable::Failed(why)) => {
            return Err(format!("plots: {why}"));
        }
    };
    let out = output(
        Command::new(venv.bin("python"))
            .arg(Path::new(PLOT_DIR).join("plot.py"))
            .arg(json)
            .arg(dir),
        Duration::from_secs(300),
    )
    .await
    .map_err(|e| format!("plots: plot.py: {e}"))?;
    let notes = String::from_utf8_lossy(&out.stderr);
    for line in notes.lines() {
        eprintln!("agentrt-bench: {line}");
    }
    if !out.status.success() {
        return Err(format!("plots: plot.py failed: {}", tail(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plot_venv_is_pinned_exactly_and_the_script_is_there() {
        let pins = venv::pins(PINS).expect("pins readable");
        assert!(pins.contains("matplotlib=="), "{pins}");
        for line in pins
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            assert!(line.contains("=="), "not an exact pin: {line}");
        }
        assert!(Path::new(PLOT_DIR).join("plot.py").is_file());
    }
}

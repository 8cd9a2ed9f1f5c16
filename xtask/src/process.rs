//! Running commands and watching processes, with errors that say which.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{bail, Context};

/// Runs `cmd` to completion with inherited output; fails unless it succeeds.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = show(cmd);
    eprintln!("$ {shown}");
    let status = cmd.status().with_context(|| format!("cannot start `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// The command as a shell line, for messages.
pub(crate) fn show(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Whether process `pid` exists and is not a zombie.
pub(crate) fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

/// The command line of process `pid`, arguments joined by spaces.
pub(crate) fn cmdline(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect::<Vec<_>>().join(" "))
}

/// Sends `signal` to the process group `pgid` (which our spawned broker leads).
pub(crate) fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill").arg(format!("-{signal}")).arg("--").arg(format!("-{pgid}")).status();
}

/// Stops the process group led by `pid`: TERM, then KILL after `grace`.
/// Returns once the leader is gone (or was not ours to wait for).
pub(crate) fn stop_group(pid: u32, grace: Duration) {
    signal_group(pid, "TERM");
    if wait_until(grace, || !is_alive(pid)) {
        return;
    }
    signal_group(pid, "KILL");
    wait_until(Duration::from_secs(5), || !is_alive(pid));
}

/// Polls `done` every 100 ms until it holds or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last `lines` lines of the file at `path`, for error messages.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

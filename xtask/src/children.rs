//! Children that run beside xtask in process groups of their own (the lanes
//! of `ci`, a build in the background): stopped, with what they started,
//! when xtask is interrupted or ends before them.

use std::{process::Command, sync::Mutex, time::Duration};

use anyhow::{bail, Context};

use crate::process::{show, stop_group};

/// Process groups this process started and must stop, by their leader's pid.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// How long a child told to stop may take to stop what it started.
const GRACE: Duration = Duration::from_secs(30);

/// Runs `cmd` to completion like [`crate::process::run`], in a process
/// group of its own that [`stop_children`] stops.
pub(crate) fn run_in_group(cmd: &mut Command) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt as _;
    let shown = show(cmd);
    eprintln!("$ {shown}");
    let mut child = cmd.process_group(0).spawn().with_context(|| format!("cannot start `{shown}`"))?;
    started(child.id());
    let status = child.wait();
    ended(child.id());
    let status = status.with_context(|| format!("cannot wait for `{shown}`"))?;
    if !status.success() {
        bail!("`{shown}` failed ({status})");
    }
    Ok(())
}

/// Notes that the process group led by `pid` is to be stopped if xtask is
/// interrupted or ends first.
pub(crate) fn started(pid: u32) {
    if let Ok(mut children) = CHILDREN.lock() {
        children.push(pid);
    }
}

/// Notes that the process group led by `pid` ended.
pub(crate) fn ended(pid: u32) {
    if let Ok(mut children) = CHILDREN.lock() {
        children.retain(|c| *c != pid);
    }
}

/// Stops every process group of [`started`] still running: TERM (a lane
/// then stops its brokers), KILL after a grace period.
pub(crate) fn stop_children() {
    let children = CHILDREN.lock().map(|c| c.clone()).unwrap_or_default();
    for pid in children {
        stop_group(pid, GRACE);
        ended(pid);
    }
}

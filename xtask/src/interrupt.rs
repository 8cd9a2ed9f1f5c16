//! Stopping what xtask started when it is interrupted (SIGINT, SIGTERM):
//! brokers, and the children that run beside it ([`crate::children`]), run
//! in process groups of their own, so a Ctrl-C or a `timeout` aimed at
//! xtask does not reach them, and xtask stops them itself.

use std::sync::Mutex;

use crate::broker::Broker;

/// Brokers this process started and must stop, by address.
static STARTED: Mutex<Vec<Broker>> = Mutex::new(Vec::new());

/// Stops the brokers of [`started`] on SIGINT or SIGTERM, then exits with
/// 128 + the signal's number, as a shell reports a death by signal.
pub(crate) fn install() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            crate::children::stop_children();
            let brokers = STARTED.lock().map(|b| b.clone()).unwrap_or_default();
            for broker in brokers {
                eprintln!("interrupted: stopping the broker at {}", broker.addr);
                if let Err(e) = broker.stop() {
                    eprintln!("cannot stop the broker at {}: {e:#}", broker.addr);
                }
            }
            std::process::exit(128 + signal);
        }
    });
    Ok(())
}

/// Notes that `broker` is to be stopped if xtask is interrupted.
pub(crate) fn started(broker: &Broker) {
    if let Ok(mut brokers) = STARTED.lock() {
        brokers.push(broker.clone());
    }
}

/// Notes that `broker` was stopped.
pub(crate) fn stopped(broker: &Broker) {
    if let Ok(mut brokers) = STARTED.lock() {
        brokers.retain(|b| b.addr != broker.addr);
    }
}

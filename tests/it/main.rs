//! Integration tests against a real broker: `cargo xtask integration`.
//! One binary, one module per area.

mod billing;
mod broker_path;
mod check;
mod console;
mod dead_letters;
mod faults;
mod group;
mod interop;
mod ladder;
// Read by xtask, which decides where each test runs; nothing here uses it.
#[allow(dead_code)]
mod needs;
mod records;
mod sasl;
mod spring;
mod stock;
mod support;
mod tls;
mod topics;
mod trace;
mod window;

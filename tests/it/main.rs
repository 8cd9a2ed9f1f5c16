//! Integration tests against a real broker: `cargo xtask integration`.
//! One binary, one module per area.

mod billing;
mod broker_path;
mod dead_letters;
mod faults;
mod group;
mod interop;
mod ladder;
mod records;
mod sasl;
mod stock;
mod support;
mod tls;
mod topics;
mod window;

//! The consumer runtime: a [`listener::Listener`] runs one group member
//! (`member`) per consumed topic; a member joins, heartbeats and runs a
//! worker (`worker`) per assigned partition for as long as a generation
//! lasts; workers hand records to the handler (retry-core's `RecordHandler`), execute
//! retry-core's decisions through the publisher, and report finished
//! offsets to the committer (`commit`). Where a partition starts and
//! whether a doubted position stands is decided in `position`, purely. Every
//! instance reads the operators' pause of its listener in `pause`; records
//! wait for it in `brake`.

pub(crate) mod beat_pace;
pub(crate) mod brake;
pub(crate) mod commit;
pub(crate) mod config;
pub(crate) mod consumer_protocol;
pub(crate) mod cooperative;
pub(crate) mod fetched;
pub(crate) mod listener;
pub(crate) mod member;
pub(crate) mod partitions;
pub(crate) mod pause;
pub(crate) mod position;
pub(crate) mod reconcile;
pub(crate) mod shared;
pub(crate) mod worker;

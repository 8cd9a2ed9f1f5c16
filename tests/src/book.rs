//! The book's chapters as doctests: every Rust snippet under `docs/`
//! compiles (and runs, unless marked `no_run` or `ignore`) with `cargo
//! test`. `cargo xtask book` checks that every chapter is listed here.

#[doc = include_str!("../../docs/introduction.md")]
pub struct Introduction;

#[doc = include_str!("../../docs/guide/retry-core.md")]
pub struct GuideRetryCore;

#[doc = include_str!("../../docs/guide/retry-kafka.md")]
pub struct GuideRetryKafka;

#[doc = include_str!("../../docs/operations/quick-start.md")]
pub struct OperationsQuickStart;

#[doc = include_str!("../../docs/operations/billing.md")]
pub struct OperationsBilling;

#[doc = include_str!("../../docs/operations/configuration.md")]
pub struct OperationsConfiguration;

#[doc = include_str!("../../docs/operations/brake.md")]
pub struct OperationsBrake;

#[doc = include_str!("../../docs/operations/metrics.md")]
pub struct OperationsMetrics;

#[doc = include_str!("../../docs/operations/tracing.md")]
pub struct OperationsTracing;

#[doc = include_str!("../../docs/operations/operators.md")]
pub struct OperationsOperators;

#[doc = include_str!("../../docs/operations/managed-clusters.md")]
pub struct OperationsManagedClusters;

#[doc = include_str!("../../docs/operations/spring.md")]
pub struct OperationsSpring;

#[doc = include_str!("../../docs/contributing/tests.md")]
pub struct ContributingTests;

#[doc = include_str!("../../docs/contributing/brokers.md")]
pub struct ContributingBrokers;

#[doc = include_str!("../../docs/contributing/benchmarks.md")]
pub struct ContributingBenchmarks;

#[doc = include_str!("../../docs/contributing/broker-notes.md")]
pub struct ContributingBrokerNotes;

#[doc = include_str!("../../docs/SUMMARY.md")]
pub struct Summary;

//! `billing-bin check`: a preflight of the settings `run` reads, before the
//! first event. One line per check, each failure with what to do next;
//! exit 0 when every check passes, 1 otherwise; `--json` for scripts.
//!
//! The checks: the configuration; every bootstrap broker, and every broker
//! the cluster advertises, reachable and answering ApiVersions (with the
//! versions the service will speak); TLS and SASL (mechanism and user,
//! never the password); the ladder's topics; the consumer groups; the
//! billing provider (a request that charges nothing); the operators' token.
//! A check that needs an earlier one which failed is skipped, saying why.

use std::fmt::Write as _;

use retry_kafka::{
    contact_brokers, BrokerContact, Error as KafkaError, Found, GroupOffsets, SecurityProtocol, TopicPlan,
};
use serde::Serialize;

use crate::{
    config::{CheckArgs, KafkaArgs},
    failure::Failure,
};

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub(crate) enum Outcome {
    /// It passed: what was found.
    Pass { detail: String },
    /// It failed: what is wrong, and what to do about it.
    Fail { detail: String, next_step: String },
    /// It could not run: which earlier check it needs.
    Skip { detail: String },
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Check {
    /// What was checked, e.g. `broker 127.0.0.1:9092`.
    pub(crate) name: String,
    #[serde(flatten)]
    pub(crate) outcome: Outcome,
}

fn pass(name: impl Into<String>, detail: impl Into<String>) -> Check {
    Check { name: name.into(), outcome: Outcome::Pass { detail: detail.into() } }
}

fn fail(name: impl Into<String>, detail: impl Into<String>, next_step: impl Into<String>) -> Check {
    Check { name: name.into(), outcome: Outcome::Fail { detail: detail.into(), next_step: next_step.into() } }
}

fn skip(name: impl Into<String>, detail: impl Into<String>) -> Check {
    Check { name: name.into(), outcome: Outcome::Skip { detail: detail.into() } }
}

/// Every check, in order.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) checks: Vec<Check>,
}

impl Report {
    fn passed(&self) -> bool {
        self.checks.iter().all(|c| matches!(c.outcome, Outcome::Pass { .. }))
    }

    /// One line per check; a failure's next step on the line below it.
    pub(crate) fn text(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut text = String::new();
        for check in &self.checks {
            let (mark, detail) = match &check.outcome {
                Outcome::Pass { detail } => ("ok  ", detail),
                Outcome::Fail { detail, .. } => ("FAIL", detail),
                Outcome::Skip { detail } => ("skip", detail),
            };
            let _ = writeln!(text, "{mark}  {:width$}  {detail}", check.name);
            if let Outcome::Fail { next_step, .. } = &check.outcome {
                let _ = writeln!(text, "      {:width$}  -> {next_step}", "");
            }
        }
        let failed = self.checks.iter().filter(|c| !matches!(c.outcome, Outcome::Pass { .. })).count();
        let total = self.checks.len();
        if failed == 0 {
            let _ = writeln!(text, "all {total} checks passed");
        } else {
            let _ = writeln!(text, "{failed} of {total} checks did not pass");
        }
        text
    }

    pub(crate) fn json(&self) -> String {
        let value = serde_json::json!({ "passed": self.passed(), "checks": self.checks });
        serde_json::to_string_pretty(&value).expect("a report serializes")
    }
}

/// What a user refused by the cluster's authorizer needs.
const ACLS: &str = "grant the user the ACLs the service needs: Describe, Read and Write on the ladder's topics, \
                    Read and Describe on its consumer groups";

/// What to do about `error`, which a broker connection or request gave.
pub(crate) fn next_step(error: &KafkaError) -> String {
    if error.is_unreachable() {
        return "start a broker (for a local one: `cargo xtask up`), or set KAFKA_BROKERS to your cluster's \
                bootstrap brokers"
            .into();
    }
    match error {
        KafkaError::Authentication { .. } => "check KAFKA_SASL_USERNAME, the password (KAFKA_SASL_PASSWORD or \
             KAFKA_SASL_PASSWORD_FILE) and KAFKA_SASL_MECHANISM: the cluster must know this user for this mechanism"
            .into(),
        KafkaError::Tls { .. } | KafkaError::TlsFile { .. } => "check KAFKA_SSL_CA_LOCATION (the CA that signed \
             the broker's certificate), KAFKA_SSL_ENDPOINT_IDENTIFICATION, and for mutual TLS \
             KAFKA_SSL_CERTIFICATE_LOCATION and KAFKA_SSL_KEY_LOCATION"
            .into(),
        KafkaError::Io { .. } | KafkaError::Protocol { .. } | KafkaError::Timeout { .. } => {
            "the broker took the connection but the exchange broke: check that KAFKA_SECURITY_PROTOCOL is the \
             listener's (SSL or SASL_SSL for a TLS listener, SASL_* where it requires SASL)"
                .into()
        }
        KafkaError::UnsupportedVersion { .. } => "the broker is older than this service needs (Kafka 2.3 or \
             later; for KAFKA_GROUP_PROTOCOL=consumer, Apache Kafka 4.0 or later)"
            .into(),
        KafkaError::Topics(problems)
            if problems.0.iter().any(|p| matches!(p, retry_kafka::TopicProblem::NotAuthorized { .. })) =>
        {
            format!("{ACLS} (a topic the user may not describe looks missing to it)")
        }
        KafkaError::Topics(problems) => {
            let missing = problems.0.iter().any(|p| matches!(p, retry_kafka::TopicProblem::Missing { .. }));
            let short: Vec<String> = problems
                .0
                .iter()
                .filter_map(|p| match p {
                    retry_kafka::TopicProblem::TooFewPartitions { topic, needs, .. } => {
                        Some(format!("kafka-topics.sh --alter --topic {topic} --partitions {needs}"))
                    }
                    _ => None,
                })
                .collect();
            let create = "create them with `billing-bin topics create` (locally, `cargo xtask up` does)";
            let grow =
                format!("add partitions, as a record keeps its partition on every rung: `{}`", short.join("`, `"));
            match (missing, short.is_empty()) {
                (true, true) => create.into(),
                (false, _) => grow,
                (true, false) => format!("{create}; {grow}"),
            }
        }
        KafkaError::Broker { error, .. } if error.name().ends_with("AUTHORIZATION_FAILED") => ACLS.into(),
        _ => "run again with RUST_LOG=debug to see every step".into(),
    }
}

/// Runs every check and prints the report; fails (exit 1) unless all pass.
pub(crate) async fn check(kafka: &KafkaArgs, args: &CheckArgs) -> Result<(), Failure> {
    let report = report(kafka, args).await;
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    if report.passed() {
        Ok(())
    } else {
        Err(Failure::Reported)
    }
}

async fn report(kafka: &KafkaArgs, args: &CheckArgs) -> Report {
    let run = &args.run;
    let mut checks = Vec::new();
    let connection = kafka.connection();
    let policy = crate::policy(kafka, run.operators.max_event_age().ok().flatten());
    let provider = run.provider().and_then(|config| {
        billing::ChargeHandler::new(config, run.charge_rules()?).map_err(|e| Failure::Config(e.to_string()))
    });

    // Configuration: every setting `run` reads, each problem named.
    let problems: Vec<String> = [
        connection.as_ref().err(),
        policy.as_ref().err(),
        provider.as_ref().err(),
        run.operators.max_event_age().err().as_ref(),
        run.start_at(None).err().as_ref(),
        run.window().err().as_ref(),
        run.brake().err().as_ref(),
        run.operators.http_limits().err().as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(Failure::message)
    .collect();
    checks.push(if problems.is_empty() {
        let detail = format!(
            "valid: topic {}, retries {}, group {}, {} group protocol",
            kafka.topic,
            kafka.retry_schedule,
            run.operators.group_id,
            format!("{:?}", run.group_protocol).to_lowercase()
        );
        pass("configuration", detail)
    } else {
        fail(
            "configuration",
            problems.join("; "),
            "fix the settings named; `billing-bin --help` lists each with its variable",
        )
    });

    match (&connection, &policy) {
        (Ok(connection), Ok(policy)) => cluster_checks(&mut checks, connection, policy, run).await,
        _ => {
            for name in ["brokers", "security", "topics", "consumer groups"] {
                checks.push(skip(name, "the Kafka settings are invalid (see configuration)"));
            }
        }
    }

    checks.push(match &provider {
        Ok(handler) => provider_check(handler).await,
        Err(_) => skip("provider", "its settings are invalid (see configuration)"),
    });
    checks.push(match run.operators.admin_token() {
        Ok(Some(_)) => pass(
            "operators' token",
            format!("readable: the operators' API will listen on {}", run.operators.operator_listen),
        ),
        Ok(None) => pass("operators' token", "not set (ADMIN_TOKEN, ADMIN_TOKEN_FILE): the operators' API stays off"),
        Err(e) => fail(
            "operators' token",
            e.message(),
            "make ADMIN_TOKEN_FILE a readable file of at least 16 characters (or set ADMIN_TOKEN)",
        ),
    });
    Report { checks }
}

async fn cluster_checks(
    checks: &mut Vec<Check>,
    connection: &retry_kafka::ConnectionConfig,
    policy: &retry_core::RetryPolicy,
    run: &crate::config::RunArgs,
) {
    let contacts = contact_brokers(connection, run.group_protocol).await;
    let (mut reached, mut lacking) = (0, 0);
    let mut security_failure = None;
    for (addr, found, contact) in &contacts {
        let name = match found {
            Found::Bootstrap => format!("broker {addr}"),
            Found::Advertised(node) => format!("broker {node} at {addr}"),
        };
        checks.push(match contact {
            Ok(contact) if contact.missing().is_empty() => {
                reached += 1;
                pass(name, broker_detail(contact))
            }
            Ok(contact) => {
                reached += 1;
                lacking += 1;
                let missing = contact.missing();
                let detail = format!("lacks {} ({})", missing.join(", "), broker_detail(contact));
                // Only the consumer group protocol's requests: the classic one would do.
                let step = if missing.iter().all(|api| api.starts_with("ConsumerGroup")) {
                    "set KAFKA_GROUP_PROTOCOL=classic, or upgrade the broker (Apache Kafka 4.0 or later)"
                } else {
                    "upgrade the broker: the service needs Kafka 2.3 or later (Apache Kafka 4.0 or later for \
                     KAFKA_GROUP_PROTOCOL=consumer)"
                };
                fail(name, detail, step)
            }
            Err(e) => {
                if matches!(e, KafkaError::Authentication { .. } | KafkaError::Tls { .. }) {
                    security_failure.get_or_insert_with(|| (e.to_string(), next_step(e)));
                }
                let detail = match found {
                    Found::Advertised(_) if e.is_unreachable() => format!(
                        "advertised by the cluster but unreachable from here ({}): every fetch from its partitions \
                         would fail",
                        e.root_cause()
                    ),
                    _ if e.is_unreachable() => format!("unreachable ({})", e.root_cause()),
                    _ => e.to_string(),
                };
                let step = match found {
                    Found::Advertised(_) if e.is_unreachable() => "fix the broker's advertised.listeners, or reach \
                        the cluster from where it advertises itself"
                        .to_owned(),
                    _ => next_step(e),
                };
                fail(name, detail, step)
            }
        });
    }
    checks.push(security_check(connection, reached, security_failure));
    if reached == 0 {
        checks.push(skip("topics", "no broker answered"));
        checks.push(skip("consumer groups", "no broker answered"));
        return;
    }
    if reached == lacking {
        let why = "no broker that answered speaks what the service needs (see the brokers' checks)";
        checks.push(skip("topics", why));
        checks.push(skip("consumer groups", why));
        return;
    }

    let topology = policy.topology();
    let topics: Vec<String> = std::iter::once(topology.source_topic().to_string())
        .chain(topology.retry_topics().map(|(_, t)| t.to_string()))
        .chain([topology.dead_letter_topic().to_string()])
        .collect();
    let user = connection.security().sasl().map(|c| c.username.as_str());
    checks.push(match TopicPlan::new(topology.clone(), 1).verify(connection).await {
        Ok(()) => pass("topics", format!("{} exist with enough partitions", topics.join(", "))),
        Err(KafkaError::Topics(problems)) => {
            let listed: Vec<String> = problems.0.iter().map(|p| topic_problem(p, user)).collect();
            fail("topics", listed.join("; "), next_step(&KafkaError::Topics(problems)))
        }
        Err(e) => fail("topics", e.to_string(), next_step(&e)),
    });

    let groups = match retry_core::groups::LadderGroups::new(&run.operators.group_id, topology) {
        Ok(groups) => groups,
        Err(e) => {
            checks.push(fail("consumer groups", e.to_string(), "fix BILLING_GROUP_ID"));
            return;
        }
    };
    let mut described = Vec::new();
    for consumed in groups.consumed(topology) {
        let mut offsets = GroupOffsets::new(connection.clone(), consumed.group);
        match offsets.state().await {
            Ok(state) => described.push(format!("{} {} ({} members)", consumed.group, state.state, state.members)),
            // tansu's answer for a group nobody joined yet (Kafka says Dead):
            // a new deployment's, made on the first join.
            Err(e) if e.broker_error().is_some_and(|b| b.name() == "GROUP_ID_NOT_FOUND") => {
                described.push(format!("{} new (no member yet)", consumed.group))
            }
            // The mock cluster's: listeners need no description.
            Err(KafkaError::UnsupportedVersion { api, .. }) if api.contains("Describe") => {
                checks.push(pass(
                    "consumer groups",
                    format!("cannot be described here (the broker lacks {api}); listeners do without"),
                ));
                return;
            }
            Err(e) => {
                checks.push(fail("consumer groups", format!("{}: {e}", consumed.group), next_step(&e)));
                return;
            }
        }
    }
    checks.push(pass("consumer groups", described.join(", ")));
}

fn topic_problem(problem: &retry_kafka::TopicProblem, user: Option<&str>) -> String {
    match problem {
        retry_kafka::TopicProblem::Missing { topic } => format!("{topic} is missing"),
        retry_kafka::TopicProblem::NotAuthorized { topic } => {
            format!("{topic} is not described to {} (TOPIC_AUTHORIZATION_FAILED)", user.unwrap_or("this user"))
        }
        retry_kafka::TopicProblem::TooFewPartitions { topic, has, needs, .. } => {
            format!("{topic} has {has} partition{}, needs {needs}", if *has == 1 { "" } else { "s" })
        }
        other => format!("{other:?}"),
    }
}

/// A reached broker in a line: its security and the versions it will be spoken.
fn broker_detail(contact: &BrokerContact) -> String {
    let versions: Vec<String> =
        contact.requests.iter().filter_map(|r| r.version.map(|v| format!("{} v{v}", r.api))).collect();
    format!("answers ApiVersions over {}; will speak {}", contact.security.name(), versions.join(", "))
}

/// The security line; `failure` is the first TLS or SASL refusal, with its next step.
fn security_check(
    connection: &retry_kafka::ConnectionConfig,
    reached: usize,
    failure: Option<(String, String)>,
) -> Check {
    let protocol = connection.security().protocol();
    let sasl = connection.security().sasl().map(|c| format!("SASL {} as {}", c.mechanism.name(), c.username));
    if let Some((failure, step)) = failure {
        return fail("security", failure, step);
    }
    if reached == 0 {
        return skip("security", "no broker answered");
    }
    let detail = match (protocol, sasl) {
        (SecurityProtocol::Plaintext, _) => "PLAINTEXT: no TLS, no SASL".to_owned(),
        (SecurityProtocol::Ssl, _) => format!("SSL: TLS handshake with {reached} brokers"),
        (SecurityProtocol::SaslPlaintext, Some(sasl)) => {
            format!("SASL_PLAINTEXT: {sasl} accepted by {reached} brokers")
        }
        (SecurityProtocol::SaslSsl, Some(sasl)) => {
            format!("SASL_SSL: TLS handshake and {sasl} accepted by {reached} brokers")
        }
        (other, _) => other.name().to_owned(),
    };
    pass("security", detail)
}

async fn provider_check(handler: &billing::ChargeHandler) -> Check {
    let name = "provider";
    let url = handler.charges_url();
    match handler.probe().await {
        Ok(answer) if answer.status == 404 => pass(
            name,
            format!(
                "{url} answers (404 for a charge that cannot exist, as the contract has it, in {:.1} ms)",
                answer.took.as_secs_f64() * 1000.0
            ),
        ),
        Ok(answer) if (200..300).contains(&answer.status) => fail(
            name,
            format!("{url} answers {} for a charge that cannot exist", answer.status),
            "check that BILLING_PROVIDER_URL is the billing provider's base URL (charges go to <url>/charges)",
        ),
        Ok(answer) if answer.status >= 500 => fail(
            name,
            format!("{url} answers {}", answer.status),
            "the provider (or a proxy in front of it) is unwell: the service would retry, then brake",
        ),
        Ok(answer) => fail(
            name,
            format!("{url} answers {} to a status request", answer.status),
            "check BILLING_PROVIDER_URL: a wrong path or host answers 4xx to every charge",
        ),
        Err(e) => fail(
            name,
            format!("{e}"),
            "start the provider (for a local one: `cargo xtask up`), or fix BILLING_PROVIDER_URL",
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn each_broker_failure_says_what_to_do() {
        let io = |kind| std::io::Error::new(kind, "os says no");
        // (error, words the next step must hold)
        let table = [
            (
                KafkaError::Connect { addr: "b:9092".into(), source: io(std::io::ErrorKind::ConnectionRefused) },
                "cargo xtask up",
            ),
            (
                KafkaError::Timeout { addr: "b:9092".into(), api: "connect", timeout: Duration::from_secs(1) },
                "KAFKA_BROKERS",
            ),
            (
                KafkaError::Authentication {
                    addr: "b:9092".into(),
                    mechanism: "SCRAM-SHA-512",
                    username: "billing".into(),
                    reason: "wrong user name or password".into(),
                },
                "KAFKA_SASL_USERNAME",
            ),
            (KafkaError::Tls { addr: "b:9093".into(), reason: "untrusted".into() }, "KAFKA_SSL_CA_LOCATION"),
            (
                KafkaError::Io {
                    addr: "b:9093".into(),
                    api: "ApiVersions",
                    source: io(std::io::ErrorKind::UnexpectedEof),
                },
                "KAFKA_SECURITY_PROTOCOL",
            ),
            (
                KafkaError::Timeout { addr: "b:9093".into(), api: "ApiVersions", timeout: Duration::from_secs(1) },
                "KAFKA_SECURITY_PROTOCOL",
            ),
            (
                KafkaError::UnsupportedVersion {
                    addr: "b:9092".into(),
                    api: "JoinGroup",
                    ours_min: 0,
                    ours_max: 5,
                    theirs: None,
                },
                "older",
            ),
            (
                KafkaError::Broker {
                    api: "DescribeGroups",
                    context: None,
                    error: retry_kafka::BrokerError::from_code(30),
                },
                "ACLs",
            ),
        ];
        for (error, words) in table {
            let step = next_step(&error);
            assert!(step.contains(words), "{error}: {step}");
        }
    }

    #[test]
    fn the_report_reads_as_one_line_per_check_and_as_json() {
        let report = Report {
            checks: vec![
                pass("configuration", "valid"),
                fail("broker b:9092", "unreachable (connection refused)", "start a broker"),
                skip("topics", "no broker answered"),
            ],
        };
        let expected = "\
ok    configuration  valid
FAIL  broker b:9092  unreachable (connection refused)
                     -> start a broker
skip  topics         no broker answered
2 of 3 checks did not pass
";
        assert_eq!(report.text(), expected);
        let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
        assert_eq!(json["passed"], false);
        assert_eq!(json["checks"][1]["status"], "fail");
        assert_eq!(json["checks"][1]["next_step"], "start a broker");
        assert_eq!(json["checks"][2]["detail"], "no broker answered");
        assert!(Report { checks: vec![pass("configuration", "valid")] }.text().ends_with("all 1 checks passed\n"));
    }
}

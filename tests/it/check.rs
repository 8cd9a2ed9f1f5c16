//! `billing-bin check`, the preflight: with good settings every check
//! passes (exit 0), and each kind of wrong setting fails its own check,
//! with what to do next, and exit 1. Checked through `--json`, so the
//! assertions read which check said what; one test reads the text.

use integration::fake_provider::{FakeProvider, Faults};
use serde_json::Value;

use crate::billing::Setup;

/// A fresh ladder with its topics, a provider and a token file.
struct Checked {
    setup: Setup,
    provider: FakeProvider,
    token: std::path::PathBuf,
}

impl Checked {
    async fn new(name: &str) -> Checked {
        let checked = Checked::without_topics(name).await;
        checked.setup.create_topics().await;
        checked
    }

    /// The same, with no topic created.
    async fn without_topics(name: &str) -> Checked {
        let setup = Setup::new(name);
        let token = std::env::temp_dir().join(format!("{}-token", setup.topic));
        std::fs::write(&token, "a-token-of-thirty-two-characters\n").unwrap();
        Checked { setup, provider: FakeProvider::start(Faults::default()).await, token }
    }

    /// Runs `billing-bin check --json` with `env` over the good settings:
    /// its exit code and report.
    async fn check(&self, env: &[(&str, &str)]) -> (i32, Value) {
        let url = self.provider.url();
        let token = self.token.display().to_string();
        let mut all = vec![("BILLING_PROVIDER_URL", url.as_str()), ("ADMIN_TOKEN_FILE", token.as_str())];
        all.extend_from_slice(env);
        let (code, stdout, stderr) = self.setup.run(&["check", "--json"], &all).await;
        let report: Value =
            serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not a JSON report ({e}):\n{stdout}\n{stderr}"));
        (code, report)
    }
}

/// The check named `name` (or starting so), e.g. `broker 127.0.0.1:1`.
fn named<'a>(report: &'a Value, name: &str) -> &'a Value {
    let checks = report["checks"].as_array().expect("a list of checks");
    checks
        .iter()
        .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with(name)))
        .unwrap_or_else(|| panic!("no check {name:?} in {report:#}"))
}

/// Asserts that check `name` has `status` and that its next step holds `words`.
fn assert_check(report: &Value, name: &str, status: &str, words: &str) {
    let check = named(report, name);
    assert_eq!(check["status"], status, "{report:#}");
    if status == "fail" {
        let text = format!("{} {}", check["detail"], check["next_step"]);
        assert!(text.contains(words), "{name}: {words:?} not in {check:#}");
    }
}

#[tokio::test]
async fn every_check_passes_with_good_settings() {
    let checked = Checked::new("check-good").await;
    let (code, report) = checked.check(&[]).await;
    assert_eq!((code, &report["passed"]), (0, &Value::Bool(true)), "{report:#}");
    for name in ["configuration", "broker ", "security", "topics", "consumer groups", "provider", "operators' token"] {
        assert_check(&report, name, "pass", "");
    }
    // The versions it will speak, from the broker's ApiVersions.
    let broker = named(&report, "broker ")["detail"].as_str().unwrap();
    assert!(broker.contains("Fetch v") && broker.contains("OffsetCommit v"), "{broker}");
    let topics = named(&report, "topics")["detail"].as_str().unwrap();
    assert!(topics.contains(checked.setup.topology().dead_letter_topic().as_str()), "{topics}");
}

#[tokio::test]
async fn the_text_report_is_a_line_per_check_with_what_to_do() {
    let checked = Checked::new("check-text").await;
    let url = checked.provider.url();
    let (code, stdout, _) = checked
        .setup
        .run(&["check"], &[("BILLING_PROVIDER_URL", &url), ("BILLING_TOPIC", "check-text-no-such-topic")])
        .await;
    assert_eq!(code, 1, "{stdout}");
    let topics = stdout.lines().position(|l| l.starts_with("FAIL  topics")).unwrap_or_else(|| panic!("{stdout}"));
    let next = stdout.lines().nth(topics + 1).unwrap();
    assert!(next.trim_start().starts_with("-> ") && next.contains("billing-bin topics create"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("ok    configuration")), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("1 of ") && last.ends_with(" checks did not pass"), "{stdout}");
}

#[tokio::test]
async fn an_unreachable_broker_fails_its_check_and_the_others_still_run() {
    let checked = Checked::new("check-unreachable").await;
    let dead = format!("127.0.0.1:{}", free_port());
    // One dead broker among the good ones: reported, and the rest checked.
    let brokers = format!("{dead},{}", integration::broker_addr());
    let (code, report) = checked.check(&[("KAFKA_BROKERS", &brokers)]).await;
    assert_eq!(code, 1, "{report:#}");
    assert_check(&report, &format!("broker {dead}"), "fail", "cargo xtask up");
    assert_check(&report, "topics", "pass", "");
    // Only dead brokers: what needs one is skipped, saying why.
    let (code, report) = checked.check(&[("KAFKA_BROKERS", &dead)]).await;
    assert_eq!(code, 1);
    assert_check(&report, &format!("broker {dead}"), "fail", "KAFKA_BROKERS");
    assert_check(&report, "topics", "skip", "");
    assert_check(&report, "consumer groups", "skip", "");
    assert_check(&report, "provider", "pass", "");
}

#[tokio::test]
async fn missing_topics_are_named_with_the_command_that_creates_them() {
    let checked = Checked::new("check-topics").await;
    let (code, report) = checked.check(&[("BILLING_TOPIC", "check-topics-never-created")]).await;
    assert_eq!(code, 1);
    assert_check(&report, "topics", "fail", "check-topics-never-created.retry-200ms is missing");
    assert_check(&report, "topics", "fail", "billing-bin topics create");
    assert_check(&report, "broker ", "pass", "");
}

/// A rung and the dead-letter topic with fewer partitions than the
/// source: each is named with its count, the source's, and what to do.
#[tokio::test]
async fn topics_with_fewer_partitions_than_the_source_are_named() {
    let checked = Checked::without_topics("check-short").await;
    let topology = checked.setup.topology();
    let (first_rung, second_rung) = {
        let mut rungs = topology.retry_topics().map(|(_, topic)| topic.as_str().to_owned());
        (rungs.next().unwrap(), rungs.next().unwrap())
    };
    let dead_letters = topology.dead_letter_topic().as_str().to_owned();
    integration::create_topic(topology.source_topic().as_str(), 3).await;
    integration::create_topic(&first_rung, 1).await;
    integration::create_topic(&second_rung, 3).await;
    integration::create_topic(&dead_letters, 2).await;
    let (code, report) = checked.check(&[]).await;
    assert_eq!(code, 1, "{report:#}");
    assert_check(&report, "topics", "fail", &format!("{first_rung} has 1 partition, needs 3"));
    assert_check(&report, "topics", "fail", &format!("{dead_letters} has 2 partitions, needs 3"));
    assert_check(&report, "topics", "fail", &format!("--alter --topic {first_rung} --partitions 3"));
    let detail = named(&report, "topics")["detail"].as_str().unwrap();
    assert!(!detail.contains(&format!("{second_rung} has")), "{detail}");
    assert_check(&report, "broker ", "pass", "");
}

#[tokio::test]
async fn a_provider_that_is_down_or_unreachable_fails_its_check() {
    let checked = Checked::new("check-provider").await;
    checked.provider.set_down(true);
    let (code, report) = checked.check(&[]).await;
    assert_eq!(code, 1);
    assert_check(&report, "provider", "fail", "answers 503");
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let (code, report) = checked.check(&[("BILLING_PROVIDER_URL", &nowhere)]).await;
    assert_eq!(code, 1);
    assert_check(&report, "provider", "fail", "cargo xtask up");
    // A server that refuses every request (401: it wants credentials the
    // service does not send): every charge would be refused.
    let refusing = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", refusing.local_addr().unwrap());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut stream, _)) = refusing.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            let _ =
                stream.write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await;
        }
    });
    let (_, report) = checked.check(&[("BILLING_PROVIDER_URL", &url)]).await;
    assert_check(&report, "provider", "fail", "answers 401");
    assert_check(&report, "provider", "fail", "BILLING_PROVIDER_URL");
}

#[tokio::test]
async fn invalid_settings_and_an_unreadable_token_fail_their_checks() {
    let checked = Checked::new("check-config").await;
    let (code, report) = checked.check(&[("BILLING_BRAKE", "sometimes"), ("BILLING_CURRENCIES", "EUR,XXQ")]).await;
    assert_eq!(code, 1);
    assert_check(&report, "configuration", "fail", "BILLING_BRAKE");
    assert_check(&report, "configuration", "fail", "BILLING_CURRENCIES");
    assert_check(&report, "configuration", "fail", "billing-bin --help");
    // The Kafka settings are fine: the cluster is still checked.
    assert_check(&report, "topics", "pass", "");
    let (_, report) = checked.check(&[("KAFKA_SECURITY_PROTOCOL", "SMOKE_SIGNALS")]).await;
    assert_check(&report, "configuration", "fail", "KAFKA_SECURITY_PROTOCOL");
    assert_check(&report, "brokers", "skip", "");
    let (code, report) = checked.check(&[("ADMIN_TOKEN_FILE", "/nonexistent/token")]).await;
    assert_eq!(code, 1);
    assert_check(&report, "operators' token", "fail", "/nonexistent/token");
    let short = std::env::temp_dir().join(format!("{}-short-token", checked.setup.topic));
    std::fs::write(&short, "short").unwrap();
    let (_, report) = checked.check(&[("ADMIN_TOKEN_FILE", &short.display().to_string())]).await;
    assert_check(&report, "operators' token", "fail", "16 characters");
}

/// Where the broker lacks the consumer group protocol (tansu), asking for
/// it fails the broker's check naming the request.
#[tokio::test]
async fn the_consumer_group_protocol_is_checked_against_the_broker() {
    let checked = Checked::new("check-protocol").await;
    let (code, report) = checked.check(&[("KAFKA_GROUP_PROTOCOL", "consumer")]).await;
    assert_eq!(code, 1);
    assert_check(&report, "broker ", "fail", "lacks ConsumerGroupHeartbeat");
    assert_check(&report, "broker ", "fail", "KAFKA_GROUP_PROTOCOL=classic");
}

/// A broker that answers at its bootstrap address but advertises one
/// nobody listens on (a wrong `advertised.listeners`): the bootstrap
/// passes, the advertised broker fails its own check with what to fix.
/// The broker is a tansu of the test's own, started with that setting.
#[tokio::test]
async fn a_broker_advertised_where_it_cannot_be_reached_fails_its_own_check() {
    let tansu = std::env::var("KAFKA_RETRY_TANSU")
        .expect("KAFKA_RETRY_TANSU names tansu's binary (cargo xtask integration sets it on tansu's passes)");
    let checked = Checked::without_topics("check-advertised").await;
    let dir = std::env::temp_dir().join(format!("{}-tansu", checked.setup.topic));
    std::fs::create_dir_all(&dir).unwrap();
    let (listen, advertised) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let log = std::fs::File::create(dir.join("broker.log")).unwrap();
    let _broker = tokio::process::Command::new(&tansu)
        .args(["broker", "--listener-url", &format!("tcp://{listen}")])
        .args(["--advertised-listener-url", &format!("tcp://{advertised}")])
        .args(["--storage-engine", "sqlite://tansu.db", "--cluster-id", "check-advertised"])
        .current_dir(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {tansu}: {e}"));
    let listening = async {
        while tokio::net::TcpStream::connect(&listen).await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), listening)
        .await
        .unwrap_or_else(|_| panic!("tansu does not listen on {listen}: see {}", dir.join("broker.log").display()));

    let (code, report) = checked.check(&[("KAFKA_BROKERS", &listen)]).await;
    assert_eq!(code, 1, "{report:#}");
    assert_check(&report, &format!("broker {listen}"), "pass", "");
    let checks = report["checks"].as_array().unwrap();
    let at = format!(" at {advertised}");
    let advertised_check = checks
        .iter()
        .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with("broker ") && n.ends_with(&at)))
        .unwrap_or_else(|| panic!("no check of the broker advertised at {advertised}: {report:#}"));
    let name = advertised_check["name"].as_str().unwrap();
    assert_check(&report, name, "fail", "advertised by the cluster but unreachable");
    assert_check(&report, name, "fail", "advertised.listeners");
}

/// A broker as old as Kafka 0.10.0 (a stand-in of the test's own: no
/// such broker runs here) answers ApiVersions with that release's
/// versions, refusing first the version asked (KIP-511). It lacks the
/// Produce and Fetch versions the service speaks: its check
/// names them and says to upgrade, and what needs a usable broker is
/// skipped, saying why.
#[tokio::test]
async fn a_broker_too_old_for_the_service_is_named_with_what_it_lacks() {
    let broker = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = broker.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = broker.accept().await {
            tokio::spawn(answer_as_kafka_0_10(stream));
        }
    });
    let checked = Checked::without_topics("check-old").await;
    let (code, report) = checked.check(&[("KAFKA_BROKERS", &addr)]).await;
    assert_eq!(code, 1, "{report:#}");
    let name = format!("broker {addr}");
    for lacking in ["Produce", "Fetch"] {
        assert_check(&report, &name, "fail", lacking);
    }
    let detail = named(&report, &name)["detail"].as_str().unwrap();
    assert!(detail.starts_with("lacks ") && !detail.contains("OffsetCommit,"), "{detail}");
    assert_check(&report, &name, "fail", "upgrade the broker");
    assert_check(&report, "topics", "skip", "");
    assert_check(&report, "consumer groups", "skip", "");
}

/// Serves one connection as Kafka 0.10.0 would answer ApiVersions, and
/// closes it on any other request.
async fn answer_as_kafka_0_10(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // (api key, min, max): Produce .. ApiVersions of Kafka 0.10.0.
    const VERSIONS: [(i16, i16, i16); 19] = [
        (0, 0, 2),
        (1, 0, 2),
        (2, 0, 0),
        (3, 0, 1),
        (4, 0, 0),
        (5, 0, 0),
        (6, 0, 2),
        (7, 1, 1),
        (8, 0, 2),
        (9, 0, 1),
        (10, 0, 0),
        (11, 0, 0),
        (12, 0, 0),
        (13, 0, 0),
        (14, 0, 0),
        (15, 0, 0),
        (16, 0, 0),
        (17, 0, 0),
        (18, 0, 0),
    ];
    loop {
        let Ok(size) = stream.read_i32().await else { return };
        let mut request = vec![0u8; size.max(0) as usize];
        if stream.read_exact(&mut request).await.is_err() || request.len() < 8 {
            return;
        }
        let (key, version) =
            (i16::from_be_bytes([request[0], request[1]]), i16::from_be_bytes([request[2], request[3]]));
        if key != 18 {
            return;
        }
        // The v0 layout either way: UNSUPPORTED_VERSION (35) listing only
        // ApiVersions 0..0 for a newer version, every range for v0.
        let listed: &[(i16, i16, i16)] = if version > 0 { &VERSIONS[18..] } else { &VERSIONS };
        let mut answer = request[4..8].to_vec(); // the correlation id
        answer.extend_from_slice(&(if version > 0 { 35i16 } else { 0 }).to_be_bytes());
        answer.extend_from_slice(&(listed.len() as i32).to_be_bytes());
        for (key, min, max) in listed {
            for n in [key, min, max] {
                answer.extend_from_slice(&n.to_be_bytes());
            }
        }
        let mut framed = (answer.len() as i32).to_be_bytes().to_vec();
        framed.extend_from_slice(&answer);
        if stream.write_all(&framed).await.is_err() {
            return;
        }
    }
}

/// Against a broker that requires SASL: a wrong password fails the
/// brokers' and the security checks, never showing the password.
#[tokio::test]
async fn a_wrong_password_fails_the_security_check_without_showing_it() {
    let checked = Checked::new("check-sasl").await;
    let wrong = "check-not-the-password-0815";
    let (code, report) = checked.check(&[("KAFKA_SASL_PASSWORD", wrong)]).await;
    assert_eq!(code, 1);
    assert_check(&report, "security", "fail", "KAFKA_SASL_USERNAME");
    assert_check(&report, "broker ", "fail", "wrong user name or password");
    assert!(!report.to_string().contains(wrong), "{report:#}");
}

/// On a cluster with an authorizer (Apache Kafka with ACLs, as managed
/// clusters run), a user that no ACL names: it authenticates, yet the
/// ladder's topics (created by the suite's user) are not described to it
/// and its groups cannot be: each check says so and which ACLs to grant.
#[tokio::test]
async fn a_user_without_acls_is_told_which_to_grant() {
    let env = |name: &str| {
        std::env::var(name)
            .unwrap_or_else(|_| panic!("{name} is set by cargo xtask integration on Kafka's SASL passes"))
    };
    let (user, password) =
        (env("KAFKA_RETRY_SASL_UNAUTHORIZED_USERNAME"), env("KAFKA_RETRY_SASL_UNAUTHORIZED_PASSWORD"));
    let checked = Checked::new("check-acls").await;
    let (code, report) = checked.check(&[("KAFKA_SASL_USERNAME", &user), ("KAFKA_SASL_PASSWORD", &password)]).await;
    assert_eq!(code, 1, "{report:#}");
    assert_check(&report, "broker ", "pass", "");
    assert_check(&report, "security", "pass", "");
    let source = checked.setup.topic.clone();
    assert_check(&report, "topics", "fail", &format!("{source} is not described to {user}"));
    assert_check(&report, "topics", "fail", "Describe, Read and Write on the ladder's topics");
    assert_check(&report, "consumer groups", "fail", "AUTHORIZATION_FAILED");
    assert_check(&report, "consumer groups", "fail", "grant the user the ACLs");
    assert!(!report.to_string().contains(&password), "{report:#}");
}

/// Against a broker behind TLS: an untrusted CA and a plaintext client
/// fail with what to set.
#[tokio::test]
async fn a_wrong_ca_or_no_tls_fails_with_the_setting_to_fix() {
    let checked = Checked::new("check-tls").await;
    let stranger = rcgen::generate_simple_self_signed(vec!["stranger.example".into()]).unwrap();
    let ca = std::env::temp_dir().join(format!("{}-stranger-ca.pem", checked.setup.topic));
    std::fs::write(&ca, stranger.cert.pem()).unwrap();
    let (code, report) = checked.check(&[("KAFKA_SSL_CA_LOCATION", &ca.display().to_string())]).await;
    assert_eq!(code, 1);
    assert_check(&report, "security", "fail", "KAFKA_SSL_CA_LOCATION");
    assert_check(&report, "broker ", "fail", "TLS");
    // No TLS at all against the TLS listener (the TLS files left out, or
    // the configuration check refuses them with a plaintext protocol).
    let plaintext = if integration::security().sasl().is_some() { "SASL_PLAINTEXT" } else { "PLAINTEXT" };
    let tls_files = ["KAFKA_SSL_CA_LOCATION", "KAFKA_SSL_CERTIFICATE_LOCATION", "KAFKA_SSL_KEY_LOCATION"];
    let run =
        crate::support::billing_bin(&["check", "--json"], &[("KAFKA_SECURITY_PROTOCOL", plaintext)], &tls_files).await;
    let report: Value = serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {run:?}"));
    assert_eq!(run.code, Some(1));
    assert_check(&report, "configuration", "fail", "BILLING_PROVIDER_URL");
    assert_check(&report, "broker ", "fail", "KAFKA_SECURITY_PROTOCOL");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

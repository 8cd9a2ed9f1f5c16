//! `billing-bin dlq ...`: the operators' API from a terminal. It talks to a
//! running service, so that every action goes through the same checks and
//! the same audit log as any other client. A replay is started as a job and
//! followed until it ends, so a dropped connection never stops it halfway.

use std::time::Duration;

use serde_json::Value;

use crate::{
    config::{DlqAction, DlqArgs, KafkaArgs},
    Failure,
};
use retry_operators::api::{AckBody, JobState, PauseBody, ReplayBody, ReplayJob};

/// How often a running replay is asked for its progress.
const POLL: Duration = Duration::from_millis(500);

pub(crate) async fn run(kafka: &KafkaArgs, args: &DlqArgs) -> Result<(), Failure> {
    let token = crate::config::admin_token(args.admin_token_file.as_deref())?
        .ok_or_else(|| Failure::Config("ADMIN_TOKEN or ADMIN_TOKEN_FILE is required for `dlq` commands".into()))?;
    let client = Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Failure::Runtime(format!("cannot build an HTTP client: {e}")))?,
        base: args.operator_url.trim_end_matches('/').to_owned(),
        token,
    };
    let topology = crate::topology(kafka)?;
    let dlq = topology.dead_letter_topic();
    let answer = match &args.action {
        DlqAction::List => client.call(reqwest::Method::GET, "/admin/dlq", None).await?,
        DlqAction::Show { partition, offset, limit } => {
            let mut path = format!("/admin/dlq/{dlq}/messages?limit={limit}");
            if let Some(partition) = partition {
                path.push_str(&format!("&partition={partition}"));
            }
            if let Some(offset) = offset {
                path.push_str(&format!("&offset={offset}"));
            }
            client.call(reqwest::Method::GET, &path, None).await?
        }
        DlqAction::Replay {
            target_topic,
            dry_run,
            limit,
            partition,
            offsets,
            keys,
            override_loop_guard,
            override_idempotency_window,
        } => {
            let target = target_topic.clone().unwrap_or_else(|| kafka.topic.clone());
            let body = ReplayBody {
                dry_run: *dry_run,
                limit: *limit,
                partition: *partition,
                offsets: (!offsets.is_empty()).then(|| offsets.clone()),
                keys: (!keys.is_empty()).then(|| keys.clone()),
                override_loop_guard: *override_loop_guard,
                override_idempotency_window: *override_idempotency_window,
            };
            let path = format!("/admin/dlq/{dlq}/replay?target_topic={target}");
            let body = serde_json::to_value(&body).unwrap_or_default();
            let mut job = parse_job(client.call(reqwest::Method::POST, &path, Some(body)).await?)?;
            eprintln!("replay job {} started", job.id);
            while job.state == JobState::Running {
                tokio::time::sleep(POLL).await;
                let answer = client.call(reqwest::Method::GET, &format!("/admin/dlq/replays/{}", job.id), None).await?;
                job = parse_job(answer)?;
                eprintln!("replayed {} so far, {} refused", job.report.replayed, job.report.skipped_total);
            }
            println!("{}", serde_json::to_string_pretty(&job).unwrap_or_default());
            return match job.state {
                JobState::Succeeded | JobState::Running => Ok(()),
                JobState::PartiallyFailed => Err(Failure::Runtime(format!(
                    "replay job {} stopped early on some partitions (see their errors): \
                     what was replayed is committed, repeat the command for the rest",
                    job.id
                ))),
                JobState::Failed => {
                    Err(Failure::Runtime(format!("replay job {} failed: {}", job.id, job.error.unwrap_or_default())))
                }
            };
        }
        DlqAction::Ack { partition, up_to_offset, offsets } => {
            let body = AckBody {
                partition: *partition,
                up_to_offset: *up_to_offset,
                offsets: (!offsets.is_empty()).then(|| offsets.clone()),
            };
            let body = serde_json::to_value(&body).unwrap_or_default();
            client.call(reqwest::Method::POST, &format!("/admin/dlq/{dlq}/ack"), Some(body)).await?
        }
        DlqAction::Listener => client.call(reqwest::Method::GET, "/admin/listener", None).await?,
        DlqAction::Pause { duration, reason } => {
            let body = PauseBody { duration: duration.clone(), reason: reason.clone() };
            let body = serde_json::to_value(&body).unwrap_or_default();
            client.call(reqwest::Method::POST, "/admin/listener/pause", Some(body)).await?
        }
        DlqAction::Resume => client.call(reqwest::Method::POST, "/admin/listener/resume", None).await?,
    };
    println!("{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
    Ok(())
}

fn parse_job(answer: Value) -> Result<ReplayJob, Failure> {
    serde_json::from_value(answer)
        .map_err(|e| Failure::Runtime(format!("the service's answer is not a replay job: {e}")))
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, Failure> {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::Runtime(format!("cannot reach the service at {}: {e}", self.base)))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let reason =
                value.get("error").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| value.to_string());
            return Err(Failure::Runtime(format!("the service answered {status}: {reason}")));
        }
        Ok(value)
    }
}

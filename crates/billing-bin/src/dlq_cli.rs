//! `billing-bin dlq ...`: the operators' API from a terminal. It talks to a
//! running service, so that every action goes through the same checks and
//! the same audit log as any other client.

use std::time::Duration;

use serde_json::{json, Value};

use crate::{
    config::{DlqAction, DlqArgs, KafkaArgs},
    Failure,
};

pub(crate) async fn run(kafka: &KafkaArgs, args: &DlqArgs) -> Result<(), Failure> {
    let token = crate::config::admin_token(args.admin_token_file.as_deref())?
        .ok_or_else(|| Failure::Config("ADMIN_TOKEN or ADMIN_TOKEN_FILE is required for `dlq` commands".into()))?;
    let base = args.admin_url.trim_end_matches('/');
    let dlq = format!("{}.dlq", kafka.topic);
    let (method, path, body) = match &args.action {
        DlqAction::List => (reqwest::Method::GET, "/admin/dlq".to_owned(), None),
        DlqAction::Show { partition, offset, limit } => (
            reqwest::Method::GET,
            format!("/admin/dlq/{dlq}/messages?partition={partition}&offset={offset}&limit={limit}"),
            None,
        ),
        DlqAction::Replay { target_topic, dry_run, limit, partition, offsets, keys, override_loop_guard } => {
            let target = target_topic.clone().unwrap_or_else(|| kafka.topic.clone());
            let mut body = json!({ "dry_run": dry_run, "override_loop_guard": override_loop_guard });
            if let Some(limit) = limit {
                body["limit"] = json!(limit);
            }
            if let Some(partition) = partition {
                body["partition"] = json!(partition);
            }
            if !offsets.is_empty() {
                body["offsets"] = json!(offsets);
            }
            if !keys.is_empty() {
                body["keys"] = json!(keys);
            }
            (reqwest::Method::POST, format!("/admin/dlq/{dlq}/replay?target_topic={target}"), Some(body))
        }
        DlqAction::Ack { partition, up_to_offset } => (
            reqwest::Method::POST,
            format!("/admin/dlq/{dlq}/ack"),
            Some(json!({ "partition": partition, "up_to_offset": up_to_offset })),
        ),
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot build an HTTP client: {e}")))?;
    let mut request = client.request(method, format!("{base}{path}")).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response =
        request.send().await.map_err(|e| Failure::Runtime(format!("cannot reach the service at {base}: {e}")))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if !status.is_success() {
        let reason = value.get("error").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| value.to_string());
        return Err(Failure::Runtime(format!("the service answered {status}: {reason}")));
    }
    println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
    Ok(())
}

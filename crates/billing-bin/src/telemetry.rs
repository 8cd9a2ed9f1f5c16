//! OpenTelemetry trace export, configured as every OpenTelemetry SDK is:
//! on when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set and `OTEL_SDK_DISABLED` is
//! not `true`, off otherwise (then the listener records no spans at all).
//! The exporter speaks OTLP over HTTP (`http/protobuf`, or `http/json`
//! through `OTEL_EXPORTER_OTLP_PROTOCOL`); it reads the standard
//! `OTEL_EXPORTER_OTLP_*` headers, timeout and compression variables, the
//! SDK `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER(_ARG)` and `OTEL_BSP_*`. The service name is
//! `billing-bin` unless those name another. Header values (API keys) are
//! never logged.

use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::{trace::SdkTracerProvider, Resource};
use retry_kafka::Tracing;

use crate::failure::Failure;

/// Export on, or off.
pub(crate) struct Telemetry(Option<SdkTracerProvider>);

/// What the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Export {
    Off,
    Otlp { protocol: Protocol, endpoint: String },
}

/// Reads the export settings through `var` (the environment).
fn export_from(var: impl Fn(&str) -> Option<String>) -> Result<Export, String> {
    let set = |name: &str| var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(Export::Off);
    }
    let Some(endpoint) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(Export::Off);
    };
    if set("OTEL_TRACES_EXPORTER").is_some_and(|v| v == "none") {
        return Ok(Export::Off);
    }
    let protocol = match set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .as_deref()
    {
        None | Some("http/protobuf") => Protocol::HttpBinary,
        Some("http/json") => Protocol::HttpJson,
        Some("grpc") => {
            return Err("OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported: use http/protobuf (the OTLP/HTTP port of \
                collectors, Jaeger and Tempo, 4318 by default)"
                .into())
        }
        Some(other) => {
            return Err(format!("OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or http/json, not {other:?}"))
        }
    };
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(format!(
            "the OTLP endpoint must be an http:// or https:// URL such as http://localhost:4318, not {:?}",
            endpoint_shown(&endpoint)
        ));
    }
    Ok(Export::Otlp { protocol, endpoint })
}

/// The endpoint as it may be shown: without credentials in its authority.
fn endpoint_shown(endpoint: &str) -> String {
    let (scheme, rest) = endpoint.split_once("://").map_or(("", endpoint), |(s, r)| (s, r));
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let prefix = if scheme.is_empty() { String::new() } else { format!("{scheme}://") };
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{prefix}…@{}", &rest[at + 1..]),
        None => endpoint.to_owned(),
    }
}

impl Telemetry {
    /// Installs the global tracer provider the environment asks for.
    pub(crate) fn start() -> Result<Telemetry, Failure> {
        let export = export_from(|name| std::env::var(name).ok()).map_err(Failure::Config)?;
        let Export::Otlp { protocol, endpoint } = export else {
            return Ok(Telemetry(None));
        };
        // The exporter reads the endpoint itself (adding /v1/traces to the
        // generic one), with the headers, timeout and compression.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(protocol)
            .build()
            .map_err(|e| Failure::Config(format!("the OTLP exporter cannot be built: {e}")))?;
        let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
        let resource = if named {
            Resource::builder().build()
        } else {
            Resource::builder().with_service_name("billing-bin").build()
        };
        let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        tracing::info!(endpoint = %endpoint_shown(&endpoint), ?protocol, "exporting spans over OTLP");
        Ok(Telemetry(Some(provider)))
    }

    /// What the listener and the operators' API record.
    pub(crate) fn tracing(&self) -> Tracing {
        if self.0.is_some() {
            Tracing::OpenTelemetry
        } else {
            Tracing::Off
        }
    }

    /// Exports what is left and stops.
    pub(crate) async fn shutdown(self) {
        let Some(provider) = self.0 else { return };
        let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = done {
            tracing::warn!(error = %e, "the last spans may not have been exported");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(vars: &[(&str, &str)], expected: Result<Export, &str>) {
        let got = export_from(|name| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()));
        let expected = expected.map_err(str::to_owned);
        match (&got, &expected) {
            (Err(got), Err(part)) => assert!(got.contains(part.as_str()), "{vars:?}: {got}"),
            _ => assert_eq!(got, expected, "{vars:?}"),
        }
    }

    fn otlp(protocol: Protocol, endpoint: &str) -> Result<Export, &'static str> {
        Ok(Export::Otlp { protocol, endpoint: endpoint.to_owned() })
    }

    #[test]
    fn export_settings() {
        check(&[], Ok(Export::Off));
        check(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")], Ok(Export::Off));
        check(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")],
            otlp(Protocol::HttpBinary, "http://collector:4318"),
        );
        check(
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://tempo:4318/v1/traces")],
            otlp(Protocol::HttpBinary, "https://tempo:4318/v1/traces"),
        );
        check(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")],
            otlp(Protocol::HttpJson, "http://c:4318"),
        );
        check(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ],
            otlp(Protocol::HttpBinary, "http://c:4318"),
        );
        check(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_SDK_DISABLED", "TRUE")], Ok(Export::Off));
        check(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_TRACES_EXPORTER", "none")], Ok(Export::Off));
        check(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")],
            Err("use http/protobuf"),
        );
        check(
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")],
            Err("not \"thrift\""),
        );
        check(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")], Err("must be an http:// or https:// URL"));
    }

    #[test]
    fn credentials_in_an_endpoint_are_not_shown() {
        assert_eq!(endpoint_shown("https://user:secret@collector:4318/v1"), "https://…@collector:4318/v1");
        assert_eq!(endpoint_shown("http://collector:4318/a@b"), "http://collector:4318/a@b");
        assert_eq!(endpoint_shown("http://collector:4318"), "http://collector:4318");
        for endpoint in ["ftp://u:pw@host", "u:pw@host:4318"] {
            let error = export_from(|name| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| endpoint.to_owned()));
            assert!(!error.unwrap_err().contains("pw"), "{endpoint}");
        }
    }
}

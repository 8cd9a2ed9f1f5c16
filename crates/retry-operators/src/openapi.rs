//! The OpenAPI description of the operators' API, served at
//! `/admin/openapi.json`: generated from the routes' annotations and the
//! request and response types of `api`, never written by hand.

use utoipa::{
    openapi::security::{Http, HttpAuthScheme, SecurityScheme},
    Modify, OpenApi,
};

use axum::Json;

use super::{api, handlers};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "billing-bin operators' API",
        description = "Inspect the dead-letter topic, replay records into the retry ladder as jobs, or acknowledge them; \
                       see the listener's brake and lag, and pause or resume it on every instance. \
                       Served on OPERATOR_LISTEN only when ADMIN_TOKEN or ADMIN_TOKEN_FILE is set; every request is audit-logged."
    ),
    paths(
        handlers::list,
        handlers::messages,
        handlers::replay,
        handlers::replay_job,
        handlers::ack,
        handlers::replay_jobs,
        handlers::listener,
        handlers::pause,
        handlers::resume,
        openapi
    ),
    components(schemas(
        api::Problem,
        api::DlqList,
        api::DlqTopic,
        api::DlqPartition,
        api::MessagesPage,
        api::Message,
        api::Content,
        api::Header,
        api::RetryInfo,
        api::AttemptAnswer,
        api::ReplayBody,
        api::ReplayJob,
        api::JobState,
        api::ReplayOutcome,
        api::Skipped,
        api::PartitionOutcome,
        api::AckBody,
        api::AckAnswer,
        api::ReplayJobs,
        api::ListenerAnswer,
        api::BrakeAnswer,
        api::EngagementAnswer,
        api::PauseAnswer,
        api::PauseBody,
        api::ResumeAnswer,
        api::TopicLag,
        api::PartitionLag
    )),
    modifiers(&BearerToken),
    security(("bearer" = []))
)]
struct Document;

/// Every route needs the bearer token.
struct BearerToken;

impl Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The document.
pub(crate) fn document() -> utoipa::openapi::OpenApi {
    let mut document = Document::openapi();
    document.info.version = env!("CARGO_PKG_VERSION").to_owned();
    document
}

#[utoipa::path(get, path = "/admin/openapi.json", tag = "meta", responses((status = 200, description = "this document")))]
/// This document.
pub(crate) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

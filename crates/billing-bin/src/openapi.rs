//! The OpenAPI description of the operators' API, served at
//! `/admin/openapi.json`. Written by hand next to the routes in
//! `operators.rs`; the integration tests check that every route is described.

use serde_json::{json, Value};

use crate::operators::{MAX_PAGE, MAX_REPLAYS};

/// The document.
pub(crate) fn document() -> Value {
    let error = json!({"$ref": "#/components/schemas/Error"});
    let errors = |codes: &[&str]| -> Value {
        let mut m = serde_json::Map::new();
        for code in codes {
            let description = match *code {
                "400" => "malformed parameters or body; the reason is in `error`",
                "401" => "missing or wrong bearer token",
                "404" => "not a dead-letter topic of this service, or no such partition",
                "409" => "a replay of this topic is already running",
                "413" => "request body too large",
                _ => "the broker failed",
            };
            m.insert(
                (*code).into(),
                json!({"description": description, "content": {"application/json": {"schema": error}}}),
            );
        }
        Value::Object(m)
    };
    let with = |mut ok: Value, codes: &[&str]| {
        if let (Some(o), Value::Object(e)) = (ok.as_object_mut(), errors(codes)) {
            o.extend(e);
        }
        ok
    };
    let topic = json!({"name": "topic", "in": "path", "required": true, "schema": {"type": "string"},
                       "description": "the dead-letter topic, e.g. orders.confirmed.dlq"});
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "billing-bin operators' API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Inspect the dead-letter topic, replay records into the retry ladder, or acknowledge them. Enabled only when ADMIN_TOKEN or ADMIN_TOKEN_FILE is set; every action is audit-logged."
        },
        "security": [{"bearer": []}],
        "paths": {
            "/admin/dlq": {"get": {
                "summary": "The service's dead-letter topics with their backlog, end and acknowledged offsets",
                "responses": with(json!({"200": {"description": "status", "content": {"application/json": {"schema": {"type": "object"}}}}}), &["401", "502"])
            }},
            "/admin/dlq/{topic}/messages": {"get": {
                "summary": "One page of dead-lettered records with decoded headers; payloads as text, or base64 when not UTF-8",
                "parameters": [topic,
                    {"name": "partition", "in": "query", "required": true, "schema": {"type": "integer", "minimum": 0}},
                    {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "default": 0}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 20}}],
                "responses": with(json!({"200": {"description": "records and next_offset", "content": {"application/json": {"schema": {"type": "object"}}}}}), &["400", "401", "404", "502"])
            }},
            "/admin/dlq/{topic}/replay": {"post": {
                "summary": "Replay records up to the end offsets captured when the request starts; progress is committed in the operators' group",
                "parameters": [topic,
                    {"name": "target_topic", "in": "query", "required": true, "schema": {"type": "string"},
                     "description": "the source topic, or its first retry topic; any other is refused"}],
                "requestBody": {"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ReplayBody"}}}},
                "responses": with(json!({"200": {"description": "what was replayed", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ReplayReport"}}}}}), &["400", "401", "404", "409", "413", "502"])
            }},
            "/admin/dlq/{topic}/ack": {"post": {
                "summary": "Acknowledge records without replaying them: they stay in the topic for audit and leave the backlog",
                "parameters": [topic],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/AckBody"}}}},
                "responses": with(json!({"200": {"description": "the operators' new position", "content": {"application/json": {"schema": {"type": "object"}}}}}), &["400", "401", "404", "413", "502"])
            }},
            "/admin/openapi.json": {"get": {
                "summary": "This document",
                "responses": with(json!({"200": {"description": "OpenAPI 3.1"}}), &["401"])
            }}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
                "ReplayBody": {"type": "object", "additionalProperties": false, "properties": {
                    "dry_run": {"type": "boolean", "default": false},
                    "limit": {"type": "integer", "minimum": 1},
                    "partition": {"type": "integer", "minimum": 0},
                    "offsets": {"type": "array", "items": {"type": "integer"}},
                    "keys": {"type": "array", "items": {"type": "string"}},
                    "override_loop_guard": {"type": "boolean", "default": false,
                        "description": format!("replay records even if replayed {MAX_REPLAYS} times already")}
                }},
                "ReplayReport": {"type": "object", "properties": {
                    "target_topic": {"type": "string"}, "dry_run": {"type": "boolean"}, "replayed": {"type": "integer"},
                    "skipped": {"type": "array", "items": {"type": "object"}},
                    "covered": {"type": "array", "items": {"type": "object"}}
                }},
                "AckBody": {"type": "object", "additionalProperties": false, "required": ["partition"],
                    "description": "either up_to_offset, or offsets that follow on from the operators' position",
                    "properties": {
                        "partition": {"type": "integer", "minimum": 0},
                        "up_to_offset": {"type": "integer", "minimum": 0},
                        "offsets": {"type": "array", "items": {"type": "integer", "minimum": 0}}
                }}
            }
        }
    })
}

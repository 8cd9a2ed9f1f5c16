//! The operators' console at `/console`: a page, a script and a style
//! sheet compiled into the binary (building needs no Node and no network;
//! the page loads nothing from elsewhere). It is a client of the routes
//! under `/admin`: it holds no authority of its own, so it is served
//! without the token, and every action it takes is an API call, checked
//! and audited as any other.
//!
//! Every answer forbids what the page does not need: scripts only from
//! this origin (no inline script), no framing, no content sniffing, no
//! referrer; the token lives in the tab's `sessionStorage` and travels as
//! a bearer header, never as a cookie, so no other site can act with it.

use axum::{
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
    routing::get,
    Router,
};

const PAGE: &str = include_str!("console/index.html");
pub(crate) const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// The policy of every console answer.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The console's routes (no token needed to load it; the API needs one).
pub(crate) fn routes() -> Router {
    Router::new()
        .route("/console", get(|| async { asset(PAGE, "text/html; charset=utf-8") }))
        .route("/console/", get(|| async { asset(PAGE, "text/html; charset=utf-8") }))
        .route("/console/console.js", get(|| async { asset(SCRIPT, "text/javascript; charset=utf-8") }))
        .route("/console/console.css", get(|| async { asset(STYLE, "text/css; charset=utf-8") }))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, content_type),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

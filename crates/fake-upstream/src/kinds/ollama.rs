//! Ollama (PROTOCOLS.md §3): `GET /` liveness, `/api/tags` (on disk), `/api/ps` (resident, most
//! recently used first), `/v1/models` built from the tags, the `/v1` error envelope with `param`
//! and `code` null, and gin's plain-text 404 for unknown routes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::body::ResponseBody;
use crate::models::Model;
use crate::observer::Outcome;
use crate::reply::{json_response, response};
use crate::state::App;

/// `ErrMaxQueue`, two spaces and all.
pub(crate) const SERVER_BUSY: &str =
    "server busy, please try again.  maximum pending requests exceeded";

/// How long a model stays resident after its last use (`OLLAMA_KEEP_ALIVE`, 5 minutes).
const KEEP_ALIVE: Duration = Duration::from_secs(5 * 60);

/// The model size the listings report.
const SIZE: u64 = 4_920_753_328;

/// The `/v1/*` envelope: `type` from the status, `param` and `code` always null.
pub(crate) fn error_json(status: u16, message: &str) -> Value {
    let error_type = match status {
        400 => "invalid_request_error",
        404 => "not_found_error",
        _ => "api_error",
    };
    json!({"error": {"message": message, "type": error_type, "param": null, "code": null}})
}

pub(crate) fn route(app: &App, req: &Request<Incoming>) -> (Response<ResponseBody>, Outcome) {
    let done = |r| (r, Outcome::Completed);
    let path = req.uri().path();
    match (req.method(), path) {
        (&Method::GET | &Method::HEAD, "/") => done(response(
            200,
            "text/plain; charset=utf-8",
            "Ollama is running",
        )),
        (&Method::GET, "/api/version") => done(json_response(200, &json!({"version": "0.12.0"}))),
        (&Method::GET, "/api/tags") => done(json_response(200, &tags(app))),
        (&Method::GET, "/api/ps") => done(json_response(200, &ps(app))),
        (&Method::GET, "/v1/models") => done(json_response(200, &openai_models(app))),
        (&Method::GET, p) if p.starts_with("/v1/models/") => {
            let name = &p["/v1/models/".len()..];
            match app.registry.get(name) {
                Some(model) => done(json_response(200, &openai_model(app, model))),
                None => (
                    json_response(
                        404,
                        &error_json(404, &format!("model \"{name}\" not found")),
                    ),
                    Outcome::Rejected(404),
                ),
            }
        }
        _ => (
            response(404, "text/plain", "404 page not found"),
            Outcome::Rejected(404),
        ),
    }
}

fn details() -> Value {
    json!({
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "8.0B",
        "quantization_level": "Q4_K_M",
    })
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

fn started(app: &App) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(app.started_unix)
}

/// Every model on disk, resident or not.
fn tags(app: &App) -> Value {
    let models: Vec<Value> = app
        .registry
        .all()
        .iter()
        .map(|m| {
            json!({
                "name": m.name,
                "model": m.name,
                "modified_at": rfc3339(started(app)),
                "size": SIZE,
                "digest": digest(&m.name),
                "details": details(),
            })
        })
        .collect();
    json!({"models": models})
}

/// The resident models, longest remaining keep-alive (most recently used) first.
fn ps(app: &App) -> Value {
    let mut loaded: Vec<&Arc<Model>> = app
        .registry
        .all()
        .iter()
        .filter(|m| m.is_loaded())
        .collect();
    loaded.sort_by_key(|m| std::cmp::Reverse(m.last_used()));
    let now = tokio::time::Instant::now();
    let models: Vec<Value> = loaded
        .into_iter()
        .map(|m| {
            let remaining = (m.last_used() + KEEP_ALIVE).saturating_duration_since(now);
            json!({
                "name": m.name,
                "model": m.name,
                "size": SIZE,
                "digest": digest(&m.name),
                "details": details(),
                "expires_at": rfc3339(SystemTime::now() + remaining),
                "size_vram": SIZE,
                "context_length": app.config.n_ctx,
            })
        })
        .collect();
    json!({"models": models})
}

fn openai_model(app: &App, model: &Model) -> Value {
    json!({"id": model.name, "object": "model", "created": app.started_unix, "owned_by": "library"})
}

/// `/v1/models`: built from the tags, so it says nothing about residency.
fn openai_models(app: &App) -> Value {
    let data: Vec<Value> = app
        .registry
        .all()
        .iter()
        .map(|m| openai_model(app, m))
        .collect();
    json!({"object": "list", "data": data})
}

/// A stable fake digest for a model name.
fn digest(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    format!("{:016x}", hasher.finish()).repeat(4)
}

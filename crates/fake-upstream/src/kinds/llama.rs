//! llama.cpp's `llama-server` (PROTOCOLS.md §1): `{"error":{"code","message","type"}}` with an
//! integer code; `/health`, `/slots`, `/props`, `/metrics`; `/v1/models` with its extra Ollama-
//! style `models` array; and router mode's `/models`, `/models/load`, `/models/unload`, where GET
//! probes name their model with `?model=`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::api::llama as llama_api;
use crate::body::ResponseBody;
use crate::models::{LoadFailed, Model, Residency};
use crate::observer::Outcome;
use crate::openai::Endpoint;
use crate::reply::{Refusal, json_response, query_param, read_json, response, success};
use crate::state::App;

/// The message every running request gets when the unified KV cache overflows.
pub(crate) const CONTEXT_EXCEEDED: &str = "Context size has been exceeded.";

/// llama-server's error `type` for a status (`format_error_response`).
fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        501 => "not_supported_error",
        503 => "unavailable_error",
        _ => "server_error",
    }
}

/// `{"error":{"code":<int>,"message","type"}}`; no `param`.
pub(crate) fn error_json(status: u16, message: &str, error_type_override: Option<&str>) -> Value {
    json!({"error": {
        "code": status,
        "message": message,
        "type": error_type_override.unwrap_or_else(|| error_type(status)),
    }})
}

/// The 400 for a prompt that does not fit a slot's context.
pub(crate) fn context_exceeded(endpoint: Endpoint, prompt: u32, n_ctx: u32) -> Value {
    let message = if matches!(endpoint, Endpoint::Embeddings | Endpoint::Embedding) {
        format!(
            "input ({prompt} tokens) is larger than the max context size ({n_ctx} tokens). skipping"
        )
    } else {
        format!(
            "request ({prompt} tokens) exceeds the available context size ({n_ctx} tokens), \
             try increasing it"
        )
    };
    let mut error = error_json(400, &message, Some("exceed_context_size_error"));
    error["error"]["n_prompt_tokens"] = json!(prompt);
    error["error"]["n_ctx"] = json!(n_ctx);
    error
}

type Reply = (Response<ResponseBody>, Outcome);

fn refused(refusal: &Refusal) -> Reply {
    (
        json_response(
            refusal.status,
            &error_json(refusal.status, &refusal.message, None),
        ),
        Outcome::Rejected(refusal.status),
    )
}

/// The answer to an unknown route.
pub(crate) fn not_found() -> Reply {
    refused(&Refusal::new(404, "File Not Found"))
}

pub(crate) async fn route(app: &App, req: Request<Incoming>) -> Reply {
    let router = app.config.router;
    let path = req.uri().path().to_owned();
    let reply = match (req.method().clone(), path.as_str()) {
        (Method::GET, "/health" | "/v1/health") => json_response(200, &json!({"status": "ok"})),
        (Method::GET, "/models" | "/v1/models") => json_response(
            200,
            &if router {
                router_models(app)
            } else {
                models(app)
            },
        ),
        (Method::GET, "/slots") => return slots(app, &req).await,
        (Method::GET, "/props") if router && query_param(&req, "model").is_none() => {
            if app.router_props_down.load(Ordering::Relaxed) {
                return refused(&Refusal::new(500, "the router's /props is down (fake)"));
            }
            json_response(200, &router_props(app))
        }
        (Method::GET, "/props") => match instance(app, &req).await {
            Ok(model) => json_response(200, &props(app, &model)),
            Err(refusal) => return refused(&refusal),
        },
        (Method::GET, "/metrics") => return metrics(app, &req).await,
        (Method::POST, "/models/load") if router => return load(app, req).await,
        (Method::POST, "/models/unload") if router => return unload(app, req).await,
        (Method::POST, "/tokenize") => {
            let body = read_json(req).await;
            let content = body["content"].as_str().unwrap_or_default();
            let pieces = body["with_pieces"].as_bool().unwrap_or(false);
            json_response(200, &llama_api::tokenize(content, pieces))
        }
        (Method::POST, "/detokenize") => {
            let body = read_json(req).await;
            let tokens = body["tokens"].as_array().cloned().unwrap_or_default();
            json_response(200, &llama_api::detokenize(&tokens))
        }
        (Method::POST, "/apply-template") => {
            let body = read_json(req).await;
            let messages = body["messages"].as_array().cloned().unwrap_or_default();
            json_response(200, &llama_api::apply_template(&messages))
        }
        _ => return not_found(),
    };
    (reply, Outcome::Completed)
}

/// The model instance a GET probe is about: the only one, or the router's `?model=`, loaded on
/// demand like an inference request unless `?autoload=false` (then 400 "model is not loaded"
/// when it is not running: server-models.cpp `is_autoload`, `router_validate_model`).
async fn instance(app: &App, req: &Request<Incoming>) -> Result<Arc<Model>, Refusal> {
    if !app.config.router {
        return Ok(Arc::clone(app.registry.primary()));
    }
    let name = query_param(req, "model")
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Refusal::new(400, "model name is missing from the request"))?;
    let autoload = query_param(req, "autoload")
        .map_or(app.config.autoload, |value| value == "true" || value == "1");
    let model = app.router_model(&name)?;
    if !autoload {
        if !model.residency().is_running() {
            return Err(Refusal::new(400, "model is not loaded"));
        }
        return Ok(model);
    }
    app.registry
        .ensure_loaded(&model)
        .await
        .map_err(|LoadFailed| {
            Refusal::new(500, format!("model name={} failed to load", model.name))
        })?;
    Ok(model)
}

/// The router's own `/props` (no `?model=`): its role, `--models-max` as `max_instances` and
/// whether it autoloads (server-models.cpp `get_router_props`).
fn router_props(app: &App) -> Value {
    json!({
        "role": "router",
        "max_instances": app.registry.models_max(),
        "models_autoload": app.config.autoload,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "build_info": "b0000-fake",
    })
}

async fn slots(app: &App, req: &Request<Incoming>) -> Reply {
    if !app.config.slots_endpoint {
        return refused(&Refusal::new(
            501,
            "This server does not support slots endpoint.",
        ));
    }
    let model = match instance(app, req).await {
        Ok(model) => model,
        Err(refusal) => return refused(&refusal),
    };
    let slots = model.pool.slots();
    let fail_on_no_slot = query_param(req, "fail_on_no_slot").is_some_and(|v| v == "1");
    if fail_on_no_slot && slots.iter().all(|s| s.busy) {
        return refused(&Refusal::new(503, "no slot available"));
    }
    let n_ctx = app.config.n_ctx;
    let array: Vec<Value> = slots
        .iter()
        .enumerate()
        .map(|(id, slot)| {
            let mut entry = json!({
                "id": id,
                "n_ctx": n_ctx,
                "speculative": false,
                "is_processing": slot.busy,
            });
            // These appear only once the slot has had a task (`server_slot::to_json`).
            if let Some(id_task) = slot.id_task {
                entry["id_task"] = json!(id_task);
                entry["n_prompt_tokens"] = json!(slot.n_prompt_tokens);
                entry["n_prompt_tokens_processed"] =
                    json!(slot.n_prompt_tokens.saturating_sub(slot.n_cached));
                entry["n_prompt_tokens_cache"] = json!(slot.n_cached);
                entry["params"] = json!({"n_predict": -1, "stream": false});
                entry["next_token"] = json!([{
                    "has_next_token": slot.busy,
                    "has_new_line": false,
                    "n_remain": -1,
                    "n_decoded": 0,
                }]);
            }
            entry
        })
        .collect();
    (json_response(200, &Value::Array(array)), Outcome::Completed)
}

fn props(app: &App, model: &Model) -> Value {
    json!({
        "default_generation_settings": {
            "id": 0,
            "id_task": -1,
            "n_ctx": app.config.n_ctx,
            "speculative": false,
            "is_processing": false,
            "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95},
            "prompt": "",
        },
        "total_slots": app.config.parallel,
        "model_alias": model.name,
        "model_path": format!("/models/{}.gguf", model.name),
        "modalities": {"vision": false, "video": false, "audio": false},
        "chat_template": "",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "build_info": "b0000-fake",
        "is_sleeping": false,
        "endpoint_slots": app.config.slots_endpoint,
        "endpoint_props": false,
        "endpoint_metrics": app.config.metrics,
    })
}

/// `/v1/models` of a single-model server: exactly one element, plus the Ollama-style `models`.
fn models(app: &App) -> Value {
    let name = &app.registry.primary().name;
    json!({
        "object": "list",
        "models": [{
            "name": name,
            "model": name,
            "modified_at": "",
            "size": "",
            "digest": "",
            "type": "model",
            "description": "",
            "tags": [""],
            "capabilities": ["completion"],
            "parameters": "",
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": "",
                "families": [""],
                "parameter_size": "",
                "quantization_level": "",
            },
        }],
        "data": [{
            "id": name,
            "aliases": [name],
            "tags": [],
            "object": "model",
            "created": app.started_unix,
            "owned_by": "llamacpp",
            "meta": {
                "vocab_type": 2,
                "n_vocab": 128_256,
                "n_ctx_train": 131_072,
                "n_ctx": u64::from(app.config.n_ctx) * app.config.parallel as u64,
                "n_embd": 4096,
                "n_params": 8_030_261_312_u64,
                "size": 4_912_898_304_u64,
            },
        }],
    })
}

/// The router's `/models`: every known model with its `status`.
fn router_models(app: &App) -> Value {
    let data: Vec<Value> = app
        .registry
        .all()
        .iter()
        .map(|m| {
            let residency = m.residency();
            let mut status = json!({"value": residency.as_str()});
            if residency != Residency::Unloaded {
                status["args"] = json!(["llama-server", "-ctx", app.config.n_ctx.to_string()]);
            }
            if residency == Residency::Unloaded && m.failed() {
                status["failed"] = json!(true);
                status["exit_code"] = json!(1);
            }
            json!({
                "id": m.name,
                "aliases": [],
                "tags": [],
                "object": "model",
                "owned_by": "llamacpp",
                "created": app.started_unix,
                "source": "cache",
                "can_remove": true,
                "architecture": {"input_modalities": ["text"], "output_modalities": ["text"]},
                "status": status,
            })
        })
        .collect();
    json!({"object": "list", "data": data})
}

async fn load(app: &App, req: Request<Incoming>) -> Reply {
    // The router answers an unknown model with 404 on load, but 400 on unload.
    let model = match named_model(app, req, 404).await {
        Ok(model) => model,
        Err(reply) => return reply,
    };
    if model.residency().is_running() {
        return refused(&Refusal::new(400, "model is already running"));
    }
    // Every `--models-max` place held by a busy model: the router refuses rather than queue
    // (server-models.cpp `load`: "model limit reached, try again later").
    if !app.registry.start_load(&model) {
        return refused(&Refusal::new(500, "model limit reached, try again later"));
    }
    (json_response(200, &success()), Outcome::Completed)
}

async fn unload(app: &App, req: Request<Incoming>) -> Reply {
    let model = match named_model(app, req, 400).await {
        Ok(model) => model,
        Err(reply) => return reply,
    };
    if !model.unload() {
        return refused(&Refusal::new(400, "model is not running"));
    }
    (json_response(200, &success()), Outcome::Completed)
}

/// The model a `/models/load` or `/models/unload` body names, or the router's refusal.
async fn named_model(
    app: &App,
    req: Request<Incoming>,
    unknown_status: u16,
) -> Result<Arc<Model>, Reply> {
    let body = read_json(req).await;
    let Some(name) = body.get("model").and_then(Value::as_str) else {
        return Err(refused(&Refusal::new(
            400,
            "model name is missing from the request",
        )));
    };
    app.registry
        .get(name)
        .cloned()
        .ok_or_else(|| refused(&Refusal::new(unknown_status, "model is not found")))
}

async fn metrics(app: &App, req: &Request<Incoming>) -> Reply {
    if !app.config.metrics {
        return refused(&Refusal::new(
            501,
            "This server does not support metrics endpoint. Start it with `--metrics`",
        ));
    }
    let model = match instance(app, req).await {
        Ok(model) => model,
        Err(refusal) => return refused(&refusal),
    };
    let mut reply = response(200, "text/plain; version=0.0.4", metrics_text(&model));
    reply.headers_mut().insert(
        "process-start-time-unix",
        app.started_unix
            .to_string()
            .parse()
            .expect("digits are a valid header"),
    );
    (reply, Outcome::Completed)
}

/// llama-server's metrics text (`server_task_result_metrics::to_metrics`). Written by hand: the
/// exact `llamacpp:` names and the absence of `OpenMetrics` decorations are the point.
fn metrics_text(model: &Model) -> String {
    let pool = &model.pool;
    let (requests, prompt, predicted) = pool.totals();
    let cached = pool.cached_total();
    let rows: [(&str, &str, &str, u64); 11] = [
        (
            "prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed, excluding cached tokens",
            prompt.saturating_sub(cached),
        ),
        (
            "prompt_tokens_cached_total",
            "counter",
            "Number of prompt tokens reused from the cache",
            cached,
        ),
        ("prompt_seconds_total", "counter", "Prompt process time", 0),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            predicted,
        ),
        (
            "tokens_predicted_seconds_total",
            "counter",
            "Predict process time",
            0,
        ),
        (
            "n_decode_total",
            "counter",
            "Total number of llama_decode() calls",
            requests,
        ),
        ("n_tokens_max", "counter", "Largest observed n_tokens.", 0),
        (
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            0,
        ),
        (
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            0,
        ),
        (
            "requests_processing",
            "gauge",
            "Number of requests processing.",
            pool.running() as u64,
        ),
        (
            "requests_deferred",
            "gauge",
            "Number of requests deferred.",
            pool.waiting() as u64,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, value) in rows {
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"
        );
    }
    out
}

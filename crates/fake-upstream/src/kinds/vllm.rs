//! vLLM's OpenAI-compatible server (PROTOCOLS.md §2): `/health` with an empty body, `/v1/models`
//! with `max_model_len`, Prometheus `/metrics` labelled `{model_name,engine}`, Python-style error
//! types, and `FastAPI`'s `{"detail":"Not Found"}` for unknown routes.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::api::llama as llama_api;
use crate::body::ResponseBody;
use crate::observer::Outcome;
use crate::reply::{json_response, read_json, response};
use crate::state::App;

/// vLLM's error `type` for a status: the name of the Python exception.
fn error_type(status: u16) -> &'static str {
    match status {
        404 => "NotFoundError",
        501 => "NotImplementedError",
        503 => "ServiceUnavailableError",
        400..=499 => "BadRequestError",
        _ => "InternalServerError",
    }
}

/// `{"error":{"message","type","param","code"}}` with an integer `code` (v0.10.1+).
pub(crate) fn error_json(status: u16, message: &str, param: Option<&str>) -> Value {
    json!({"error": {
        "message": message,
        "type": error_type(status),
        "param": param,
        "code": status,
    }})
}

/// `FastAPI`'s answer to an unknown route.
pub(crate) fn not_found() -> (Response<ResponseBody>, Outcome) {
    (
        json_response(404, &json!({"detail": "Not Found"})),
        Outcome::Rejected(404),
    )
}

pub(crate) async fn route(app: &App, req: Request<Incoming>) -> (Response<ResponseBody>, Outcome) {
    let done = |r| (r, Outcome::Completed);
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/tokenize") => {
            let body = read_json(req).await;
            let text = body["prompt"]
                .as_str()
                .map_or_else(|| body["messages"].to_string(), str::to_owned);
            let tokens = llama_api::tokenize(&text, false)["tokens"].clone();
            let count = tokens.as_array().map_or(0, Vec::len);
            done(json_response(
                200,
                &json!({"count": count, "max_model_len": app.config.n_ctx,
                        "tokens": tokens, "token_strs": null}),
            ))
        }
        (&Method::POST, "/detokenize") => {
            let body = read_json(req).await;
            let tokens = body["tokens"].as_array().cloned().unwrap_or_default();
            let prompt = llama_api::detokenize(&tokens)["content"].clone();
            done(json_response(200, &json!({"prompt": prompt})))
        }
        // `EngineDeadError` is the only thing that makes vLLM's health check fail.
        (&Method::GET, "/health") if app.unhealthy.load(Ordering::Relaxed) => {
            (response(503, "application/json", ""), Outcome::Completed)
        }
        (&Method::GET, "/health") => done(response(200, "application/json", "")),
        (&Method::GET, "/v1/models") => done(json_response(200, &models(app))),
        (&Method::GET, "/metrics") if app.config.metrics => done(response(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics(app),
        )),
        (&Method::GET, "/version") => done(json_response(200, &json!({"version": "0.11.0"}))),
        _ => not_found(),
    }
}

/// The base model card, then one card per `LoRA` adapter with `parent` set.
fn models(app: &App) -> Value {
    let models = app.registry.all();
    let base = &models[0].name;
    let data: Vec<Value> = models
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let adapter = i > 0;
            json!({
                "id": m.name,
                "object": "model",
                "created": app.started_unix,
                "owned_by": "vllm",
                "root": format!("/models/{}", m.name),
                "parent": if adapter { json!(base) } else { Value::Null },
                "max_model_len": if adapter { Value::Null } else { json!(app.config.n_ctx) },
                "permission": [{
                    "id": format!("modelperm-fake{i}"),
                    "object": "model_permission",
                    "created": app.started_unix,
                    "allow_create_engine": false,
                    "allow_sampling": true,
                    "allow_logprobs": true,
                    "allow_search_indices": false,
                    "allow_view": true,
                    "allow_fine_tuning": false,
                    "organization": "*",
                    "group": null,
                    "is_blocking": false,
                }],
            })
        })
        .collect();
    json!({"object": "list", "data": data})
}

/// The Prometheus text vLLM's `prometheus_client` writes. Written by hand on purpose: the point
/// is to reproduce vLLM's exact names, label order and float formatting (`2.0`), which a metrics
/// library would normalise.
fn metrics(app: &App) -> String {
    let model = app.registry.primary();
    let pool = &model.pool;
    let labels = format!("{{model_name=\"{}\",engine=\"0\"}}", model.name);
    let (_, prompt, generated) = pool.totals();
    let cached = pool.cached_total();
    #[allow(clippy::cast_precision_loss)] // slot counts are small
    let usage = pool.running() as f64 / pool.parallel() as f64;
    #[allow(clippy::cast_precision_loss)]
    let gauges = [
        (
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            "gauge",
            pool.running() as f64,
        ),
        (
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            "gauge",
            pool.waiting() as f64,
        ),
        (
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            "gauge",
            usage,
        ),
        (
            "vllm:prompt_tokens_total",
            "Number of prefill tokens processed.",
            "counter",
            prompt as f64,
        ),
        (
            "vllm:prefix_cache_queries_total",
            "Prefix cache queries, in terms of number of queried tokens.",
            "counter",
            prompt as f64,
        ),
        (
            "vllm:prefix_cache_hits_total",
            "Prefix cache hits, in terms of number of cached tokens.",
            "counter",
            cached as f64,
        ),
        (
            "vllm:generation_tokens_total",
            "Number of generation tokens processed.",
            "counter",
            generated as f64,
        ),
    ];
    let mut out = String::new();
    for (name, help, kind, value) in gauges {
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{labels} {value:?}\n"
        );
    }
    out
}

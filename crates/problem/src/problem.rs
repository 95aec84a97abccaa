//! The [`Problem`] document: its fields, accessors, builder methods and JSON form.

use std::fmt;
use std::time::Duration;

use http::{Method, StatusCode};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use crate::{Dialect, Kind};

/// Member names the document itself writes; an extension may not take them.
pub(crate) const RESERVED: [&str; 7] = [
    "type",
    "title",
    "status",
    "detail",
    "instance",
    "retry_after",
    "error",
];

/// An RFC 9457 problem document for one failed request.
///
/// Build one with a constructor per problem type ([`Problem::queue_full`],
/// [`Problem::model_not_found`], …, listed under [`Kind`]), refine it with the `with_*`
/// methods, then send it with [`to_response`](Problem::to_response).
///
/// The JSON form has, in this order:
///
/// | member | from |
/// |---|---|
/// | `type` | [`Kind::type_uri`], a stable URI under [`BASE_URI`](crate::BASE_URI) |
/// | `title` | [`Kind::title`], fixed per type |
/// | `status` | [`Kind::status`], the same code as the HTTP response |
/// | `detail` | this occurrence, when set |
/// | `instance` | a URI reference for this occurrence, when set |
/// | extensions | e.g. `upstream`, `model`, set by the constructors or [`with_extension`](Problem::with_extension) |
/// | `retry_after` | whole seconds, the same value as the `Retry-After` header, when set |
/// | `error` | always: `{"message", "type", "param", "code"}`, the OpenAI-compatible error shape |
///
/// The `error` member is what OpenAI-compatible SDKs read: their exceptions carry its `message`,
/// `type`, `param` and `code`, so a client using them sees why the gateway refused the request
/// and what to do, not a bare status code.
///
/// # Example
///
/// ```
/// use slotgate_problem::{Kind, Problem};
///
/// let problem = Problem::model_not_found("llama-9000").with_instance("urn:uuid:0f6b…");
/// assert_eq!(problem.kind(), Kind::ModelNotFound);
/// assert_eq!(problem.status(), 404);
///
/// let json: serde_json::Value = serde_json::from_slice(&problem.to_json_bytes()).unwrap();
/// assert_eq!(json["type"], "https://slotgate.dev/problems/model-not-found");
/// assert_eq!(json["model"], "llama-9000");
/// assert_eq!(json["error"]["param"], "model");
/// assert_eq!(json["error"]["code"], "model_not_found");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    kind: Kind,
    detail: Option<String>,
    instance: Option<String>,
    extensions: Map<String, Value>,
    retry_after: Option<Duration>,
    /// `error.message`: what happened and what to do next.
    message: String,
    /// `error.param`: the request field at fault, if one is.
    param: Option<String>,
    /// Methods for the `Allow` header of a 405; unused by other kinds.
    pub(crate) allow: Vec<Method>,
}

// === impl Problem: construction and builders ===

impl Problem {
    /// A document of `kind` whose `error.message` is `message`. The constructors in
    /// `constructors.rs` are the only callers, so every kind gets a message written for it.
    pub(crate) fn new(kind: Kind, message: String) -> Self {
        Self {
            kind,
            detail: None,
            instance: None,
            extensions: Map::new(),
            retry_after: None,
            message,
            param: None,
            allow: Vec::new(),
        }
    }

    /// Sets `detail`: an explanation of this occurrence, for a human. Clients should not parse
    /// it; anything a program needs belongs in an extension member.
    #[must_use]
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }

    /// Sets `instance`: a URI reference that identifies this occurrence, for example
    /// `urn:uuid:<request id>`, so a client report can be matched with the gateway's logs.
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = Some(instance.into());
        self
    }

    /// Adds (or replaces) the extension member `name`.
    ///
    /// `name` should follow RFC 9457 §3.2: at least three characters, letters, digits and `_`,
    /// starting with a letter (see [`is_valid_extension_name`](crate::is_valid_extension_name)),
    /// and must not be one of the names the document writes itself (`type`, `title`, `status`,
    /// `detail`, `instance`, `retry_after`, `error`).
    ///
    /// Names are meant to be literals in the gateway's code, so a bad one is a bug: debug
    /// builds panic on it. Release builds never panic: they drop a member whose name is
    /// reserved (it would duplicate a key of the document) and keep one whose name merely
    /// breaks the RFC's recommendation (the JSON is still valid, and consumers must ignore
    /// members they do not know).
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let problem = Problem::internal().with_extension("request_id", "7f3a");
    /// assert_eq!(problem.extension("request_id"), Some(&"7f3a".into()));
    /// ```
    #[must_use]
    pub fn with_extension(mut self, name: impl Into<String>, value: impl Into<Value>) -> Self {
        let name = name.into();
        let reserved = RESERVED.contains(&name.as_str());
        debug_assert!(
            !reserved,
            "extension member `{name}` would overwrite a member of the problem document"
        );
        debug_assert!(
            crate::is_valid_extension_name(&name),
            "extension member `{name}` does not follow RFC 9457 §3.2 naming"
        );
        if !reserved {
            self.extensions.insert(name, value.into());
        }
        self
    }

    /// Sets how long the client should wait before retrying: sent as the `Retry-After` header
    /// and the `retry_after` member, in whole seconds rounded up, at least 1.
    ///
    /// The retryable constructors ([`queue_full`](Problem::queue_full),
    /// [`queue_timeout`](Problem::queue_timeout),
    /// [`upstream_unavailable`](Problem::upstream_unavailable),
    /// [`shutting_down`](Problem::shutting_down)) already set it; this replaces the value.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// Sets `error.param`: the request field at fault (for example `model` or
    /// `messages`), when there is one.
    #[must_use]
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Adds an extension member the constructors know to be valid.
    pub(crate) fn ext(mut self, name: &'static str, value: impl Into<Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }
}

// === impl Problem: accessors ===

impl Problem {
    /// The problem type.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The `type` member: a stable URI that identifies the problem type.
    pub fn type_uri(&self) -> &'static str {
        self.kind.type_uri()
    }

    /// The `title` member, fixed per problem type.
    pub fn title(&self) -> &'static str {
        self.kind.title()
    }

    /// The HTTP status, also the `status` member.
    pub fn status(&self) -> StatusCode {
        self.kind.status()
    }

    /// The `detail` member, if set.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// The `instance` member, if set.
    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    /// All extension members except `retry_after` and `error`, which the document derives
    /// from [`retry_after`](Problem::retry_after) and the `error` fields.
    pub fn extensions(&self) -> &Map<String, Value> {
        &self.extensions
    }

    /// One extension member, if present.
    pub fn extension(&self, name: &str) -> Option<&Value> {
        self.extensions.get(name)
    }

    /// How long the client should wait before retrying, exactly as given (the header rounds it
    /// up to whole seconds).
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The value of the `Retry-After` header and the `retry_after` member: whole seconds,
    /// rounded up so the client never comes back too early, and at least 1 so that "retry
    /// now" is never advertised to a crowd of clients at once.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(retry_secs)
    }

    /// The `error.message`: what happened and what to do next.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The `error.param`, if set.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }
}

/// Whole seconds, rounded up, at least 1: the `Retry-After` rule, shared with the messages so
/// that "Retry in N s" and the header always agree.
pub(crate) fn retry_secs(d: Duration) -> u64 {
    let up = u64::from(d.subsec_nanos() > 0);
    d.as_secs().saturating_add(up).max(1)
}

// === impl Serialize ===

/// The OpenAI-compatible `error` object, borrowed from the problem for serialisation.
#[derive(serde::Serialize)]
pub(crate) struct OpenAiError<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: &'static str,
}

impl<'a> OpenAiError<'a> {
    /// The object for `problem`.
    pub(crate) fn of(problem: &'a Problem) -> Self {
        Self {
            message: &problem.message,
            kind: problem.kind.openai_type(),
            param: problem.param.as_deref(),
            code: problem.kind.code(),
        }
    }
}

/// A problem serialised with the `error` member of a [`Dialect`], or without one (`None`: the
/// document nested in Anthropic's error event, which carries the error beside it).
pub(crate) struct InDialect<'a> {
    pub(crate) problem: &'a Problem,
    pub(crate) dialect: Option<Dialect>,
}

impl Serialize for InDialect<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let p = self.problem;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", p.type_uri())?;
        map.serialize_entry("title", p.title())?;
        map.serialize_entry("status", &p.status().as_u16())?;
        if let Some(detail) = &p.detail {
            map.serialize_entry("detail", detail)?;
        }
        if let Some(instance) = &p.instance {
            map.serialize_entry("instance", instance)?;
        }
        // `with_extension` keeps reserved names out, so no key is written twice.
        for (name, value) in &p.extensions {
            map.serialize_entry(name, value)?;
        }
        if let Some(secs) = p.retry_after_secs() {
            map.serialize_entry("retry_after", &secs)?;
        }
        match self.dialect {
            None => {}
            // The common case writes its borrowed object without building a `Value`.
            Some(Dialect::OpenAi) => map.serialize_entry("error", &OpenAiError::of(p))?,
            Some(other) => map.serialize_entry("error", &p.error_member(other))?,
        }
        map.end()
    }
}

/// The problem document with OpenAI's `error` member (the [`Dialect::OpenAi`] form).
impl Serialize for Problem {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        InDialect {
            problem: self,
            dialect: Some(Dialect::OpenAi),
        }
        .serialize(serializer)
    }
}

// === impl Display, Error ===

/// `503 queue-full: <detail or title>`, for logs.
impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = self.detail.as_deref().unwrap_or(self.title());
        write!(f, "{} {}: {what}", self.status().as_u16(), self.kind.slug())
    }
}

/// A `Problem` is the error half of the gateway's request handlers: `Result<_, Problem>`
/// converts to a response in one place.
impl std::error::Error for Problem {}

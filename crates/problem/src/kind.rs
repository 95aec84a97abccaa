//! The closed list of problem types the gateway emits: one table, from which the slugs, type
//! URIs, titles, statuses and `error` member fields are all generated, so they cannot drift apart.

use http::StatusCode;

/// The literal behind [`BASE_URI`], as a macro so `concat!` can build each type URI at compile
/// time.
macro_rules! base_uri {
    () => {
        "https://slotgate.dev/problems/"
    };
}

/// The prefix of every problem `type` URI: `type` is this followed by the [slug].
///
/// The URIs are stable identifiers: clients may match on them, so a slug is never renamed or
/// reused. Each one is documented in `docs/problems.md`.
pub const BASE_URI: &str = base_uri!();

/// Generates [`Kind`], its table-driven methods and the [`slug`] constants.
macro_rules! kinds {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident {
            slug: $slug_const:ident = $slug:literal,
            status: $status:ident,
            title: $title:literal,
            code: $code:literal,
            openai_type: $openai_type:literal $(,)?
        }
    )*) => {
        /// The slug of every problem type: the last segment of its `type` URI (after
        /// [`BASE_URI`](crate::BASE_URI)). Stable: never renamed, never reused.
        pub mod slug {
            $(
                #[doc = concat!("`", $slug, "`: see [`Kind::", stringify!($variant), "`](crate::Kind::", stringify!($variant), ").")]
                pub const $slug_const: &str = $slug;
            )*
        }

        /// A problem type the gateway emits.
        ///
        /// Each kind fixes the document's `type` URI, `title` and `status`, and the `type` and
        /// `code` of its OpenAI-style `error` member. New kinds may be added (the enum is
        /// `#[non_exhaustive]`); existing ones never change meaning.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Kind {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Kind {
            /// Every kind, in the order of `docs/problems.md`.
            pub const ALL: &'static [Self] = &[$(Self::$variant),*];

            /// The last segment of the `type` URI, e.g. `queue-full`.
            #[must_use]
            pub const fn slug(self) -> &'static str {
                match self { $(Self::$variant => $slug,)* }
            }

            /// The `type` URI: [`BASE_URI`] followed by the slug.
            #[must_use]
            pub const fn type_uri(self) -> &'static str {
                match self { $(Self::$variant => concat!(base_uri!(), $slug),)* }
            }

            /// The fixed `title`: a short summary that does not change between occurrences.
            #[must_use]
            pub const fn title(self) -> &'static str {
                match self { $(Self::$variant => $title,)* }
            }

            /// The HTTP status, used both for the response and the `status` member.
            #[must_use]
            pub const fn status(self) -> StatusCode {
                match self { $(Self::$variant => StatusCode::$status,)* }
            }

            /// The `error.code`: the slug with `_` for `-`, e.g. `queue_full`.
            #[must_use]
            pub const fn code(self) -> &'static str {
                match self { $(Self::$variant => $code,)* }
            }

            /// The `error.type`: `invalid_request_error` for mistakes in the request,
            /// `authentication_error` for a bad key, `server_error` for everything on the
            /// gateway's or the upstream's side.
            #[must_use]
            pub const fn openai_type(self) -> &'static str {
                match self { $(Self::$variant => $openai_type,)* }
            }
        }
    };
}

kinds! {
    /// Every slot and every queue place of the model is taken on every host that could serve
    /// it, so the request was refused at once instead of waiting (503, with `Retry-After`).
    QueueFull {
        slug: QUEUE_FULL = "queue-full",
        status: SERVICE_UNAVAILABLE,
        title: "Queue full",
        code: "queue_full",
        openai_type: "server_error",
    }
    /// The request waited in the queue for the model's `queue_timeout` without getting a slot;
    /// it never reached the upstream (503, with `Retry-After`).
    QueueTimeout {
        slug: QUEUE_TIMEOUT = "queue-timeout",
        status: SERVICE_UNAVAILABLE,
        title: "Queue wait timed out",
        code: "queue_timeout",
        openai_type: "server_error",
    }
    /// No upstream is configured for the requested model name or alias (404).
    ModelNotFound {
        slug: MODEL_NOT_FOUND = "model-not-found",
        status: NOT_FOUND,
        title: "Model not found",
        code: "model_not_found",
        openai_type: "invalid_request_error",
    }
    /// The path is not a route of the gateway (404).
    NotFound {
        slug: NOT_FOUND = "not-found",
        status: NOT_FOUND,
        title: "Not found",
        code: "not_found",
        openai_type: "invalid_request_error",
    }
    /// The route exists but not for this method (405, with `Allow`).
    MethodNotAllowed {
        slug: METHOD_NOT_ALLOWED = "method-not-allowed",
        status: METHOD_NOT_ALLOWED,
        title: "Method not allowed",
        code: "method_not_allowed",
        openai_type: "invalid_request_error",
    }
    /// Upstreams serve the model, but none of them is of a kind that serves the route: for
    /// example `/api/chat` for a model only a `llama-server` serves (404).
    RouteNotServed {
        slug: ROUTE_NOT_SERVED = "route-not-served",
        status: NOT_FOUND,
        title: "Route not served for this model",
        code: "route_not_served",
        openai_type: "invalid_request_error",
    }
    /// The route changes an engine's disk (Ollama's `/api/pull`, `/api/push`, `/api/create`,
    /// `/api/delete`, `/api/copy`) and no upstream serving the model allows it (403).
    RouteDisabled {
        slug: ROUTE_DISABLED = "route-disabled",
        status: FORBIDDEN,
        title: "Route disabled",
        code: "route_disabled",
        openai_type: "invalid_request_error",
    }
    /// A Responses follow-up (`previous_response_id`, or a look-up by id) names a response this
    /// gateway did not pass on, or has forgotten (`response_affinity_ttl`,
    /// `response_affinity_entries`), or that was deleted (404).
    ResponseNotFound {
        slug: RESPONSE_NOT_FOUND = "response-not-found",
        status: NOT_FOUND,
        title: "Response not found",
        code: "response_not_found",
        openai_type: "invalid_request_error",
    }
    /// The upstream that holds the response a follow-up names is down, draining or no longer
    /// serves the model; the follow-up is not sent to another host, which would not know the
    /// conversation (503, with `Retry-After`).
    ResponseUpstreamUnavailable {
        slug: RESPONSE_UPSTREAM_UNAVAILABLE = "response-upstream-unavailable",
        status: SERVICE_UNAVAILABLE,
        title: "Upstream of the response unavailable",
        code: "response_upstream_unavailable",
        openai_type: "server_error",
    }
    /// The request body is not what the endpoint needs: not JSON, not an object, or `model`
    /// missing or not a string (400).
    BadRequest {
        slug: BAD_REQUEST = "bad-request",
        status: BAD_REQUEST,
        title: "Invalid request body",
        code: "bad_request",
        openai_type: "invalid_request_error",
    }
    /// The request body is larger than the gateway's limit (413).
    BodyTooLarge {
        slug: BODY_TOO_LARGE = "body-too-large",
        status: PAYLOAD_TOO_LARGE,
        title: "Request body too large",
        code: "body_too_large",
        openai_type: "invalid_request_error",
    }
    /// The request body is not declared as JSON (415).
    UnsupportedMediaType {
        slug: UNSUPPORTED_MEDIA_TYPE = "unsupported-media-type",
        status: UNSUPPORTED_MEDIA_TYPE,
        title: "Unsupported media type",
        code: "unsupported_media_type",
        openai_type: "invalid_request_error",
    }
    /// The client did not send the whole request body within the gateway's
    /// `body_read_timeout` (408). Nothing was forwarded.
    BodyTimeout {
        slug: BODY_TIMEOUT = "body-timeout",
        status: REQUEST_TIMEOUT,
        title: "Request body timed out",
        code: "body_timeout",
        openai_type: "invalid_request_error",
    }
    /// API keys are configured and the request has none, or one that is not accepted (401,
    /// with `WWW-Authenticate: Bearer`).
    Unauthorized {
        slug: UNAUTHORIZED = "unauthorized",
        status: UNAUTHORIZED,
        title: "Unauthorized",
        code: "unauthorized",
        openai_type: "authentication_error",
    }
    /// No upstream that serves the model can take the request: none is healthy and not
    /// draining, or every one refused the connection before the request was sent (503, with
    /// `Retry-After`).
    ///
    /// 503 rather than 502 because nothing was received from an upstream: the service is
    /// temporarily unable to serve, which is what 503 means (RFC 9110 §15.6.4), and like the
    /// other 503s it tells the client when to come back. 502 is kept for an upstream that did
    /// answer, wrongly ([`Kind::UpstreamBadResponse`]).
    UpstreamUnavailable {
        slug: UPSTREAM_UNAVAILABLE = "upstream-unavailable",
        status: SERVICE_UNAVAILABLE,
        title: "Upstream unavailable",
        code: "upstream_unavailable",
        openai_type: "server_error",
    }
    /// The upstream accepted the request but sent no response headers in time (504).
    UpstreamTimeout {
        slug: UPSTREAM_TIMEOUT = "upstream-timeout",
        status: GATEWAY_TIMEOUT,
        title: "Upstream timed out",
        code: "upstream_timeout",
        openai_type: "server_error",
    }
    /// The upstream answered with something that is not a valid HTTP response, or closed the
    /// connection before the response headers (502).
    UpstreamBadResponse {
        slug: UPSTREAM_BAD_RESPONSE = "upstream-bad-response",
        status: BAD_GATEWAY,
        title: "Bad response from upstream",
        code: "upstream_bad_response",
        openai_type: "server_error",
    }
    /// The gateway is buffering as many request bodies as its `max_buffered_body_bytes` allows,
    /// so it refused this one at once instead of running out of memory; nothing was forwarded
    /// (503, with `Retry-After`).
    Overloaded {
        slug: OVERLOADED = "overloaded",
        status: SERVICE_UNAVAILABLE,
        title: "Gateway overloaded",
        code: "overloaded",
        openai_type: "server_error",
    }
    /// The shared slot store of `[cluster]` (Redis) cannot be reached and the policy is
    /// `on_store_down = "fail-closed"`: the request was refused rather than risk running more
    /// than the cap across the gateway's replicas; nothing was forwarded (503, with
    /// `Retry-After`).
    StoreUnavailable {
        slug: STORE_UNAVAILABLE = "store-unavailable",
        status: SERVICE_UNAVAILABLE,
        title: "Slot store unavailable",
        code: "store_unavailable",
        openai_type: "server_error",
    }
    /// The upstream's answer had begun but then stopped: no data for the upstream's
    /// `stream_idle_timeout`, or the connection failed mid-answer. It is only seen as the
    /// `error` event that ends a streamed answer, or as a 504 before a non-streamed one began.
    UpstreamStalled {
        slug: UPSTREAM_STALLED = "upstream-stalled",
        status: GATEWAY_TIMEOUT,
        title: "Upstream stopped mid-answer",
        code: "upstream_stalled",
        openai_type: "server_error",
    }
    /// The upstream's answer was still going at the upstream's `stream_timeout`, so the gateway
    /// ended it. Like [`Kind::UpstreamStalled`], only seen as the `error` event that ends a
    /// streamed answer.
    StreamTimeout {
        slug: STREAM_TIMEOUT = "stream-timeout",
        status: GATEWAY_TIMEOUT,
        title: "Answer took too long",
        code: "stream_timeout",
        openai_type: "server_error",
    }
    /// The HTTP/1 request head did not parse (400). hyper refuses such a head before the gateway
    /// has a request; the gateway puts this document in its place.
    MalformedRequest {
        slug: MALFORMED_REQUEST = "malformed-request",
        status: BAD_REQUEST,
        title: "Malformed request",
        code: "malformed_request",
        openai_type: "invalid_request_error",
    }
    /// The HTTP/1 request target is longer than hyper accepts (414).
    UriTooLong {
        slug: URI_TOO_LONG = "uri-too-long",
        status: URI_TOO_LONG,
        title: "URI too long",
        code: "uri_too_long",
        openai_type: "invalid_request_error",
    }
    /// The HTTP/1 request head has too many header fields, or is too large (431).
    HeadersTooLarge {
        slug: HEADERS_TOO_LARGE = "headers-too-large",
        status: REQUEST_HEADER_FIELDS_TOO_LARGE,
        title: "Request headers too large",
        code: "headers_too_large",
        openai_type: "invalid_request_error",
    }
    /// The gateway is shutting down (SIGTERM or drain) and takes no new requests; in-flight
    /// ones finish (503, with `Retry-After`).
    ShuttingDown {
        slug: SHUTTING_DOWN = "shutting-down",
        status: SERVICE_UNAVAILABLE,
        title: "Gateway shutting down",
        code: "shutting_down",
        openai_type: "server_error",
    }
    /// The admin API was asked to reload the configuration, but the gateway was started from a
    /// configuration in memory, not a file: there is nothing to read again (409).
    ReloadUnavailable {
        slug: RELOAD_UNAVAILABLE = "reload-unavailable",
        status: CONFLICT,
        title: "Reload not possible",
        code: "reload_unavailable",
        openai_type: "invalid_request_error",
    }
    /// The admin API was asked to reload the configuration, and the file cannot be put in force:
    /// unreadable, unparsable or breaking rules. The configuration in force stays (422).
    ConfigRefused {
        slug: CONFIG_REFUSED = "config-refused",
        status: UNPROCESSABLE_ENTITY,
        title: "Configuration refused",
        code: "config_refused",
        openai_type: "invalid_request_error",
    }
    /// A bug: a case the gateway believed unreachable. It is still answered with a problem
    /// document, never a bare 500 (500).
    Internal {
        slug: INTERNAL = "internal",
        status: INTERNAL_SERVER_ERROR,
        title: "Internal gateway error",
        code: "internal",
        openai_type: "server_error",
    }
}

impl Kind {
    /// The kind whose [`type_uri`](Kind::type_uri) is `uri`, for clients and tests that read a
    /// problem document back.
    ///
    /// ```
    /// use slotgate_problem::Kind;
    ///
    /// let uri = "https://slotgate.dev/problems/queue-full";
    /// assert_eq!(Kind::from_type_uri(uri), Some(Kind::QueueFull));
    /// assert_eq!(Kind::from_type_uri("about:blank"), None);
    /// ```
    #[must_use]
    pub fn from_type_uri(uri: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.type_uri() == uri)
    }
}

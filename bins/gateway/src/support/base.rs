//! Where an upstream lives: the one parsed form of an upstream URL, shared by the request path
//! ([`proxy::forward`](crate::proxy::forward)) and the probes
//! ([`upstreams::probe`](crate::upstreams::probe)).

use http::HeaderValue;
use http::uri::{Authority, InvalidUri, PathAndQuery, Scheme, Uri};

/// Why an upstream URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BaseError {
    /// Not a URI at all.
    #[error("invalid URL {url:?}")]
    Invalid {
        /// The URL as written.
        url: String,
        /// Why.
        #[source]
        source: InvalidUri,
    },
    /// No `http://` or `https://`.
    #[error("the URL has no scheme")]
    NoScheme,
    /// Neither `http` nor `https`.
    #[error("unsupported scheme {0} (http or https)")]
    Scheme(Scheme),
    /// No host.
    #[error("the URL has no host")]
    NoHost,
    /// The host cannot be written in a `Host` field.
    #[error("the URL's host cannot be sent as a Host header")]
    Host(#[source] http::Error),
}

/// Where an upstream lives: scheme, authority and an optional path prefix.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    scheme: Scheme,
    authority: Authority,
    /// Without a trailing `/`; empty when the URL has no path.
    prefix: String,
    /// `scheme://authority/`.
    root: Uri,
    /// The `Host` field of requests to it.
    host: HeaderValue,
}

impl Base {
    /// Parses an upstream URL such as `http://127.0.0.1:8081`, `https://llm.example` or
    /// `http://host:80/openai/`.
    pub(crate) fn parse(url: &str) -> Result<Self, BaseError> {
        let uri: Uri = url.parse().map_err(|source| BaseError::Invalid {
            url: url.to_owned(),
            source,
        })?;
        let scheme = uri.scheme().cloned().ok_or(BaseError::NoScheme)?;
        if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
            return Err(BaseError::Scheme(scheme));
        }
        let authority = uri.authority().cloned().ok_or(BaseError::NoHost)?;
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let root = Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query("/")
            .build()
            .map_err(BaseError::Host)?;
        // As a browser or curl writes it: the port only when it is not the scheme's default,
        // and never any user information.
        let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port != default_port => format!("{}:{port}", authority.host()),
            _ => authority.host().to_owned(),
        };
        let host = HeaderValue::try_from(host).map_err(|error| BaseError::Host(error.into()))?;
        Ok(Self {
            scheme,
            authority,
            prefix,
            root,
            host,
        })
    }

    /// The upstream URI for a client request's path and query.
    pub(crate) fn uri_for(
        &self,
        path_and_query: Option<&PathAndQuery>,
    ) -> Result<Uri, http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(self.path_for(path_and_query))
            .build()
    }

    /// The origin-form URI (path and query only) for a client request's path and query: what
    /// an HTTP/1.1 request line to the upstream itself carries.
    pub(crate) fn origin_for(
        &self,
        path_and_query: Option<&PathAndQuery>,
    ) -> Result<Uri, http::Error> {
        if let (true, Some(path_and_query)) = (self.prefix.is_empty(), path_and_query) {
            // The client's own path and query, shared rather than copied and parsed again.
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = Some(path_and_query.clone());
            return Ok(Uri::from_parts(parts)?);
        }
        Uri::builder()
            .path_and_query(self.path_for(path_and_query))
            .build()
    }

    /// The prefix joined with a client request's path and query.
    fn path_for(&self, path_and_query: Option<&PathAndQuery>) -> String {
        let tail = path_and_query.map_or("/", PathAndQuery::as_str);
        if self.prefix.is_empty() {
            tail.to_owned()
        } else {
            format!("{}{tail}", self.prefix)
        }
    }

    /// `scheme://authority/`: where a connection to the upstream is made.
    pub(crate) fn root(&self) -> &Uri {
        &self.root
    }

    /// The `Host` field of a request to the upstream: its host, with the port unless it is the
    /// scheme's default, without any user information.
    pub(crate) fn host(&self) -> &HeaderValue {
        &self.host
    }
}

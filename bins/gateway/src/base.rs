//! Where an upstream lives: the one parsed form of an upstream URL, shared by the request path
//! ([`proxy::forward`](crate::proxy::forward)) and the probes
//! ([`upstreams::probe`](crate::upstreams::probe)).

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
}

/// Where an upstream lives: scheme, authority and an optional path prefix.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    scheme: Scheme,
    authority: Authority,
    /// Without a trailing `/`; empty when the URL has no path.
    prefix: String,
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
        Ok(Self {
            scheme,
            authority,
            prefix,
        })
    }

    /// The upstream URI for a client request's path and query.
    pub(crate) fn uri_for(
        &self,
        path_and_query: Option<&PathAndQuery>,
    ) -> Result<Uri, http::Error> {
        let tail = path_and_query.map_or("/", PathAndQuery::as_str);
        let path = if self.prefix.is_empty() {
            tail.to_owned()
        } else {
            format!("{}{tail}", self.prefix)
        };
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
    }
}

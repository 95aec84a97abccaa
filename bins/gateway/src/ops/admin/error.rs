//! The admin API's errors: its own refusals, and those every listener shares with the request
//! path (an unknown path, a wrong method, a missing token, a bug), each becoming its problem
//! document through the same [`problems::document`].
//!
//! | variant | status |
//! |---|---|
//! | `ReloadUnavailable` (the gateway was not started from a file) | 409 |
//! | `ConfigRefused` (the configuration in force stays) | 422 |
//! | `Request`: `NotFound`, `MethodNotAllowed`, `Unauthorized`, `Internal` | 404, 405, 401, 500 |
//!
//! None of them is a client's request refused: they are not counted in
//! `slotgate_rejections_total` and leave no access-log line.

use bytes::Bytes;
use http::{HeaderValue, Response};
use slotgate_problem::{Dialect, Problem};

use crate::proxy::problems::{self, Error};
use crate::support::error::BoxError;

/// Why an admin request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum AdminError {
    /// A failure any listener has: see [`Error`].
    #[error(transparent)]
    Request(#[from] Error),
    /// `POST /admin/reload` on a gateway not started from a file.
    #[error("reload refused")]
    ReloadUnavailable {
        /// The generation still in force.
        generation: u64,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// `POST /admin/reload` read a configuration that cannot be put in force.
    #[error("reload refused")]
    ConfigRefused {
        /// Every problem, one line each.
        issues: Vec<String>,
        /// The generation still in force.
        generation: u64,
        /// Why.
        #[source]
        source: BoxError,
    },
}

impl AdminError {
    /// The problem document for this error. A refused reload carries `reloaded: false` and
    /// the generation in force, as the success document does.
    pub(crate) fn to_problem(&self) -> Problem {
        match self {
            AdminError::Request(error) => error.to_problem(),
            AdminError::ReloadUnavailable { generation, .. } => Problem::reload_unavailable()
                .with_extension("reloaded", false)
                .with_extension("generation", *generation),
            AdminError::ConfigRefused {
                issues, generation, ..
            } => Problem::config_refused(issues)
                .with_extension("reloaded", false)
                .with_extension("generation", *generation),
        }
    }

    /// The response for this error, carrying the request id (see [`problems::respond`]).
    pub(crate) fn respond<B: From<Bytes>>(&self, request_id: &HeaderValue) -> Response<B> {
        match self {
            AdminError::Request(error) => problems::respond(error, request_id, Dialect::OpenAi),
            _ => problems::document(self, self.to_problem(), false, request_id, Dialect::OpenAi),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderValue, Response};

    use super::AdminError;
    use crate::proxy::problems::Error;

    fn cause() -> crate::support::error::BoxError {
        Box::new(std::io::Error::other("no file"))
    }

    #[test]
    fn every_admin_error_becomes_its_problem_document() {
        let cases = [
            (
                AdminError::ReloadUnavailable {
                    generation: 1,
                    source: cause(),
                },
                409,
                "reload-unavailable",
            ),
            (
                AdminError::ConfigRefused {
                    issues: vec!["aliases.chat: no such model".into()],
                    generation: 1,
                    source: cause(),
                },
                422,
                "config-refused",
            ),
            (AdminError::from(Error::Unauthorized), 401, "unauthorized"),
        ];
        let id = HeaderValue::from_static("req-1");
        for (error, status, slug) in cases {
            let response: Response<Bytes> = error.respond(&id);
            assert_eq!(response.status().as_u16(), status, "{error:?}");
            let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert!(doc["type"].as_str().unwrap().ends_with(slug), "{doc}");
            assert_eq!(doc["request_id"], "req-1");
            if status != 401 {
                assert_eq!(doc["reloaded"], false);
                assert_eq!(doc["generation"], 1);
            }
        }
    }
}

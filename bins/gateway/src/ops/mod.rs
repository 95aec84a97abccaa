//! Operating the gateway: the [`admin`] listener (probes, status, drain, reload), the live
//! [`status`] page it serves, the [`upstream_doc`] both show, the metrics registry with its
//! scrape-time gauges ([`scrape`]), and [`reload`], which builds the next configuration
//! generation and puts it in force.
//!
//! This is the top of the stack: it reads the request path's live configuration
//! ([`proxy::live`](crate::proxy::live)) and the upstreams' state, and nothing below imports it.

pub(crate) mod admin;
pub(crate) mod reload;
pub(crate) mod scrape;
pub(crate) mod status;
pub(crate) mod upstream_doc;

//! # slotgate-gateway
//!
//! The `slotgate` binary's wiring, as a library so tests and the demo can start the real gateway
//! in-process.
//!
//! One request, in the order its files handle it:
//!
//! 1. [`server`]: accept (HTTP/1.1 and h2c), header-read timeout, connection limit, graceful
//!    shutdown.
//! 2. [`request`]: read the body under a size limit, check it is JSON, find `model` and
//!    `stream` without re-serialising.
//! 3. [`forward`]: pooled client, timeouts, hop-by-hop headers, request id.
//! 4. [`body`]: the response body that holds the slot until it ends, fails or is dropped.
//! 5. [`rescue`]: every error → its problem document, in one place.

pub mod body;
pub mod forward;
pub mod request;
pub mod rescue;
pub mod server;

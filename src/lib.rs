//! # slotgate
//!
//! An OpenAI-compatible gateway that holds the line in front of self-hosted LLM inference
//! servers: per (upstream, model) at most `parallel` requests in flight, at most `queue` waiting
//! first-come-first-served, the rest refused at once.
//!
//! This facade re-exports the library crates so an embedding service needs one dependency:
//!
//! - [`limiter`]: the keyed FIFO concurrency limiter ([`slotgate_limiter`]);
//! - [`choose`]: pure host scoring ([`slotgate_choose`]);
//! - [`problem`]: RFC 9457 problem documents ([`slotgate_problem`]);
//! - [`config`]: configuration types, loading and validation ([`slotgate_config`]).
//!
//! The gateway itself is the `slotgate` binary of the `slotgate-gateway` package.

pub use slotgate_choose as choose;
pub use slotgate_config as config;
pub use slotgate_limiter as limiter;
pub use slotgate_problem as problem;

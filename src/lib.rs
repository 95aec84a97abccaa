//! # slotgate
//!
//! An OpenAI-compatible gateway that holds the line in front of self-hosted LLM inference
//! servers: per (upstream, model) at most `parallel` requests in flight, at most `queue` waiting
//! first-come-first-served, the rest refused at once.
//!
//! This facade re-exports the library crates so an embedding service needs one dependency:
//!
//! - [`limiter`]: the keyed FIFO concurrency limiter ([`slotgate_limiter`]).

pub use slotgate_limiter as limiter;

//! The request path: one module per step of a request, in the order [`service`] calls them
//! (the crate docs list them), plus [`live`], the configuration in force that every request takes
//! at arrival.
//!
//! Below it: [`upstreams`](crate::upstreams), for what is known about each engine. Above it:
//! [`ops`](crate::ops), which swaps the live configuration and reports on it.

pub(crate) mod access;
pub(crate) mod admit;
pub(crate) mod affinity;
pub(crate) mod answer;
pub(crate) mod auth;
pub(crate) mod body;
pub(crate) mod cache_aware;
pub(crate) mod choose;
pub(crate) mod client;
pub(crate) mod cors;
pub(crate) mod endpoint;
pub(crate) mod forward;
pub(crate) mod keepalive;
pub(crate) mod live;
pub(crate) mod models;
pub(crate) mod ollama;
pub(crate) mod problems;
pub(crate) mod refusals;
pub(crate) mod rename;
pub(crate) mod request;
pub(crate) mod responses;
pub(crate) mod retry;
pub(crate) mod route;
pub(crate) mod send;
pub(crate) mod server;
pub(crate) mod service;

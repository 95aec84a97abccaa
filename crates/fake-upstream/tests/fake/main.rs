//! Tests of the fake upstream itself, over real loopback sockets. Timing is only ever asserted
//! as a lower bound (a sleep never ends early) or as ordering and counts, so a loaded machine
//! slows these tests down but does not make them fail.

mod cache;
mod failures;
mod faults;
mod layering;
mod llama;
mod observer;
mod ollama;
mod routes;
mod server;
mod streaming;
mod support;
mod vllm;
mod weights;

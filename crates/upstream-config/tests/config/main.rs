//! slotgate-config through its public API: every rule, environment overrides (in a
//! `figment::Jail`), the effective config, and the sample configs under `examples/`.

mod cluster_rules;
mod effective;
mod env;
mod examples;
mod helpers;
mod mistakes;
mod model_rules;
mod queueing_rules;
mod server_rules;
mod support;
mod upstream_rules;

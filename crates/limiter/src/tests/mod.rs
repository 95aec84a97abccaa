//! In-crate tests: the rules of the contract under std primitives, and the loom models under
//! `--cfg loom`.

#[cfg(not(loom))]
mod rules;

#[cfg(not(loom))]
mod shortcuts;

#[cfg(loom)]
mod loom_limiter;

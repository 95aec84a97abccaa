//! The leaves every layer shares, each small and importing nothing else of the gateway:
//! [`base`] (the one parsed form of an upstream URL), [`error`] (the boxed error and its
//! chain for logs), [`request_id`] (`x-request-id`, accepted or made), [`shutdown`] (the signal
//! the listeners, queues and background rounds stop on).
//!
//! The other leaves have folders of their own: [`metrics`](crate::metrics) and
//! [`tls`](crate::tls).

pub(crate) mod base;
pub(crate) mod error;
pub(crate) mod request_id;
pub(crate) mod shutdown;

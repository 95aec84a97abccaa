//! The live status page: `GET /ui` on the admin listener, and the one event stream it reads,
//! `GET /admin/events`.
//!
//! - [`page`]: the page itself (HTML, CSS and JavaScript embedded in the binary at build time;
//!   no CDN, no framework), with the headers that keep it from running anything else.
//! - [`history`]: the small ring buffers behind the sparklines and the windowed figures
//!   (bounded: 300 one-second samples per (upstream, model)).
//! - [`sampler`]: the one task that fills them, once a second.
//! - [`document`]: what one event carries — every upstream's status document (the same as
//!   `GET /admin/upstreams`) and, per (upstream, model), the queue-wait and first-byte
//!   percentiles, the refusals of the last minute and the new samples.
//! - [`events`]: the server-sent event stream, one event about once a second, ending when the
//!   gateway shuts down.
//!
//! Access: the page is static code with no data in it, the same in every build, so it is served
//! without the token (a browser cannot send a header on navigation). Everything it shows comes
//! from `/admin/events` and every action goes through `/admin/upstreams/{name}/drain`, which are
//! behind `server.admin_token` like the rest of `/admin/*`. The page sends the token in the
//! `Authorization` header with `fetch()` (reading the event stream through `fetch()` streaming,
//! since `EventSource` cannot send headers), and keeps it in page memory only.

pub(crate) mod document;
pub(crate) mod events;
pub(crate) mod history;
pub(crate) mod page;
pub(crate) mod sampler;

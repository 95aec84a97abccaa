//! The `[server]` table: every key read as declared in [`crate::server`], then the checks
//! between keys, which no single declaration can make.

use std::net::SocketAddr;

use figment::value::{Dict, Value};

use crate::raw::{KeyPath, Reader};
use crate::server::{Server, ServerKeys};

pub(super) fn server(r: &mut Reader<'_>, path: &KeyPath, value: Option<&Value>) -> Option<Server> {
    let Some(value) = value else {
        r.missing(
            path,
            r#"a [server] table with at least `listen = "127.0.0.1:8080"`"#,
        );
        return None;
    };
    let t = r.table(path, value, &ServerKeys::names())?;
    let keys = ServerKeys::read(r, t, path);
    listeners_differ(r, t, path, &keys);
    admin_tls_has_a_listener(r, path, &keys);
    buffer_fits_bodies(r, path, &keys);
    keys.build()
}

/// `admin_listen` must not collide with `listen`.
fn listeners_differ(r: &mut Reader<'_>, t: &Dict, path: &KeyPath, keys: &ServerKeys) {
    if let (Some(listen), Some(Some(admin))) = (keys.listen, keys.admin_listen)
        && listeners_collide(listen, admin)
    {
        let message = format!("{admin} collides with server.listen = {listen}; they must differ");
        r.invalid(&path.key("admin_listen"), &t["admin_listen"], message);
    }
}

/// Whether two listeners cannot both bind: same port (0 asks the OS for a fresh one, so it never
/// collides) and the same IP, or an unspecified IP (`0.0.0.0`, `[::]`) on either side.
fn listeners_collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// The admin listener's certificate needs an admin listener.
fn admin_tls_has_a_listener(r: &mut Reader<'_>, path: &KeyPath, keys: &ServerKeys) {
    if matches!(keys.admin_listen, Some(None)) && matches!(keys.admin_tls, Some(Some(_))) {
        r.issue(
            &path.key("admin_tls_cert"),
            "set without server.admin_listen: there is no admin listener to serve it on",
        );
    }
}

/// `max_buffered_body_bytes` must hold one body of each limit: a request under its own limit
/// but over the whole buffer would be refused with `503 overloaded` every time, and its
/// `Retry-After` would be a lie. Only checked when all three values are valid (a wrong one is
/// reported already).
fn buffer_fits_bodies(r: &mut Reader<'_>, path: &KeyPath, keys: &ServerKeys) {
    let Some(buffered) = keys.max_buffered_body_bytes else {
        return;
    };
    let limits = [
        ("max_body_bytes", keys.max_body_bytes),
        ("max_upload_bytes", keys.max_upload_bytes),
    ];
    for (key, limit) in limits {
        if let Some(limit) = limit
            && limit > buffered
        {
            r.issue(
                &path.key("max_buffered_body_bytes"),
                format!(
                    "is {buffered}, less than server.{key} ({limit}): a body under {key} but \
                     over the whole buffer could never be accepted; raise \
                     max_buffered_body_bytes to at least {limit} or lower {key}"
                ),
            );
        }
    }
}

//! TLS, both ways, with rustls and the ring provider: [`upstream`] to the engines (the connector
//! every upstream's clients use, and the files it reads), [`listener`] on the gateway's own
//! listeners (certificates read at start and at every reload, swapped without dropping open
//! connections). The upstream side's items are re-exported here: they are what the rest of the
//! gateway names as `tls::…`.

pub(crate) mod listener;
mod upstream;

pub(crate) use upstream::{
    Connector, TlsError, UpstreamTls, certificates, connector, is_tls_failure, private_key,
    provider, read_file,
};

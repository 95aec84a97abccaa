//! The page's files, embedded in the binary at build time (`include_str!`): the page works on a
//! LAN with no internet, and what runs in an operator's browser is exactly what was reviewed.
//!
//! | path | file |
//! |---|---|
//! | `/ui` | `page/index.html` |
//! | `/ui/status.css` | `page/status.css` |
//! | `/ui/status.js` | `page/status.js` |
//! | `/ui/favicon.svg` | `page/favicon.svg` (without it, browsers ask for `/favicon.ico` and log the `404`) |
//!
//! Every file goes out with [`CONTENT_SECURITY_POLICY`]: scripts and styles from these files
//! only (no inline script, nothing from elsewhere), requests only back to this listener, and no
//! framing. The script itself writes upstream and model names with `textContent`, never as HTML.

use bytes::Bytes;

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asset {
    /// Its `Content-Type`.
    pub(crate) content_type: &'static str,
    /// Its text.
    pub(crate) body: &'static str,
}

/// Where the page's HTML says whether the admin listener wants a token (`required` or `none`),
/// so that the page asks for it before its first request rather than after a refusal. Whether
/// a token is set is no secret: any request to `/admin/*` tells.
const TOKEN_MARK: &str = "{{admin_token}}";

impl Asset {
    /// The bytes to send, for a listener that does (`token_required`) or does not want the
    /// admin token.
    pub(crate) fn bytes(self, token_required: bool) -> Bytes {
        if self.body.contains(TOKEN_MARK) {
            let word = if token_required { "required" } else { "none" };
            Bytes::from(self.body.replace(TOKEN_MARK, word))
        } else {
            Bytes::from_static(self.body.as_bytes())
        }
    }
}

/// The `Content-Security-Policy` of the page's files.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX: Asset = Asset {
    content_type: "text/html; charset=utf-8",
    body: include_str!("page/index.html"),
};
const STYLE: Asset = Asset {
    content_type: "text/css; charset=utf-8",
    body: include_str!("page/status.css"),
};
const SCRIPT: Asset = Asset {
    content_type: "text/javascript; charset=utf-8",
    body: include_str!("page/status.js"),
};
const ICON: Asset = Asset {
    content_type: "image/svg+xml",
    body: include_str!("page/favicon.svg"),
};

/// The file served at `path`, if `path` is one of the page's.
pub(crate) fn asset(path: &str) -> Option<Asset> {
    match path {
        "/ui" | "/ui/" => Some(INDEX),
        "/ui/status.css" => Some(STYLE),
        "/ui/status.js" => Some(SCRIPT),
        "/ui/favicon.svg" => Some(ICON),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::asset;

    #[test]
    fn the_page_names_only_its_own_files() {
        let index = asset("/ui").unwrap().body;
        for file in ["/ui/status.css", "/ui/status.js", "/ui/favicon.svg"] {
            assert!(index.contains(file), "{file}");
        }
        // Nothing from elsewhere, and nothing the policy would block.
        for file in ["/ui", "/ui/status.css", "/ui/status.js", "/ui/favicon.svg"] {
            // The one URL allowed is the SVG namespace, a name rather than a place.
            let body = asset(file)
                .unwrap()
                .body
                .replace("http://www.w3.org/2000/svg", "");
            assert!(
                !body.contains("http://") && !body.contains("https://"),
                "{file}"
            );
        }
        assert!(!index.contains("<script>") && !index.contains("style="));
        // The script never parses names as HTML.
        assert!(!asset("/ui/status.js").unwrap().body.contains("innerHTML"));
        assert!(asset("/ui/other").is_none());
    }

    #[test]
    fn the_page_says_whether_a_token_is_wanted() {
        let index = asset("/ui").unwrap();
        let required = String::from_utf8(index.bytes(true).to_vec()).unwrap();
        assert!(required.contains(r#"data-admin-token="required""#));
        let none = String::from_utf8(index.bytes(false).to_vec()).unwrap();
        assert!(none.contains(r#"data-admin-token="none""#));
        assert!(!none.contains("{{"));
    }
}

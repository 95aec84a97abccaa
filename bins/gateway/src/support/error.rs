//! The boxed error type that hyper and http-body-util hand out, and [`chain`], which writes an
//! error with its causes on one line for logs and problem details.

/// A boxed error, as hyper and http-body-util hand them out.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An error and its sources, `: `-separated, for logs and details.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

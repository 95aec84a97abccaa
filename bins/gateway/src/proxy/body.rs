//! Step 8: the response body that holds the slot.
//!
//! [`SlotBody`] wraps the upstream's response body and owns the guard of the slot the request
//! holds (in the gateway, an [`admit::Slot`](crate::proxy::admit::Slot), which owns the limiter
//! `Permit`). The guard is dropped — so the slot goes back to the limiter — at the first of:
//!
//! - the inner body reports its end (a `None` frame, or `is_end_stream()` after a frame);
//! - the inner body yields an error (the upstream died mid-stream);
//! - the wrapper itself is dropped (hyper drops the response body when the client goes away).
//!
//! Frames are passed through untouched, one for one: the wrapper never buffers, so an SSE chunk
//! reaches the client as soon as the upstream sends it.
//!
//! A [`Completion`] says which of those three ended the body; the guard learns it through
//! [`SlotGuard::finish`] just before it is dropped, so the gateway can count client disconnects
//! mid-stream separately from clean ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// How a [`SlotBody`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// The upstream body ended normally.
    Ended,
    /// The upstream body yielded an error (for example, the upstream closed mid-stream).
    Failed,
    /// The body was dropped before it ended: the client went away (or the server shut down).
    Dropped,
}

/// Something held for as long as a response body streams, told how the body ended.
pub(crate) trait SlotGuard {
    /// Called once, just before the guard is dropped.
    fn finish(self, how: Completion);
}

/// `()` holds nothing; useful for bodies that hold no slot.
impl SlotGuard for () {
    fn finish(self, _how: Completion) {}
}

/// `None` holds nothing: the answer of a route that takes no slot (`/tokenize`, `/api/show`)
/// streams through the same body type as one that does.
impl<G: SlotGuard> SlotGuard for Option<G> {
    fn finish(self, how: Completion) {
        if let Some(guard) = self {
            guard.finish(how);
        }
    }
}

pin_project! {
    /// A response body that holds a slot guard until the body ends, fails or is dropped.
    ///
    /// See the [module documentation](self).
    #[derive(Debug)]
    #[project = SlotBodyProj]
    pub(crate) struct SlotBody<B: Body, G: SlotGuard> {
        #[pin]
        inner: B,
        guard: Option<G>,
    }

    impl<B: Body, G: SlotGuard> PinnedDrop for SlotBody<B, G> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(guard) = this.guard.take() {
                // hyper never polls a body that says it is already at its end (an empty body),
                // so a guard still held here is a clean end in that case, and otherwise means
                // the client (or a shutdown) dropped the response mid-stream.
                let how = if this.inner.is_end_stream() {
                    Completion::Ended
                } else {
                    Completion::Dropped
                };
                guard.finish(how);
            }
        }
    }
}

impl<B: Body, G: SlotGuard> SlotBody<B, G> {
    /// Wraps `inner`, holding `guard` until the body is done.
    pub(crate) fn new(inner: B, guard: G) -> Self {
        Self {
            inner,
            guard: Some(guard),
        }
    }

    /// Whether the guard is still held (the body has not ended yet). The gateway never needs to
    /// ask; the tests check when the slot goes back.
    #[cfg(test)]
    pub(crate) fn is_holding(&self) -> bool {
        self.guard.is_some()
    }
}

impl<B: Body, G: SlotGuard> SlotBodyProj<'_, B, G> {
    fn release(&mut self, how: Completion) {
        if let Some(guard) = self.guard.take() {
            guard.finish(how);
        }
    }
}

impl<B: Body, G: SlotGuard> Body for SlotBody<B, G> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                this.release(Completion::Ended);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Ok(frame))) => {
                // Release as soon as the last frame is out, rather than waiting for hyper to poll
                // once more for the `None`: the next queued request should not wait on us.
                if this.inner.is_end_stream() {
                    this.release(Completion::Ended);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => {
                this.release(Completion::Failed);
                Poll::Ready(Some(Err(error)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;

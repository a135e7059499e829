//! The socket's incoming connections, pausing after a failed accept. tonic goes straight
//! back to accepting after an error, and out of descriptors (`EMFILE`) the listener stays
//! readable: without a pause the one runtime thread would spin on it, serving the
//! connections it has only between failures.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::UnixStream;
use tokio::time::Sleep;
use tokio_stream::Stream;
use tokio_stream::wrappers::UnixListenerStream;

use crate::one_write::OneWrite;

/// How long a failed accept pauses the next.
const PAUSE: Duration = Duration::from_millis(100);

pub(crate) struct Incoming {
    listener: UnixListenerStream,
    pause: Option<Pin<Box<Sleep>>>,
    /// The last accept failed: the next failures in a row are not logged again, so a
    /// stalled log cannot hold the runtime's thread once per pause.
    failing: bool,
}

impl Incoming {
    pub(crate) fn new(listener: UnixListenerStream) -> Incoming {
        Incoming {
            listener,
            pause: None,
            failing: false,
        }
    }
}

impl Stream for Incoming {
    type Item = std::io::Result<OneWrite<UnixStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(pause) = self.pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pause = None;
        }
        let next = Pin::new(&mut self.listener).poll_next(cx);
        match &next {
            Poll::Ready(Some(Err(e))) => {
                if !self.failing {
                    tracing::warn!(error = %e, "accepting a containerd connection failed");
                }
                self.failing = true;
                self.pause = Some(Box::pin(tokio::time::sleep(PAUSE)));
            }
            Poll::Ready(Some(Ok(_))) => self.failing = false,
            _ => {}
        }
        next.map(|accepted| accepted.map(|stream| stream.map(OneWrite)))
    }
}

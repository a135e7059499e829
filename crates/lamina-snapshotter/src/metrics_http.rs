//! `/metrics` over HTTP/1.1, with the hyper the gRPC server already links: a scrape
//! endpoint needs no framework.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;

use crate::metrics::Exporter;

/// A client that sends no complete request head in this long is dropped, so idle or
/// half-open connections cannot pile up.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; one past it waits in the kernel's backlog. A scraper needs
/// one; the bound keeps anyone who can reach the address from holding the daemon's
/// descriptors (which the snapshots socket needs) and buffers.
const MAX_CONNECTIONS: usize = 32;

/// What a connection may buffer of a request head, and how many headers it may send: a
/// scrape is one short GET.
const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;
const MAX_HEADERS: usize = 32;

/// Accepts scrapers for ever, one task per connection, at most [`MAX_CONNECTIONS`].
pub(crate) async fn serve(listener: tokio::net::TcpListener, exporter: Arc<Exporter>) {
    // One render at a time: scrapes that arrive together wait their turn without holding
    // a blocking thread each, and the store is read by one of them at a time.
    let turn = Arc::new(Semaphore::new(1));
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = connections.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, mostly: back off rather than spin.
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (exporter, turn) = (exporter.clone(), turn.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let (exporter, turn) = (exporter.clone(), turn.clone());
                async move { Ok::<_, Infallible>(answer(&exporter, &turn, request).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_REQUEST_HEAD_BYTES)
                .max_headers(MAX_HEADERS)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "metrics connection ended");
            }
        });
    }
}

async fn answer(
    exporter: &Arc<Exporter>,
    turn: &Arc<Semaphore>,
    request: Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "only /metrics is served here\n");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
        response
            .headers_mut()
            .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    let Ok(turn) = turn.clone().acquire_owned().await else {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n");
    };
    // Reading the store blocks (queries, readdirs, statfs): on the blocking pool. The
    // turn goes with the render, not this future: a scraper that hangs up mid-render
    // drops the future, and the next render must still wait for this one.
    let exporter = exporter.clone();
    match tokio::task::spawn_blocking(move || {
        let _turn = turn;
        exporter.render()
    })
    .await
    {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                ),
            );
            response
        }
        Err(e) => {
            tracing::warn!(error = %e, "rendering metrics failed");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rendering metrics failed\n",
            )
        }
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}

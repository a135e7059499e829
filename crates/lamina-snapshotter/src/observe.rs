//! A tower layer around the gRPC server: every call of the snapshots service is timed,
//! counted by method and status code ([`Activity`]), and logged in one debug line.
//!
//! A call ends, for this layer, when its answer's headers are ready: for the unary calls
//! that is when the work is done (the work runs before tonic answers), and `List`, whose
//! snapshots are read before its stream starts, is the same. A failed call is answered
//! "trailers only", with its `grpc-status` in the headers; a call with no `grpc-status`
//! there succeeded.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::Code;
use tonic::codegen::http;

use crate::metrics::Activity;

/// The service's methods, as the request path names them; anything else (the server
/// answers `Unimplemented`) counts as `other`, so a client cannot make up label values.
const METHODS: [&str; 10] = [
    "Prepare", "View", "Mounts", "Commit", "Remove", "Stat", "Update", "List", "Usage", "Cleanup",
];

#[derive(Debug, Clone)]
pub(crate) struct ObserveLayer {
    activity: Activity,
}

impl ObserveLayer {
    pub(crate) fn new(activity: Activity) -> Self {
        ObserveLayer { activity }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observed<S>;

    fn layer(&self, inner: S) -> Observed<S> {
        Observed {
            inner,
            activity: self.activity.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Observed<S> {
    inner: S,
    activity: Activity,
}

type Boxed<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Observed<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Boxed<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_of(request.uri().path());
        let activity = self.activity.clone();
        let started = Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            // Counted as cancelled if the future is dropped unfinished: a call past its
            // deadline, or whose client went away, is among the slowest of all.
            let mut pending = Pending {
                method,
                activity,
                started,
                code: None,
            };
            let answer = answer.await;
            pending.code = Some(match &answer {
                Ok(response) => code_of(response.headers()),
                // The transport failed the call before any status: gRPC's catch-all.
                Err(_) => Code::Unknown,
            });
            answer
        })
    }
}

/// One call, counted and logged when dropped: with the code it answered, or `Cancelled`.
struct Pending {
    method: &'static str,
    activity: Activity,
    started: Instant,
    code: Option<Code>,
}

impl Drop for Pending {
    fn drop(&mut self) {
        let elapsed = self.started.elapsed();
        let code = code_name(self.code.unwrap_or(Code::Cancelled));
        self.activity.call(self.method, code, elapsed);
        tracing::debug!(
            method = self.method,
            code,
            ms = elapsed.as_secs_f64() * 1000.0,
            "snapshots call"
        );
    }
}

/// `Prepare` from `/containerd.services.snapshots.v1.Snapshots/Prepare`.
fn method_of(path: &str) -> &'static str {
    let name = path
        .strip_prefix("/containerd.services.snapshots.v1.Snapshots/")
        .unwrap_or("");
    METHODS
        .iter()
        .find(|m| **m == name)
        .copied()
        .unwrap_or("Other")
}

fn code_of(headers: &http::HeaderMap) -> Code {
    match headers.get("grpc-status") {
        None => Code::Ok,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.parse::<i32>().ok())
            .map_or(Code::Unknown, Code::from_i32),
    }
}

/// The code's name as gRPC spells it in its other languages' metrics (`OK`,
/// `NotFound`, …).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_codes_are_named_from_a_fixed_set() {
        assert_eq!(
            method_of("/containerd.services.snapshots.v1.Snapshots/Prepare"),
            "Prepare"
        );
        assert_eq!(
            method_of("/containerd.services.snapshots.v1.Snapshots/Other"),
            "Other"
        );
        assert_eq!(method_of("/made.up.Service/Prepare"), "Other");
        let mut headers = http::HeaderMap::new();
        assert_eq!(code_name(code_of(&headers)), "OK");
        headers.insert("grpc-status", http::HeaderValue::from_static("5"));
        assert_eq!(code_name(code_of(&headers)), "NotFound");
        headers.insert("grpc-status", http::HeaderValue::from_static("junk"));
        assert_eq!(code_name(code_of(&headers)), "Unknown");
    }
}

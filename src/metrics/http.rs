//! The metrics endpoint: plain HTTP/1.1 on its own listener (`--metrics-listen`), answering
//! `GET /metrics` with every metric of the process, and 404 to anything else.
//!
//! The format follows the scraper's `Accept` header: OpenMetrics text when it prefers it (as
//! Prometheus does), otherwise the Prometheus text format 0.0.4 (curl, `promtool check metrics`).

use std::{convert::Infallible, time::Duration};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::Format;

/// The path metrics are served on.
pub const PATH: &str = "/metrics";
/// Longest time a scraper may take to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a failed accept (out of file descriptors) before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);
/// Most media ranges of an `Accept` header looked at.
const MAX_ACCEPT_RANGES: usize = 32;

/// The format to answer a scraper whose `Accept` header is `accept`: the acceptable format with
/// the highest quality (OpenMetrics 1.0.0, OpenMetrics 0.0.1, or the Prometheus text format),
/// the Prometheus text format when nothing or nothing known is asked for.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Prometheus;
    };
    let mut best: Option<(f32, Format)> = None;
    for range in accept.split(',').take(MAX_ACCEPT_RANGES) {
        let mut params = range.split(';').map(str::trim);
        let media = params.next().unwrap_or_default().to_ascii_lowercase();
        let mut quality = 1.0_f32;
        let mut version = None;
        for param in params {
            match param.split_once('=') {
                Some((name, value)) if name.trim().eq_ignore_ascii_case("q") => {
                    quality = value.trim().parse().unwrap_or(0.0);
                }
                Some((name, value)) if name.trim().eq_ignore_ascii_case("version") => {
                    version = Some(value.trim().to_owned());
                }
                _ => {}
            }
        }
        let format = match (media.as_str(), version.as_deref()) {
            ("application/openmetrics-text", Some("0.0.1")) => Format::OpenMetricsV0,
            ("application/openmetrics-text", None | Some("1.0.0")) => Format::OpenMetrics,
            ("text/plain", None | Some("0.0.4")) | ("text/*" | "*/*", _) => Format::Prometheus,
            _ => continue,
        };
        if quality > 0.0 && best.is_none_or(|(q, _)| quality > q) {
            best = Some((quality, format));
        }
    }
    best.map_or(Format::Prometheus, |(_, format)| format)
}

fn answer(request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.uri().path() != PATH || request.method() != Method::GET {
        let mut response = Response::new(Full::new(Bytes::from_static(b"not found\n")));
        *response.status_mut() = StatusCode::NOT_FOUND;
        return response;
    }
    let accept = request
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let format = negotiate(accept);
    match super::encode(format) {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            response
        }
        Err(_) => {
            let mut response = Response::new(Full::new(Bytes::from_static(
                b"the metrics could not be encoded\n",
            )));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

/// Serves the metrics on `listener` until `shutdown` is cancelled; open connections are closed
/// then too.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: a later accept may succeed; pause so a
                // lasting failure does not spin.
                tracing::debug!(error = %e, "the metrics listener could not accept a connection");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep_until(tokio::time::Instant::now() + ACCEPT_PAUSE) => {}
                }
                continue;
            }
        };
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = service_fn(|request: Request<Incoming>| async move {
                Ok::<_, Infallible>(answer(&request))
            });
            let connection = http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
    connections.abort_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prometheus's own Accept header gets OpenMetrics; curl and promtool get the text format.
    #[test]
    fn accept_header_picks_the_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0;q=0.5,\
            application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(negotiate(Some(prometheus)), Format::OpenMetrics);
        assert_eq!(
            negotiate(Some("application/openmetrics-text;version=0.0.1")),
            Format::OpenMetricsV0
        );
        assert_eq!(negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(negotiate(None), Format::Prometheus);
        assert_eq!(
            negotiate(Some("text/plain;version=0.0.4")),
            Format::Prometheus
        );
        assert_eq!(
            negotiate(Some("text/plain;q=0.9,application/openmetrics-text;q=0.1")),
            Format::Prometheus
        );
        assert_eq!(negotiate(Some("application/json")), Format::Prometheus);
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0")),
            Format::Prometheus
        );
    }
}

//! The `/metrics` endpoint: the text of a [`NodeMetrics`] over HTTP/1.1,
//! OpenMetrics when the scraper accepts it (Prometheus does), else the
//! Prometheus text format 0.0.4, on the address the node configures
//! (127.0.0.1 by default; `docs/metrics.md`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::{Format, NodeMetrics};

/// How long a scraper may take to send its request's header.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The endpoint cannot listen.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: cannot listen on {address} for the metrics endpoint: {source}. {}", advice(.source, setting))]
pub struct MetricsError {
    /// The setting that chose the address.
    pub setting: String,
    /// The address.
    pub address: SocketAddr,
    /// The bind error.
    #[source]
    pub source: std::io::Error,
}

/// What to do about a bind error `source` of the address `setting` chose.
fn advice(source: &std::io::Error, setting: &str) -> String {
    match source.kind() {
        std::io::ErrorKind::AddrNotAvailable => "The address is not one of this host's: set EREBINE_AGENT_LMCACHE_METRICS_HOST to one of its addresses, 127.0.0.1 (the default) or 0.0.0.0".to_string(),
        _ => format!("Choose another port with {setting}, or 0 to turn the endpoint off"),
    }
}

/// A running endpoint; dropping it stops it.
#[derive(Debug)]
pub struct MetricsEndpoint {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsEndpoint {
    /// Listens on `address` and serves `metrics` at `GET /metrics` on the
    /// current tokio runtime. `setting` names the variable that chose the
    /// address, for the error.
    ///
    /// Errors: [`MetricsError`] when the address cannot be bound.
    pub async fn start(
        address: SocketAddr,
        setting: &str,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self, MetricsError> {
        let listener = TcpListener::bind(address)
            .await
            .map_err(|source| MetricsError {
                setting: setting.to_string(),
                address,
                source,
            })?;
        let address = listener.local_addr().unwrap_or(address);
        let task = tokio::spawn(serve(listener, metrics));
        Ok(MetricsEndpoint { address, task })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(listener: TcpListener, metrics: Arc<NodeMetrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| answer(metrics.clone(), request));
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer<B>(
    metrics: Arc<NodeMetrics>,
    request: Request<B>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let respond = |status: StatusCode, kind: &str, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        if let Ok(value) = kind.parse() {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    let text = "text/plain; charset=utf-8";
    if request.uri().path() != "/metrics" {
        return Ok(respond(
            StatusCode::NOT_FOUND,
            text,
            "try /metrics\n".into(),
        ));
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut refused = respond(
            StatusCode::METHOD_NOT_ALLOWED,
            text,
            "GET /metrics\n".into(),
        );
        let allow = hyper::header::HeaderValue::from_static("GET, HEAD");
        refused.headers_mut().insert(hyper::header::ALLOW, allow);
        return Ok(refused);
    }
    let accept = request.headers().get_all(hyper::header::ACCEPT);
    let format = Format::accepted(accept.iter().filter_map(|a| a.to_str().ok()));
    // The guard status files are read from disk: off the runtime's threads.
    let rendered = tokio::task::spawn_blocking(move || metrics.render(format)).await;
    Ok(match rendered {
        Ok(Ok(body)) => respond(StatusCode::OK, format.content_type(), body),
        _ => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            text,
            "the metrics could not be rendered\n".into(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_scrape_gets_the_format_it_accepts_and_nothing_else_is_served() {
        let metrics = Arc::new(NodeMetrics::new(None));
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let endpoint = MetricsEndpoint::start(loopback, "V", metrics)
            .await
            .unwrap();
        let base = format!("http://{}", endpoint.address());
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let get = |path: &str, accept: &str| {
            client
                .get(format!("{base}{path}"))
                .header("accept", accept)
                .send()
        };
        let open = get(
            "/metrics",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )
        .await
        .unwrap();
        assert_eq!(open.status(), 200);
        let kind = open.headers()["content-type"].to_str().unwrap().to_string();
        assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
        assert!(open.text().await.unwrap().ends_with("# EOF\n"));
        let plain = get("/metrics", "*/*").await.unwrap();
        let kind = plain.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
        assert!(!plain.text().await.unwrap().contains("# EOF"));
        assert_eq!(get("/", "*/*").await.unwrap().status(), 404);
        let post = client.post(format!("{base}/metrics")).send().await.unwrap();
        assert_eq!(post.status(), 405);
        assert_eq!(post.headers()["allow"], "GET, HEAD");
        let taken =
            MetricsEndpoint::start(endpoint.address(), "V", Arc::new(NodeMetrics::new(None)))
                .await
                .unwrap_err()
                .to_string();
        assert!(
            taken.starts_with("V: cannot listen on 127.0.0.1:"),
            "{taken}"
        );
    }
}

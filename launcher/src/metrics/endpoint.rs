//! The `/metrics` endpoint: the text of a [`NodeMetrics`] over HTTP/1.1,
//! OpenMetrics when the scraper accepts it (Prometheus does), else the
//! Prometheus text format 0.0.4, on the address the node configures
//! (127.0.0.1 by default; `docs/metrics.md`).
//!
//! It runs on a thread of its own, with its own runtime, so that it
//! answers while the launch's runtime does blocking work (housekeeping,
//! a guard's start-up count). What it holds is bounded
//! ([`EndpointLimits`]): connections in all and per client, the time a
//! client may take to send a request head or to take an answer, and the
//! bytes read ahead per connection. A full endpoint refuses connections;
//! it never takes a descriptor beyond its bound from the launch.

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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::connections::{Closed, EndpointState, NoRoom, Room, Watched};
use super::{names, Format, NodeMetrics};

/// How long to wait before accepting again after `accept` failed (out of
/// descriptors or memory): the connection waits in the listen backlog.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// hyper's read buffer per connection, in bytes: a request head larger
/// than this is answered 431 and the connection closed. 16 KiB: a
/// scrape's head is under 1 KiB (Prometheus sends about 300 bytes), and
/// hyper takes no less than 8 KiB.
const READ_BUFFER_BYTES: usize = 16 << 10;

/// The answer to a connection there is no room for.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 61\r\nretry-after: 10\r\nconnection: close\r\n\r\nthe metrics endpoint holds all the connections it may; retry\n";

/// The bounds on what the endpoint holds (`docs/metrics.md`, "The
/// endpoint itself"); [`Default`] gives the shipped ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    /// Connections open at once, in all. Default 64: a node is scraped by
    /// one Prometheus or an HA pair, one connection each, and by `inspect`
    /// or `curl` now and then; 64 descriptors are 6% of the 1,024 a
    /// systemd service gets by default (`LimitNOFILE`'s soft limit), which
    /// the launch also needs for the server's pipes, the gateways and the
    /// guards.
    pub connections: usize,
    /// Connections open at once from one IP address. Default 8: one
    /// scraper needs one; a client that opens more takes room only from
    /// itself.
    pub per_client: usize,
    /// How long a connection may wait for a request head, in seconds:
    /// hyper's head timeout, armed at the accept and again after every
    /// answer, so it also closes a kept-alive connection idle that long.
    /// Default 10 s: a scraper sends its request as soon as it connects,
    /// and reconnects at its next scrape when its idle connection was
    /// closed.
    pub head_timeout: Duration,
    /// How long an answer may wait for its client, in seconds: from the
    /// first write that finds the socket full until everything written
    /// reached it. Default 10 s: a page is about 22 KiB with 4 guarded
    /// tiers and 4 gateways (`docs/performance.md`, "One scrape"), which
    /// the socket takes at once from a client that reads it.
    pub answer_timeout: Duration,
}

impl Default for EndpointLimits {
    fn default() -> Self {
        EndpointLimits {
            connections: 64,
            per_client: 8,
            head_timeout: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the endpoint cannot run.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address cannot be bound.
    #[error("{setting}: cannot listen on {address} for the metrics endpoint: {source}. {}", advice(.source, setting))]
    Listen {
        /// The setting that chose the address.
        setting: String,
        /// The address.
        address: SocketAddr,
        /// The bind error.
        #[source]
        source: std::io::Error,
    },
    /// Its thread or runtime cannot be made (the process is out of
    /// threads, memory or descriptors).
    #[error("cannot start the metrics endpoint's thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// What to do about a bind error `source` of the address `setting` chose.
fn advice(source: &std::io::Error, setting: &str) -> String {
    match source.kind() {
        std::io::ErrorKind::AddrNotAvailable => "The address is not one of this host's: set EREBINE_AGENT_LMCACHE_METRICS_HOST to one of its addresses, 127.0.0.1 (the default) or 0.0.0.0".to_string(),
        _ => format!("Choose another port with {setting}, or 0 to turn the endpoint off"),
    }
}

/// A running endpoint; dropping it stops it and closes its connections.
#[derive(Debug)]
pub struct MetricsEndpoint {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Listens on `address` and serves `metrics` at `GET /metrics` within
    /// the default [`EndpointLimits`], on a thread of its own. `setting`
    /// names the variable that chose the address, for the error.
    ///
    /// # Errors
    /// [`MetricsError`]: the address cannot be bound, or the thread cannot
    /// start.
    pub fn start(
        address: SocketAddr,
        setting: &str,
        metrics: Arc<NodeMetrics>,
    ) -> Result<Self, MetricsError> {
        Self::start_with(address, setting, metrics, EndpointLimits::default())
    }

    /// [`MetricsEndpoint::start`] within `limits`.
    ///
    /// # Errors
    /// [`MetricsError`], as [`MetricsEndpoint::start`].
    pub(crate) fn start_with(
        address: SocketAddr,
        setting: &str,
        metrics: Arc<NodeMetrics>,
        limits: EndpointLimits,
    ) -> Result<Self, MetricsError> {
        let listen_error = |source| MetricsError::Listen {
            setting: setting.to_string(),
            address,
            source,
        };
        let listener = std::net::TcpListener::bind(address).map_err(listen_error)?;
        listener.set_nonblocking(true).map_err(listen_error)?;
        let address = listener.local_addr().unwrap_or(address);
        // The renders read the guards' status files: two threads at most.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(2)
            .build()
            .map_err(MetricsError::Thread)?;
        let (stop, stopped) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("metrics-endpoint".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => serve(listener, metrics, limits, stopped).await,
                        Err(e) => tracing::warn!("the metrics endpoint cannot serve: {e}"),
                    }
                });
                // A render still reading a status file is not waited for.
                runtime.shutdown_background();
            })
            .map_err(MetricsError::Thread)?;
        Ok(MetricsEndpoint {
            address,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve(
    listener: TcpListener,
    metrics: Arc<NodeMetrics>,
    limits: EndpointLimits,
    mut stop: oneshot::Receiver<()>,
) {
    let room = Room {
        connections: limits.connections,
        per_client: limits.per_client,
    };
    let state = metrics.endpoint.clone();
    let mut refusals_told = false;
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!("the metrics endpoint could not accept a connection: {e}");
                tokio::time::sleep(ACCEPT_RETRY).await;
                continue;
            }
        };
        let client = peer.ip().to_canonical();
        let (id, connection) = match state.admit(client, room) {
            Ok(admitted) => admitted,
            Err(why) => {
                let _ = stream.try_write(REFUSAL);
                state.closed(Closed::Refused);
                if !refusals_told {
                    refusals_told = true;
                    let held = match why {
                        NoRoom::Full => format!("it holds {} connections", room.connections),
                        NoRoom::ClientFull => {
                            format!("{client} holds {} connections", room.per_client)
                        }
                    };
                    tracing::warn!(
                        "the metrics endpoint refused a connection from {peer}: {held}, none of them idle; it answered 503 (told once; {} counts every one)",
                        names::ENDPOINT_CLOSED_CONNECTIONS.sample
                    );
                }
                continue;
            }
        };
        let task = tokio::spawn(connection_task(
            stream,
            id,
            connection,
            metrics.clone(),
            limits,
        ));
        state.serving(id, task.abort_handle());
    }
}

/// Serves one connection until it ends, or is dropped for an answer not
/// taken; it leaves the table however it ends (also when evicted).
async fn connection_task(
    stream: TcpStream,
    id: u64,
    connection: Arc<super::connections::Connection>,
    metrics: Arc<NodeMetrics>,
    limits: EndpointLimits,
) {
    struct Leave(Arc<EndpointState>, u64);
    impl Drop for Leave {
        fn drop(&mut self) {
            self.0.ended(self.1);
        }
    }
    let _leave = Leave(metrics.endpoint.clone(), id);
    let _ = stream.set_nodelay(true);
    let io = Watched::new(stream, connection.clone(), limits.answer_timeout);
    let served = connection.clone();
    let render = metrics.clone();
    let service = service_fn(move |request| {
        served.request();
        answer(render.clone(), request)
    });
    let _ = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(READ_BUFFER_BYTES)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if connection.stalled() {
        metrics.endpoint.closed(Closed::Stalled);
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
    // The guard status files are read from disk: off the accepting thread.
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
    use std::io::{Read, Write};
    use std::net::TcpStream as Client;

    /// One request for the page, kept alive.
    const REQUEST: &[u8] = b"GET /metrics HTTP/1.1\r\nhost: t\r\n\r\n";

    /// A connection to `to` from the loopback address `from` (any of
    /// 127.0.0.0/8 is this host's), whose reads give up after 120 s.
    fn connect_from(from: [u8; 4], to: SocketAddr) -> Client {
        let socket =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.bind(&SocketAddr::from((from, 0)).into()).unwrap();
        socket.connect(&to.into()).unwrap();
        let client: Client = socket.into();
        client
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        client
    }

    /// Everything `client` reads until the endpoint closes the connection
    /// (an end of file or a reset), or an error after the read bound.
    fn read_to_close(client: &mut Client) -> Result<Vec<u8>, std::io::Error> {
        let mut read = Vec::new();
        let mut buffer = [0u8; 64 << 10];
        loop {
            match client.read(&mut buffer) {
                Ok(0) => return Ok(read),
                Ok(n) => read.extend_from_slice(&buffer[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(read),
                Err(e) => return Err(e),
            }
        }
    }

    /// The page, or the refusal, that a scrape from 127.0.0.1 gets.
    fn scrape(address: SocketAddr) -> String {
        let mut client = connect_from([127, 0, 0, 1], address);
        client
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            .unwrap();
        String::from_utf8(read_to_close(&mut client).unwrap()).unwrap()
    }

    /// The value of `series` in `page`.
    fn value(page: &str, series: &str) -> Option<f64> {
        page.lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
    }

    fn closed(page: &str, reason: &str) -> Option<f64> {
        let series = format!(
            "lmcache_tier_metrics_endpoint_closed_connections_total{{reason=\"{reason}\"}}"
        );
        value(page, &series)
    }

    fn open(page: &str, state: &str) -> Option<f64> {
        let series = format!("lmcache_tier_metrics_endpoint_connections{{state=\"{state}\"}}");
        value(page, &series)
    }

    /// Scrapes until `done` holds for the page, or panics after 120 s.
    fn scrape_until(address: SocketAddr, done: impl Fn(&str) -> bool) -> String {
        let started = std::time::Instant::now();
        loop {
            let page = scrape(address);
            if done(&page) {
                return page;
            }
            assert!(started.elapsed() < Duration::from_secs(120), "{page}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A client that sends requests for the page over and over and reads
    /// nothing (its writer stops once the endpoint stops taking them, for
    /// 2 s); dropping it closes the connection.
    struct Pipeliner {
        client: Client,
        writer: Option<std::thread::JoinHandle<()>>,
    }

    impl Pipeliner {
        fn new(from: [u8; 4], to: SocketAddr) -> Self {
            let client = connect_from(from, to);
            let mut writer = client.try_clone().unwrap();
            writer
                .set_write_timeout(Some(Duration::from_secs(2)))
                .unwrap();
            let writer = std::thread::spawn(move || {
                let requests = REQUEST.repeat(1000);
                while writer.write_all(&requests).is_ok() {}
            });
            Pipeliner {
                client,
                writer: Some(writer),
            }
        }
    }

    impl Pipeliner {
        /// Waits until the endpoint has answered one of its requests (it
        /// then counts as answering, not idle); false when the endpoint
        /// closed it first.
        fn answered(&self) -> bool {
            self.client.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0)
        }
    }

    impl Drop for Pipeliner {
        fn drop(&mut self) {
            if let Some(writer) = self.writer.take() {
                let _ = writer.join();
            }
        }
    }

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[test]
    fn it_answers_while_the_runtime_that_started_it_is_blocked() {
        // As a launch starts it, on a runtime of one thread; that thread
        // then blocks (housekeeping, a guard's start-up count) until a
        // scrape from elsewhere has been answered, or given up after the
        // read bound.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let page = runtime.block_on(async {
            let metrics = Arc::new(NodeMetrics::new(None));
            let endpoint = MetricsEndpoint::start(loopback(), "V", metrics).unwrap();
            let address = endpoint.address();
            std::thread::spawn(move || scrape(address)).join().unwrap()
        });
        assert!(page.starts_with("HTTP/1.1 200 OK"), "{page}");
        assert!(page.contains("lmcache_tier_server_up 0"), "{page}");
    }

    #[test]
    fn idle_clients_and_slow_heads_are_closed_after_the_head_bound() {
        let limits = EndpointLimits {
            head_timeout: Duration::from_secs(1),
            ..EndpointLimits::default()
        };
        let metrics = Arc::new(NodeMetrics::new(None));
        let endpoint = MetricsEndpoint::start_with(loopback(), "V", metrics, limits).unwrap();
        let address = endpoint.address();
        // One that never sends, one that stops in its head, one kept
        // alive after an answer: each is closed, none answered again.
        let mut silent = connect_from([127, 0, 0, 2], address);
        let mut slow = connect_from([127, 0, 0, 2], address);
        slow.write_all(b"GET /metr").unwrap();
        let mut kept = connect_from([127, 0, 0, 2], address);
        kept.write_all(REQUEST).unwrap();
        assert_eq!(read_to_close(&mut silent).unwrap(), b"");
        let slow = String::from_utf8(read_to_close(&mut slow).unwrap()).unwrap();
        assert!(!slow.contains("200 OK"), "{slow}");
        let kept = String::from_utf8(read_to_close(&mut kept).unwrap()).unwrap();
        assert_eq!(kept.matches("HTTP/1.1 200 OK").count(), 1, "{kept}");
        let page = scrape(address);
        assert_eq!(open(&page, "idle"), Some(0.0), "{page}");
        assert_eq!(open(&page, "answering"), Some(1.0), "{page}");
    }

    #[test]
    fn a_client_that_does_not_take_its_answers_is_dropped_after_the_answer_bound() {
        let limits = EndpointLimits {
            answer_timeout: Duration::from_secs(1),
            ..EndpointLimits::default()
        };
        let metrics = Arc::new(NodeMetrics::new(None));
        let endpoint = MetricsEndpoint::start_with(loopback(), "V", metrics, limits).unwrap();
        let address = endpoint.address();
        // One that pipelines and never reads, and one that pipelines and
        // reads a little now and then.
        let mut pipeliner = Pipeliner::new([127, 0, 0, 2], address);
        let mut trickle = Pipeliner::new([127, 0, 0, 3], address);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reading = done.clone();
        let reader = std::thread::spawn(move || {
            let mut bytes = [0u8; 16];
            while !reading.load(std::sync::atomic::Ordering::Relaxed)
                && matches!(trickle.client.read(&mut bytes), Ok(n) if n > 0)
            {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let page = scrape_until(address, |page| closed(page, "stalled") == Some(2.0));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(open(&page, "answering"), Some(1.0), "{page}");
        assert_eq!(closed(&page, "refused"), Some(0.0), "{page}");
        read_to_close(&mut pipeliner.client).unwrap();
        reader.join().unwrap();
    }

    #[test]
    fn connections_are_bounded_in_all_and_per_client() {
        let limits = EndpointLimits {
            connections: 4,
            per_client: 2,
            head_timeout: Duration::from_secs(600),
            answer_timeout: Duration::from_secs(600),
        };
        let metrics = Arc::new(NodeMetrics::new(None));
        let endpoint = MetricsEndpoint::start_with(loopback(), "V", metrics, limits).unwrap();
        let address = endpoint.address();
        let refused = "HTTP/1.1 503 Service Unavailable";
        // 127.0.0.2 holds its 2, both answering: its third is refused.
        let first = Pipeliner::new([127, 0, 0, 2], address);
        let second = Pipeliner::new([127, 0, 0, 2], address);
        scrape_until(address, |page| open(page, "answering") == Some(3.0));
        let mut third = connect_from([127, 0, 0, 2], address);
        let answer = String::from_utf8(read_to_close(&mut third).unwrap()).unwrap();
        assert!(answer.starts_with(refused), "{answer}");
        // Two idle from 127.0.0.3 fill the endpoint: a scrape closes the
        // one idle longest to make room, and is answered.
        let mut idle_first = connect_from([127, 0, 0, 3], address);
        scrape_until(address, |page| open(page, "idle") == Some(1.0));
        let mut idle_second = connect_from([127, 0, 0, 3], address);
        scrape_until(address, |page| closed(page, "evicted") == Some(1.0));
        assert_eq!(read_to_close(&mut idle_first).unwrap(), b"");
        // A client at its own bound makes room among its own connections
        // only: 127.0.0.3's next one closes its other idle one.
        let _idle_third = connect_from([127, 0, 0, 3], address);
        let _idle_fourth = connect_from([127, 0, 0, 3], address);
        assert_eq!(read_to_close(&mut idle_second).unwrap(), b"");
        // With every connection answering, a new one is refused, whoever
        // it comes from, until one of them ends. A pipeliner is idle until
        // its first request arrives: a scrape that came before closed it,
        // and another is tried.
        let fifth = Pipeliner::new([127, 0, 0, 4], address);
        assert!(fifth.answered());
        let mut sixth = Pipeliner::new([127, 0, 0, 4], address);
        let mut tries = 1;
        let full = loop {
            // On a loaded machine the scrape can reach the endpoint before
            // the sixth's first request: wait for its first answer.
            let page = match sixth.answered() {
                true => scrape(address),
                false => String::new(),
            };
            if page.starts_with(refused) {
                break page;
            }
            assert!(tries < 50, "never refused:\n{page}");
            tries += 1;
            sixth = Pipeliner::new([127, 0, 0, 4], address);
        };
        assert!(full.contains("retry"), "{full}");
        drop(sixth);
        let page = scrape_until(address, |page| page.starts_with("HTTP/1.1 200 OK"));
        assert!(closed(&page, "evicted") >= Some(4.0), "{page}");
        assert!(closed(&page, "refused") >= Some(2.0), "{page}");
        assert_eq!(closed(&page, "stalled"), Some(0.0), "{page}");
        drop((first, second, fifth));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_scrape_gets_the_format_it_accepts_and_nothing_else_is_served() {
        let metrics = Arc::new(NodeMetrics::new(None));
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let endpoint = MetricsEndpoint::start(loopback, "V", metrics).unwrap();
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
                .unwrap_err()
                .to_string();
        assert!(
            taken.starts_with("V: cannot listen on 127.0.0.1:"),
            "{taken}"
        );
    }
}

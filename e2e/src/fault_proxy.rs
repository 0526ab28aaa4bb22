//! A TCP proxy in front of a real S3 server that injects the faults of a
//! failing object store, for the gateway's fault tests and bench
//! (`tests/e2e/gateway_faults.rs`, `benches/gateway-faults.sh`).
//!
//! It exists because the real server (s3s-fs, moto) cannot be made to
//! produce these faults on demand: stall before its answer or in the middle
//! of a body, reset a connection mid-body, or answer `503 SlowDown` and
//! `500 InternalError`. A closed port ([`Fault::Refuse`]) the real server
//! can produce by stopping; the proxy offers it too so that one test can
//! switch between every fault on one port. In [`Fault::Pass`] every byte
//! goes to the real server and back unchanged, so the requests the gateway
//! signs are checked by the real server.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How many bytes of the upstream's answer on one connection pass before
/// [`Fault::StallMidBody`] or [`Fault::ResetMidBody`] strikes: past any
/// response head, well inside a body of 1 MiB or more.
pub const FAULT_AFTER_BYTES: u64 = 64 << 10;

/// What the proxy does with connections from now on. Switching closes
/// every open connection, so that a pooled keep-alive connection cannot
/// carry a request past the switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Relay both ways to the real server.
    Pass,
    /// Accept, then read and answer nothing: a hung server (its socket
    /// buffers fill, so an upload stops too).
    Stall,
    /// Relay the request; pass the first [`FAULT_AFTER_BYTES`] of the
    /// answer, then nothing more, keeping the connection open.
    StallMidBody,
    /// As [`Fault::StallMidBody`], then reset both connections (TCP RST).
    ResetMidBody,
    /// Read the request (its `content-length` body included) and answer
    /// `503 Service Unavailable` with S3's `SlowDown` error.
    SlowDown,
    /// As [`Fault::SlowDown`], with `500 Internal Server Error` and S3's
    /// `InternalError`.
    InternalError,
    /// Listen no more: connections are refused, as to a stopped server.
    Refuse,
}

/// A running proxy on 127.0.0.1, on a runtime of its own; it stops when
/// dropped (outside any async context: it owns that runtime).
pub struct FaultProxy {
    /// Its port on 127.0.0.1.
    pub port: u16,
    mode: watch::Sender<(u64, Fault)>,
    applied: Arc<AtomicU64>,
    _runtime: tokio::runtime::Runtime,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:`port` and relays to 127.0.0.1:`upstream`, in
    /// [`Fault::Pass`].
    pub fn start(port: u16, upstream: u16) -> FaultProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let listener =
            std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the proxy's port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let (mode, watched) = watch::channel((0, Fault::Pass));
        let applied = Arc::new(AtomicU64::new(0));
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream));
        let serving = applied.clone();
        runtime.spawn(async move {
            let listener = TcpListener::from_std(listener).expect("a tokio listener");
            serve(listener, upstream, watched, serving).await;
        });
        FaultProxy {
            port,
            mode,
            applied,
            _runtime: runtime,
        }
    }

    /// Switches to `fault` and returns once it is in effect: open
    /// connections are closed, and for [`Fault::Refuse`] the port is
    /// closed (for any other fault, listening again). Panics if that takes
    /// over 30 s.
    pub fn set(&self, fault: Fault) {
        let mut generation = 0;
        self.mode.send_modify(|(n, f)| {
            *n += 1;
            *f = fault;
            generation = *n;
        });
        let start = Instant::now();
        while self.applied.load(Ordering::SeqCst) < generation {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the fault proxy did not switch to {fault:?} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl FaultProxy {
    /// How many TCP connections to the proxy are established on this host
    /// (from `/proc/net/tcp`): the client ends, such as a gateway's
    /// upstream connections. A gateway that gave up on a request must not
    /// keep one open to a stalled store.
    pub fn open_client_connections(&self) -> usize {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        table
            .lines()
            .skip(1)
            .filter(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let remote_port = fields
                    .get(2)
                    .and_then(|addr| addr.rsplit(':').next())
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok());
                // State 01 is ESTABLISHED.
                remote_port == Some(self.port) && fields.get(3) == Some(&"01")
            })
            .count()
    }
}

/// Accepts connections while the fault is not [`Fault::Refuse`], and
/// records in `applied` each mode generation once it is in effect.
async fn serve(
    first: TcpListener,
    upstream: SocketAddr,
    mut mode: watch::Receiver<(u64, Fault)>,
    applied: Arc<AtomicU64>,
) {
    let port = first.local_addr().map(|a| a.port()).unwrap_or(0);
    let mut listener = Some(first);
    loop {
        let (generation, fault) = *mode.borrow_and_update();
        if fault == Fault::Refuse {
            listener = None;
        } else if listener.is_none() {
            listener = Some(bind_again(port).await);
        }
        applied.store(generation, Ordering::SeqCst);
        let accepting = async {
            match &listener {
                Some(l) => l.accept().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            accepted = accepting => {
                if let Ok((client, _)) = accepted {
                    tokio::spawn(until_switched(client, upstream, fault, mode.clone()));
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// Listens on `port` again (retried: the port may still be held briefly).
async fn bind_again(port: u16) -> TcpListener {
    loop {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await {
            Ok(listener) => return listener,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Serves one connection with `fault` until it ends or the mode changes.
async fn until_switched(
    client: TcpStream,
    upstream: SocketAddr,
    fault: Fault,
    mut mode: watch::Receiver<(u64, Fault)>,
) {
    let _ = client.set_nodelay(true);
    tokio::select! {
        _ = connection(client, upstream, fault) => {}
        _ = mode.changed() => {}
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, fault: Fault) {
    match fault {
        Fault::Pass => relay(client, upstream).await,
        Fault::Stall => {
            let _held = client;
            std::future::pending::<()>().await;
        }
        Fault::StallMidBody | Fault::ResetMidBody => {
            relay_then_fail(client, upstream, fault == Fault::ResetMidBody).await;
        }
        Fault::SlowDown => {
            let xml = s3_error("SlowDown", "Please reduce your request rate.");
            answer(client, "503 Service Unavailable", &xml).await;
        }
        Fault::InternalError => {
            let xml = s3_error(
                "InternalError",
                "We encountered an internal error. Please try again.",
            );
            answer(client, "500 Internal Server Error", &xml).await;
        }
        Fault::Refuse => {}
    }
}

/// Both directions copied until either side closes.
async fn relay(mut client: TcpStream, upstream: SocketAddr) {
    if let Ok(mut server) = TcpStream::connect(upstream).await {
        let _ = server.set_nodelay(true);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    }
}

/// The request relayed, and the first [`FAULT_AFTER_BYTES`] of the answer;
/// then silence, or a reset of both connections when `reset`.
async fn relay_then_fail(client: TcpStream, upstream: SocketAddr, reset: bool) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    if reset {
        // Closing a socket with a zero linger time sends RST, not FIN.
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
    let (mut client_read, mut client_write) = client.into_split();
    let (server_read, mut server_write) = server.into_split();
    let upload = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
        std::future::pending::<()>().await;
    });
    let mut head_of_answer = server_read.take(FAULT_AFTER_BYTES);
    let passed = tokio::io::copy(&mut head_of_answer, &mut client_write).await;
    if passed.is_ok_and(|n| n == FAULT_AFTER_BYTES) {
        if !reset {
            std::future::pending::<()>().await;
        }
        // Dropped, the write half would shut down first (a FIN); forgotten,
        // the socket closes with the read half: a bare RST.
        client_write.forget();
    }
    upload.abort();
}

/// Reads one request (head, then a `content-length` body, discarded) and
/// answers `status` with the S3 error document `xml` (no body for `HEAD`),
/// closing the connection.
async fn answer(mut client: TcpStream, status: &str, xml: &str) {
    let Some((method, body_length)) = read_request_head(&mut client).await else {
        return;
    };
    let mut body = (&mut client).take(body_length);
    if tokio::io::copy(&mut body, &mut tokio::io::sink())
        .await
        .is_err()
    {
        return;
    }
    let mut reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        xml.len()
    );
    if method != "HEAD" {
        reply.push_str(xml);
    }
    let _ = client.write_all(reply.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// The method and `content-length` of the request whose head `client`
/// sends next (bytes of the body read with the head are counted off).
async fn read_request_head(client: &mut TcpStream) -> Option<(String, u64)> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 4096];
    let end = loop {
        let n = client.read(&mut buffer).await.ok().filter(|n| *n > 0)?;
        head.extend_from_slice(&buffer[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
    let method = text.split_whitespace().next()?.to_ascii_uppercase();
    let length: u64 = text
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let already = (head.len() - end) as u64;
    Some((method, length.saturating_sub(already)))
}

/// An S3 error document, as S3 answers it.
fn s3_error(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>fault-proxy</RequestId></Error>"
    )
}

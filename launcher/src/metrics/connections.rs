//! What the metrics endpoint holds: its open connections, each in one of
//! two states, the bounds on them, and the families that show both
//! (`docs/metrics.md`, "The endpoint itself").
//!
//! A connection is `idle` while it waits for a request head (just
//! accepted, kept alive after an answer, or sending its head) and
//! `answering` from a request head until the client has taken the whole
//! answer. An idle one is closed by hyper's head timeout, and one whose
//! answer the client does not take is dropped by [`Watched`]; when the
//! endpoint or a client holds all it may, the connection that has been
//! idle longest makes room for a new one, and with none idle the new one
//! is refused.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::names;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::task::AbortHandle;

/// Why the endpoint closed a connection before its client did: a label of
/// `metrics_endpoint_closed_connections_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Closed {
    /// No room: the endpoint, or its client, held all it may and none of
    /// those connections was idle.
    Refused,
    /// Idle longest when a new connection needed its room.
    Evicted,
    /// Its client did not take an answer within the answer bound.
    Stalled,
}

impl Closed {
    const ALL: [Closed; 3] = [Closed::Refused, Closed::Evicted, Closed::Stalled];

    fn as_str(self) -> &'static str {
        match self {
            Closed::Refused => "refused",
            Closed::Evicted => "evicted",
            Closed::Stalled => "stalled",
        }
    }
}

/// A reason a connection was closed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClosedLabels {
    reason: &'static str,
}

/// A connection state, `idle` or `answering`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// One open connection, as its task and the table see it.
#[derive(Debug)]
pub(crate) struct Connection {
    /// Whether it waits for a request head.
    idle: AtomicBool,
    /// Milliseconds after the table's epoch when it last became idle or
    /// answering.
    since_ms: AtomicU64,
    /// Whether [`Watched`] dropped it for an answer not taken.
    stalled: AtomicBool,
    /// Whether a byte of an answer was written since the last request.
    wrote: AtomicBool,
    epoch: Instant,
}

impl Connection {
    fn new(epoch: Instant) -> Self {
        let connection = Connection {
            idle: AtomicBool::new(true),
            since_ms: AtomicU64::new(0),
            stalled: AtomicBool::new(false),
            wrote: AtomicBool::new(false),
            epoch,
        };
        connection.stamp();
        connection
    }

    fn stamp(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.since_ms.store(ms, Ordering::Relaxed);
    }

    /// A request head arrived: it answers from now on.
    pub(crate) fn request(&self) {
        self.idle.store(false, Ordering::Relaxed);
        self.wrote.store(false, Ordering::Relaxed);
        self.stamp();
    }

    /// Everything written so far reached the socket: idle again once an
    /// answer was written.
    fn flushed(&self) {
        if self.wrote.swap(false, Ordering::Relaxed) {
            self.idle.store(true, Ordering::Relaxed);
            self.stamp();
        }
    }

    /// Whether [`Watched`] dropped it because its client did not take an
    /// answer.
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }
}

/// An open connection in the table: its client, its state, its task.
#[derive(Debug)]
struct Open {
    client: IpAddr,
    connection: Arc<Connection>,
    task: Option<AbortHandle>,
}

/// The bounds on what the endpoint holds ([`super::EndpointLimits`]) that
/// the table applies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Room {
    /// Connections open at once, in all.
    pub(crate) connections: usize,
    /// Connections open at once from one IP address.
    pub(crate) per_client: usize,
}

/// Why a new connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// The endpoint holds `connections`, none idle.
    Full,
    /// Its client holds `per_client`, none idle.
    ClientFull,
}

/// What the endpoint holds, and what it turned away; one per
/// [`super::NodeMetrics`], shared with the endpoint serving it.
#[derive(Debug)]
pub(crate) struct EndpointState {
    open: Mutex<Table>,
    closed: Family<ClosedLabels, Counter>,
    epoch: Instant,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    open: HashMap<u64, Open>,
}

impl Table {
    /// The connection idle longest among those `of` selects.
    fn idle_longest(&self, of: impl Fn(&Open) -> bool) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, o)| of(o) && o.connection.idle.load(Ordering::Relaxed))
            .min_by_key(|(id, o)| (o.connection.since_ms.load(Ordering::Relaxed), **id))
            .map(|(id, _)| *id)
    }
}

impl EndpointState {
    /// An empty table, with its families registered in `registry`.
    pub(crate) fn register(registry: &mut Registry) -> Arc<Self> {
        let state = Arc::new(EndpointState {
            open: Mutex::default(),
            closed: Family::default(),
            epoch: Instant::now(),
        });
        for reason in Closed::ALL {
            state
                .closed
                .get_or_create(&ClosedLabels {
                    reason: reason.as_str(),
                })
                .inc_by(0);
        }
        registry.register(
            names::ENDPOINT_CLOSED_CONNECTIONS.name,
            "Connections the metrics endpoint closed before their client did: refused (no room, none idle), evicted (idle longest when a new one needed room), stalled (an answer not taken in time)",
            state.closed.clone(),
        );
        registry.register_collector(Box::new(state.clone()));
        state
    }

    /// Counts a connection closed for `why`.
    pub(crate) fn closed(&self, why: Closed) {
        self.closed
            .get_or_create(&ClosedLabels {
                reason: why.as_str(),
            })
            .inc();
    }

    /// Admits a connection from `client` within `room`: its id and state,
    /// after closing the connection idle longest (of that client when it
    /// holds `per_client`, else of all when the endpoint holds
    /// `connections`) if there is no room otherwise.
    ///
    /// # Errors
    /// [`NoRoom`]: there is no room and nothing idle to make it.
    pub(crate) fn admit(
        &self,
        client: IpAddr,
        room: Room,
    ) -> Result<(u64, Arc<Connection>), NoRoom> {
        let Ok(mut table) = self.open.lock() else {
            return Err(NoRoom::Full);
        };
        let from_client = table.open.values().filter(|o| o.client == client).count();
        let victim = if from_client >= room.per_client {
            Some(
                table
                    .idle_longest(|o| o.client == client)
                    .ok_or(NoRoom::ClientFull)?,
            )
        } else if table.open.len() >= room.connections {
            Some(table.idle_longest(|_| true).ok_or(NoRoom::Full)?)
        } else {
            None
        };
        if let Some(open) = victim.and_then(|id| table.open.remove(&id)) {
            if let Some(task) = open.task {
                task.abort();
            }
            self.closed(Closed::Evicted);
        }
        let id = table.next;
        table.next += 1;
        let connection = Arc::new(Connection::new(self.epoch));
        table.open.insert(
            id,
            Open {
                client,
                connection: connection.clone(),
                task: None,
            },
        );
        Ok((id, connection))
    }

    /// Records `task` as the one serving connection `id`, so that an
    /// eviction can end it.
    pub(crate) fn serving(&self, id: u64, task: AbortHandle) {
        if let Ok(mut table) = self.open.lock() {
            match table.open.get_mut(&id) {
                Some(open) => open.task = Some(task),
                None => task.abort(),
            }
        }
    }

    /// Forgets connection `id` (its task ended, or was ended).
    pub(crate) fn ended(&self, id: u64) {
        if let Ok(mut table) = self.open.lock() {
            table.open.remove(&id);
        }
    }

    /// Open connections now: idle, answering.
    fn counts(&self) -> (usize, usize) {
        let Ok(table) = self.open.lock() else {
            return (0, 0);
        };
        let idle = table
            .open
            .values()
            .filter(|o| o.connection.idle.load(Ordering::Relaxed))
            .count();
        (idle, table.open.len() - idle)
    }
}

impl Collector for EndpointState {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (idle, answering) = self.counts();
        let mut family = encoder.encode_descriptor(
            names::ENDPOINT_CONNECTIONS.name,
            "Connections the metrics endpoint holds open now, by state: idle (waiting for a request head), answering (a request read, its answer not yet taken whole)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (state, count) in [("idle", idle), ("answering", answering)] {
            let labels = StateLabels { state };
            ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The error of a write that waited longer than the answer bound for its
/// client ([`Watched`]).
#[derive(Debug, thiserror::Error)]
#[error("the client took no answer for {} s", .0.as_secs())]
pub(crate) struct AnswerNotTaken(Duration);

/// A connection's socket whose writes fail once its client has left an
/// answer untaken for `limit`: from the first write that found the socket
/// full until everything written so far reached it. A scraper reads its
/// answer as it comes; a client that pipelines requests without reading,
/// or reads a few bytes at a time, is dropped then. It also tells
/// `connection` when an answer has been taken whole.
pub(crate) struct Watched {
    stream: TcpStream,
    connection: Arc<Connection>,
    limit: Duration,
    /// Armed at the first write that could not proceed since the last
    /// complete flush.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Watched {
    /// `stream`, serving `connection`, its answers to be taken within
    /// `limit`.
    pub(crate) fn new(stream: TcpStream, connection: Arc<Connection>, limit: Duration) -> Self {
        Watched {
            stream,
            connection,
            limit,
            deadline: None,
        }
    }

    /// `outcome` of a write or flush: an error once writes have waited
    /// `limit` for the client.
    fn watch<R>(
        &mut self,
        outcome: Poll<std::io::Result<R>>,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<R>> {
        if outcome.is_ready() {
            return outcome;
        }
        let limit = self.limit;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.connection.stalled.store(true, Ordering::Relaxed);
                Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    AnswerNotTaken(limit),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn wrote(&self, outcome: &Poll<std::io::Result<usize>>) {
        if matches!(outcome, Poll::Ready(Ok(n)) if *n > 0) {
            self.connection.wrote.store(true, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(&outcome);
        this.watch(outcome, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(&outcome);
        this.watch(outcome, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let outcome = Pin::new(&mut this.stream).poll_flush(cx);
        if let Poll::Ready(Ok(())) = outcome {
            this.deadline = None;
            this.connection.flushed();
        }
        this.watch(outcome, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

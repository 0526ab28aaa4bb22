//! What `inspect` shows of the launch itself: its server's starts, exits
//! and time to ready, and what its housekeeping deleted, read back from the
//! launch's metrics endpoint (`docs/metrics.md`). These are the numbers the
//! endpoint exports, read, not counted a second time.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use lmcache_s3_gateway::{capped_body, BodyError};
use serde::Serialize;

use crate::metrics::names;

/// The launch's own figures, from its metrics endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LaunchFigures {
    /// Starts of the server (`server_starts_total`).
    pub starts: u64,
    /// Restarts after the server ended (`server_restarts_total`).
    pub restarts: u64,
    /// Ends of the server process by cause (`server_exits_total`).
    pub exits: BTreeMap<String, u64>,
    /// Seconds from the last start to the first healthy `/status`.
    pub ready_seconds: Option<f64>,
    /// Engine workers lost, every cause together
    /// (`engine_workers_lost_total`).
    pub workers_lost: u64,
    /// The same by cause: `reaped` (silent while the server answered),
    /// `server_restarted` (not back after a restart); empty from a launch
    /// that does not label them.
    pub workers_lost_by_cause: BTreeMap<String, u64>,
    /// Engine workers that unregistered cleanly
    /// (`engine_workers_detached_total`).
    pub workers_detached: u64,
    /// Entries housekeeping deleted at the launch, by reason.
    pub housekeeping_deleted: BTreeMap<String, u64>,
    /// When that housekeeping ended, Unix seconds.
    pub housekeeping_at_unix: Option<f64>,
    /// Whether that housekeeping purged more than half of the tier because
    /// the launch identity differed (`housekeeping_identity_purge`).
    pub identity_purge: bool,
    /// The fields that differed then (`housekeeping_identity_change`).
    pub identity_changes: Vec<IdentityChange>,
    /// The adapters' per-tier series (every family labelled `tier` and
    /// `kind`; `docs/metrics.md`, "Tier series"), in the endpoint's order.
    pub tier_series: Vec<TierFigure>,
}

/// One value of an adapter's per-tier series, as the endpoint exports it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierFigure {
    /// The tier's position in the cascade.
    pub tier: usize,
    /// The tier's `type`, e.g. `resp`.
    pub kind: String,
    /// The sample's name without `lmcache_tier_`, e.g.
    /// `resp_used_memory_bytes`.
    pub name: String,
    /// Its value.
    pub value: f64,
}

/// One field of a purge by identity, as the metrics endpoint exports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdentityChange {
    /// The field (`model`, `kv_world_size`, `chunk_size`, ...).
    pub field: String,
    /// The value the tier held.
    pub stored: String,
    /// The launch's value.
    pub current: String,
}

/// What was found at the launch's metrics endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum LaunchMetrics {
    /// `EREBINE_AGENT_LMCACHE_METRICS_PORT` is 0.
    Off,
    /// Nothing usable answered: no launch runs, or it serves elsewhere.
    NoAnswer {
        /// The scraped URL.
        url: String,
        /// Why.
        why: String,
    },
    /// The launch's figures.
    Read {
        /// The scraped URL.
        url: String,
        /// What it says.
        figures: LaunchFigures,
    },
}

/// The URL to scrape for a launch serving on `address` (an endpoint on
/// every interface is scraped on loopback).
pub(crate) fn metrics_url(address: SocketAddr) -> String {
    let host = match address.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_string(),
        ip if ip.is_unspecified() => "[::1]".to_string(),
        ip if ip.is_ipv6() => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("http://{host}:{}/metrics", address.port())
}

/// The largest answer read from the metrics port, in bytes: a launch's page
/// is about 22 KiB with 4 guarded tiers and 4 gateways (`docs/performance.md`,
/// "One scrape"), so 1 MiB holds one of hundreds of tiers. Whatever else
/// holds the port is not trusted to answer that little: reading stops at
/// the bound (`docs/inspect.md`).
pub const METRICS_MAX_BYTES: usize = 1 << 20;

/// Scrapes `url` within `timeout` and reads the launch's figures, from an
/// answer of at most [`METRICS_MAX_BYTES`]: a larger one is cut there,
/// read no further, and said to be no launch's.
pub async fn read(url: &str, timeout: Duration) -> LaunchMetrics {
    let no_answer = |why: String| LaunchMetrics::NoAnswer {
        url: url.to_string(),
        why,
    };
    let client = match reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(e) => return no_answer(e.to_string()),
    };
    let response = match client.get(url).send().await {
        Ok(response) => response,
        Err(e) => return no_answer(lmcache_tier_spec::error_chain(&e.without_url())),
    };
    if !response.status().is_success() {
        return no_answer(format!("HTTP {}", response.status().as_u16()));
    }
    let body = match capped_body(response, METRICS_MAX_BYTES).await {
        Ok(body) => body,
        Err(BodyError::TooLarge { limit }) => {
            return no_answer(format!(
                "the answer is larger than {} KiB, read no further: not a launch's metrics",
                limit >> 10
            ))
        }
        Err(e) => return no_answer(e.to_string()),
    };
    let text = String::from_utf8_lossy(&body);
    match text.contains(names::SERVER_STARTS.sample) {
        true => LaunchMetrics::Read {
            url: url.to_string(),
            figures: parse(&text),
        },
        false => no_answer("the answer is not a launch's metrics".to_string()),
    }
}

/// The launch's figures in a scrape in the Prometheus text format.
pub fn parse(text: &str) -> LaunchFigures {
    let mut figures = LaunchFigures::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some(sample) = Sample::parse(line) {
            figures.record(&sample);
        }
    }
    figures
}

/// One sample line of a scrape: its name, labels and value.
struct Sample<'a> {
    name: &'a str,
    labels: Vec<(String, String)>,
    value: f64,
}

impl<'a> Sample<'a> {
    /// The sample of `line`; `None` for a line that is none.
    fn parse(line: &'a str) -> Option<Self> {
        let (series, value) = line.rsplit_once(' ')?;
        let value = value.parse::<f64>().ok()?;
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, parse_labels(labels)),
            None => (series, Vec::new()),
        };
        Some(Sample {
            name,
            labels,
            value,
        })
    }

    /// The value of its label `key`.
    fn label(&self, key: &str) -> Option<String> {
        self.labels
            .iter()
            .find_map(|(k, v)| (k == key).then(|| v.clone()))
    }
}

impl LaunchFigures {
    /// Takes in what `sample` says, when it is one of the launch's
    /// families (`crate::metrics::names`).
    fn record(&mut self, sample: &Sample) {
        let value = sample.value;
        let count = value.max(0.0) as u64;
        let label = |key: &str| sample.label(key);
        match sample.name {
            n if n == names::SERVER_STARTS.sample => self.starts = count,
            n if n == names::SERVER_RESTARTS.sample => self.restarts = count,
            n if n == names::SERVER_READY.sample => self.ready_seconds = Some(value),
            n if n == names::ENGINE_WORKERS_LOST.sample => match label("cause") {
                Some(cause) => {
                    self.workers_lost += count;
                    self.workers_lost_by_cause.insert(cause, count);
                }
                None => self.workers_lost = count,
            },
            n if n == names::ENGINE_WORKERS_DETACHED.sample => self.workers_detached = count,
            n if n == names::SERVER_EXITS.sample => {
                if let Some(cause) = label("cause") {
                    self.exits.insert(cause, count);
                }
            }
            n if n == names::HOUSEKEEPING_DELETED_OBJECTS.sample => {
                if let Some(reason) = label("reason") {
                    self.housekeeping_deleted.insert(reason, count);
                }
            }
            n if n == names::HOUSEKEEPING_LAST_RUN.sample && value > 0.0 => {
                self.housekeeping_at_unix = Some(value);
            }
            n if n == names::HOUSEKEEPING_IDENTITY_PURGE.sample => {
                self.identity_purge = value > 0.0
            }
            n if n == names::HOUSEKEEPING_IDENTITY_CHANGE.sample && value > 0.0 => {
                if let (Some(field), Some(stored), Some(current)) =
                    (label("field"), label("stored"), label("current"))
                {
                    self.identity_changes.push(IdentityChange {
                        field,
                        stored,
                        current,
                    });
                }
            }
            name => self.record_tier_series(name, sample),
        }
    }

    /// Takes in a sample of an adapter's per-tier series: one of the
    /// launch's families with a `tier` and a `kind` label.
    fn record_tier_series(&mut self, name: &str, sample: &Sample) {
        let (Some(name), Some(tier), Some(kind)) = (
            name.strip_prefix(names::PREFIX)
                .and_then(|n| n.strip_prefix('_')),
            sample.label("tier").and_then(|t| t.parse().ok()),
            sample.label("kind"),
        ) else {
            return;
        };
        self.tier_series.push(TierFigure {
            tier,
            kind,
            name: name.to_string(),
            value: sample.value,
        });
    }
}

/// The adapters' per-tier series in words, a line per tier, for the text
/// view: `L2 tier 1 (resp): resp_up 1, resp_used_memory_bytes 1048576`.
pub fn describe_tiers(figures: &LaunchFigures) -> Vec<String> {
    let mut lines: Vec<(usize, String)> = Vec::new();
    for figure in &figures.tier_series {
        let value = format!("{} {}", figure.name, figure.value);
        match lines.iter_mut().find(|(tier, _)| *tier == figure.tier) {
            Some((_, line)) => line.push_str(&format!(", {value}")),
            None => lines.push((
                figure.tier,
                format!("L2 tier {} ({}): {value}", figure.tier, figure.kind),
            )),
        }
    }
    lines.into_iter().map(|(_, line)| line).collect()
}

/// The labels of a series, `key="value",...}` as the text formats write
/// them: values may hold `,`, `=`, `}` and the escapes `\\`, `\"` and
/// `\n` (a model path does). Stops at the first pair that is not so shaped.
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let key = key.trim_start_matches([',', ' ']);
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break Some(i),
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => break None,
                },
                Some((_, c)) => value.push(c),
                None => break None,
            }
        };
        let Some(end) = end else { break };
        labels.push((key.to_string(), value));
        rest = &after[end + 1..];
    }
    labels
}

/// The figures in words, for the text view: `2 start(s), 1 restart(s);
/// exits: oom_kill 1, signal 0, ...; ready in 5.2 s; engine workers lost: 1
/// (server_restarted 1); housekeeping deleted other_model 1`.
pub fn describe(figures: &LaunchFigures) -> String {
    let mut out = format!(
        "{} start(s), {} restart(s)",
        figures.starts, figures.restarts
    );
    if !figures.exits.is_empty() {
        let exits: Vec<String> = figures
            .exits
            .iter()
            .map(|(cause, n)| format!("{cause} {n}"))
            .collect();
        out.push_str(&format!("; exits: {}", exits.join(", ")));
    }
    if let Some(seconds) = figures.ready_seconds.filter(|s| *s > 0.0) {
        out.push_str(&format!("; ready in {seconds:.1} s"));
    }
    if figures.workers_lost > 0 {
        out.push_str(&format!("; engine workers lost: {}", figures.workers_lost));
        let causes: Vec<String> = figures
            .workers_lost_by_cause
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(cause, n)| format!("{cause} {n}"))
            .collect();
        if !causes.is_empty() {
            out.push_str(&format!(" ({})", causes.join(", ")));
        }
    }
    if figures.workers_detached > 0 {
        out.push_str(&format!(
            "; engine workers detached: {}",
            figures.workers_detached
        ));
    }
    let deleted: Vec<String> = figures
        .housekeeping_deleted
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(reason, n)| format!("{reason} {n}"))
        .collect();
    match (deleted.is_empty(), figures.housekeeping_at_unix) {
        (false, _) => out.push_str(&format!("; housekeeping deleted {}", deleted.join(", "))),
        (true, Some(_)) => out.push_str("; housekeeping deleted nothing"),
        (true, None) => {}
    }
    if figures.identity_purge {
        let changes: Vec<String> = figures
            .identity_changes
            .iter()
            .map(|c| format!("{} {:?} -> {:?}", c.field, c.stored, c.current))
            .collect();
        out.push_str("; WARNING: it purged most of the tier because the launch identity differed");
        if !changes.is_empty() {
            out.push_str(&format!(" ({})", changes.join(", ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Format, NodeMetrics};
    use crate::status::events::{Event, LossCause};
    use crate::status::oom::OomReading;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A port on loopback whose every answer is 200 with the headers
    /// `head` and then `unit` over and over, until the client goes; with
    /// the bytes of body it got written.
    fn endless(head: &'static str, unit: Vec<u8>) -> (u16, Arc<AtomicU64>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = Arc::new(AtomicU64::new(0));
        let written = sent.clone();
        std::thread::spawn(move || {
            let body = unit.repeat((64 << 10) / unit.len());
            for mut stream in listener.incoming().flatten() {
                let _ = stream.read(&mut [0u8; 4096]);
                let _ = stream.write_all(format!("HTTP/1.1 200 OK\r\n{head}\r\n").as_bytes());
                while stream.write_all(&body).is_ok() {
                    written.fetch_add(body.len() as u64, Ordering::Relaxed);
                }
            }
        });
        (port, sent)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_over_the_bound_is_cut_there_and_said_to_be_none_of_a_launchs() {
        // A page's first line, then the same for ever: announced as 2 GiB,
        // chunked, or until the connection closes.
        let line = b"lmcache_tier_server_starts_total 1\n".to_vec();
        let mut chunk = format!("{:x}\r\n", line.len()).into_bytes();
        chunk.extend_from_slice(&line);
        chunk.extend_from_slice(b"\r\n");
        for (head, unit) in [
            ("content-length: 2147483648\r\n", line.clone()),
            ("transfer-encoding: chunked\r\n", chunk),
            ("connection: close\r\n", line),
        ] {
            let (port, sent) = endless(head, unit);
            let url = format!("http://127.0.0.1:{port}/metrics");
            let read = read(&url, Duration::from_secs(600)).await;
            let LaunchMetrics::NoAnswer { why, .. } = &read else {
                panic!("{head}: {read:?}");
            };
            assert_eq!(
                why, "the answer is larger than 1024 KiB, read no further: not a launch's metrics",
                "{head}"
            );
            // Beyond the bound, only what the sockets' buffers hold.
            let written = sent.load(Ordering::Relaxed);
            assert!(written < 64 << 20, "{head}: {written} bytes written");
        }
        // A launch's page is read whole.
        let metrics = Arc::new(NodeMetrics::new(None));
        let endpoint =
            crate::metrics::MetricsEndpoint::start("127.0.0.1:0".parse().unwrap(), "V", metrics)
                .unwrap();
        let read = read(&metrics_url(endpoint.address()), Duration::from_secs(60)).await;
        assert!(matches!(read, LaunchMetrics::Read { .. }), "{read:?}");
    }

    #[test]
    fn any_kinds_tier_series_are_exported_and_read_back_into_their_tiers_block() {
        use lmcache_tier_spec::adapter::{SeriesSource, TierSeries};
        // A stand-in for an adapter's source (any kind's: the metrics and
        // inspect know none by name); the real Redis one is tested in
        // adapters/resp/tests/redis.rs and tests/e2e/redis.rs.
        struct Fixed;
        impl SeriesSource for Fixed {
            fn series(&self) -> Vec<TierSeries> {
                let one = |family, tier, bytes, counter, value| TierSeries {
                    family,
                    help: "A stand-in's figure.",
                    tier,
                    kind: "resp",
                    bytes,
                    counter,
                    value,
                };
                vec![
                    one("resp_used_memory", 1, true, false, 1 << 20),
                    one("resp_keyspace_hits", 1, false, true, 7),
                    one("resp_used_memory", 3, true, false, 5),
                ]
            }
        }
        let metrics = NodeMetrics::new(None);
        let without = metrics.render(Format::Prometheus).unwrap();
        assert!(
            !without.contains("kind=\""),
            "no series before a source: {without}"
        );
        assert!(parse(&without).tier_series.is_empty());
        metrics.watch_series(Arc::new(Fixed));
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let page = metrics.render(format).unwrap();
            assert!(
                page.contains(
                    "lmcache_tier_resp_used_memory_bytes{tier=\"1\",kind=\"resp\"} 1048576"
                ),
                "{page}"
            );
            assert!(
                page.contains("# HELP lmcache_tier_resp_keyspace_hits"),
                "{page}"
            );
            let figures = parse(&page);
            let names: Vec<(usize, &str)> = figures
                .tier_series
                .iter()
                .map(|f| (f.tier, f.name.as_str()))
                .collect();
            assert_eq!(
                names,
                [
                    (1, "resp_used_memory_bytes"),
                    (3, "resp_used_memory_bytes"),
                    (1, "resp_keyspace_hits_total")
                ],
                "{format:?}"
            );
            assert_eq!(
                describe_tiers(&figures),
                [
                    "L2 tier 1 (resp): resp_used_memory_bytes 1048576, resp_keyspace_hits_total 7",
                    "L2 tier 3 (resp): resp_used_memory_bytes 5"
                ]
            );
        }
    }

    #[test]
    fn the_figures_are_the_endpoints_numbers_read_back() {
        let metrics = NodeMetrics::new(None);
        let server = metrics.server();
        server.started(1);
        server.observe(&Event::Ready);
        let oom = OomReading::Rose {
            file: "/cg/memory.events".into(),
            before: 0,
            after: 1,
        };
        server.observe(&Event::exited(std::process::ExitStatus::from_raw(9), &oom));
        server.started(2);
        server.observe(&Event::Ready);
        server.observe(&Event::WorkersLost {
            before: 2,
            now: 0,
            cause: LossCause::ServerRestarted,
        });
        let figures = parse(&metrics.render(Format::Prometheus).unwrap());
        assert_eq!((figures.starts, figures.restarts), (2, 1));
        assert_eq!(figures.exits.get("oom_kill"), Some(&1));
        assert_eq!(figures.exits.get("unresponsive"), Some(&0));
        assert!(figures.ready_seconds.is_some());
        assert_eq!(figures.workers_lost, 2);
        assert_eq!(
            figures.workers_lost_by_cause,
            BTreeMap::from([("reaped".into(), 0), ("server_restarted".into(), 2)])
        );
        assert_eq!(figures.housekeeping_at_unix, None);
        let text = describe(&figures);
        assert!(
            text.starts_with("2 start(s), 1 restart(s); exits: oom_kill 1"),
            "{text}"
        );
        assert!(
            text.contains("; engine workers lost: 2 (server_restarted 2)"),
            "{text}"
        );
    }

    #[test]
    fn an_unlabelled_count_of_lost_workers_is_read_as_the_total() {
        let figures = parse("lmcache_tier_engine_workers_lost_total 3\n");
        assert_eq!(figures.workers_lost, 3);
        assert!(figures.workers_lost_by_cause.is_empty());
    }

    #[test]
    fn label_values_are_read_whatever_they_hold() {
        let text = concat!(
            "lmcache_tier_housekeeping_identity_purge 1\n",
            r#"lmcache_tier_housekeeping_identity_change{field="model",stored="/m/a,b=c} \"q\" \\x",current="Org/M"} 1"#,
            "\n",
            r#"lmcache_tier_housekeeping_identity_change{field="kv_world_size",stored="8",current="1"} 1"#,
            "\n",
        );
        let figures = parse(text);
        assert!(figures.identity_purge);
        assert_eq!(
            figures.identity_changes,
            vec![
                IdentityChange {
                    field: "model".into(),
                    stored: r#"/m/a,b=c} "q" \x"#.into(),
                    current: "Org/M".into(),
                },
                IdentityChange {
                    field: "kv_world_size".into(),
                    stored: "8".into(),
                    current: "1".into(),
                },
            ]
        );
        let words = describe(&figures);
        assert!(
            words.contains("WARNING: it purged most of the tier")
                && words.contains(r#"kv_world_size "8" -> "1""#),
            "{words}"
        );
    }

    #[test]
    fn an_endpoint_on_every_interface_is_scraped_on_loopback() {
        let url = |a: &str| metrics_url(a.parse().unwrap());
        assert_eq!(url("0.0.0.0:8091"), "http://127.0.0.1:8091/metrics");
        assert_eq!(url("[::]:8091"), "http://[::1]:8091/metrics");
        assert_eq!(url("[::1]:9"), "http://[::1]:9/metrics");
        assert_eq!(url("10.0.0.7:8091"), "http://10.0.0.7:8091/metrics");
    }
}

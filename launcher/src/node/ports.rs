//! The TCP ports a launch listens on, the setting each comes from, and the
//! check that no two of them share a port (`docs/configuration.md`,
//! "Ports").
//!
//! The server listens on two ports on 127.0.0.1: ZMQ for the engine and
//! HTTP for `/status` (LMCache 0.5.6 opens no other; its Prometheus
//! fallback server is off in `lmcache server`). Each comes from its
//! variable, or from `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, whose flag wins.
//! The launch itself serves its metrics on a third (`docs/metrics.md`),
//! unless that is turned off.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, TcpListener};

use crate::node::config_error::ConfigError;
use crate::node::env::{NodeEnv, HTTP_PORT, LMCACHE_EXTRA_ARGS, METRICS_PORT, MP_PORT};

/// Where a port's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PortSource {
    /// A variable (set, or its default).
    Variable(&'static str),
    /// A flag in `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`.
    ExtraArgs(&'static str),
}

/// A port the launch listens on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Listener {
    /// What listens there, in words (`"the server's ZMQ port"`).
    pub role: &'static str,
    /// The setting it comes from.
    pub source: PortSource,
    /// The address it listens on: 127.0.0.1, or the metrics endpoint's
    /// `EREBINE_AGENT_LMCACHE_METRICS_HOST`.
    pub host: IpAddr,
    /// The TCP port.
    pub port: u16,
}

impl Listener {
    /// The setting to change, in words: `EREBINE_AGENT_LMCACHE_MP_PORT`,
    /// or `--port in EREBINE_AGENT_LMCACHE_EXTRA_ARGS`.
    pub fn setting(&self) -> String {
        match self.source {
            PortSource::Variable(name) => name.to_string(),
            PortSource::ExtraArgs(flag) => format!("{flag} in {LMCACHE_EXTRA_ARGS}"),
        }
    }
}

impl fmt::Display for Listener {
    /// The setting with its value: `EREBINE_AGENT_LMCACHE_MP_PORT=6555`, or
    /// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS --port 6555`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.source {
            PortSource::Variable(name) => write!(f, "{name}={}", self.port),
            PortSource::ExtraArgs(flag) => write!(f, "{LMCACHE_EXTRA_ARGS} {flag} {}", self.port),
        }
    }
}

/// The ports a launch of `node` listens on, each with the setting that
/// chose it: the server's, in the order it opens them, then the metrics
/// endpoint's when it is on.
pub fn listeners(node: &NodeEnv) -> Vec<Listener> {
    let mut all = vec![zmq_listener(node), http_listener(node)];
    all.extend(metrics_listener(node));
    all
}

/// The node's metrics endpoint: `EREBINE_AGENT_LMCACHE_METRICS_PORT` on
/// `EREBINE_AGENT_LMCACHE_METRICS_HOST`; `None` when the port is 0 (off).
pub(crate) fn metrics_listener(node: &NodeEnv) -> Option<Listener> {
    node.metrics.map(|address| Listener {
        role: "the metrics endpoint",
        source: PortSource::Variable(METRICS_PORT),
        host: address.ip(),
        port: address.port(),
    })
}

/// The server's ZMQ port: `--port` in `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`,
/// else `EREBINE_AGENT_LMCACHE_MP_PORT`.
pub(crate) fn zmq_listener(node: &NodeEnv) -> Listener {
    pick(
        node,
        "the server's ZMQ port",
        "--port",
        MP_PORT,
        node.mp_port,
    )
}

/// The server's HTTP port (`/status`): `--http-port` in
/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, else
/// `EREBINE_AGENT_LMCACHE_HTTP_PORT`.
pub fn http_listener(node: &NodeEnv) -> Listener {
    pick(
        node,
        "the server's HTTP port",
        "--http-port",
        HTTP_PORT,
        node.http_port,
    )
}

fn pick(
    node: &NodeEnv,
    role: &'static str,
    flag: &'static str,
    variable: &'static str,
    value: u16,
) -> Listener {
    let (source, port) = match node.extra_args.value(flag).and_then(|v| v.parse().ok()) {
        Some(port) => (PortSource::ExtraArgs(flag), port),
        None => (PortSource::Variable(variable), value),
    };
    Listener {
        role,
        source,
        host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port,
    }
}

/// Fails when two of `listeners` ask for the same port: only one of them
/// could bind it, and the server would fail at start. (A port on
/// 127.0.0.1 and the same port on another address of the host could both
/// be bound, but one on 0.0.0.0 covers 127.0.0.1, so any two are refused.)
///
/// Errors: [`ConfigError::PortClash`], naming both settings.
pub fn check_distinct(listeners: &[Listener]) -> Result<(), ConfigError> {
    for (i, first) in listeners.iter().enumerate() {
        if let Some(second) = listeners[i + 1..].iter().find(|l| l.port == first.port) {
            return Err(ConfigError::PortClash {
                first: format!("{first} ({})", first.role),
                second: format!("{second} ({})", second.role),
                port: first.port,
            });
        }
    }
    Ok(())
}

/// A port of the launch that cannot be listened on: taken, not an address
/// of this host, or refused by the kernel for another reason.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// A port the launch needs is taken.
    #[error("{listener}: port {port} on {} is already in use ({detail}). Stop what holds it (`ss -ltnp 'sport = :{port}'`) or choose another port with {}", listener.host, listener.setting())]
    PortInUse {
        /// The listener whose port is taken, with its setting.
        listener: Listener,
        /// The port.
        port: u16,
        /// The bind error.
        detail: String,
    },
    /// A listener cannot be opened for another reason than a taken port
    /// or a foreign address: the kernel's error as it gave it (too many
    /// open files, a privileged port, an address that needs a scope).
    #[error("{listener}: cannot listen on {}: {source}. {}", std::net::SocketAddr::new(listener.host, *port), listen_advice(source, listener))]
    CannotListen {
        /// The listener, with its setting.
        listener: Listener,
        /// The port.
        port: u16,
        /// The bind error.
        source: std::io::Error,
    },
    /// A listener's address is not one of this host's (only the metrics
    /// endpoint's host can be set).
    #[error("EREBINE_AGENT_LMCACHE_METRICS_HOST={host}: not an address of this host ({detail}). Set it to one of the host's addresses, 127.0.0.1 (the default) or 0.0.0.0")]
    NotAnAddressHere {
        /// The address.
        host: std::net::IpAddr,
        /// The bind error.
        detail: String,
    },
}

/// Fails when a port of `listeners` ([`listeners`]) cannot be listened on
/// now: taken, or refused by the kernel (each with its setting and what to
/// do). [`crate::Facts::measure`] runs it before a launch creates anything;
/// a restart runs it before the server starts again.
pub fn check_free(listeners: &[Listener]) -> Result<(), ListenError> {
    for listener in listeners {
        if let Err(e) = TcpListener::bind((listener.host, listener.port)) {
            return Err(match e.kind() {
                std::io::ErrorKind::AddrNotAvailable => ListenError::NotAnAddressHere {
                    host: listener.host,
                    detail: e.to_string(),
                },
                std::io::ErrorKind::AddrInUse => ListenError::PortInUse {
                    listener: listener.clone(),
                    port: listener.port,
                    detail: e.to_string(),
                },
                _ => ListenError::CannotListen {
                    listener: listener.clone(),
                    port: listener.port,
                    source: e,
                },
            });
        }
    }
    Ok(())
}

/// What to do about a bind error that is not a taken port.
fn listen_advice(source: &std::io::Error, listener: &Listener) -> String {
    match source.raw_os_error() {
        Some(libc::EMFILE | libc::ENFILE) => "This process or the host has no file descriptors left: raise the limit (`ulimit -n`, systemd's LimitNOFILE) or find what holds them (`ls /proc/<pid>/fd | wc -l`)".to_string(),
        Some(libc::EACCES) => format!("Ports below 1024 need privilege: choose a port of 1024 or above with {}", listener.setting()),
        _ => format!("Check the address and the port of {}", listener.setting()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::env::text_vars;

    fn node(vars: &[(&str, &str)]) -> NodeEnv {
        let home = [("HOME", "/home/node")];
        NodeEnv::from_vars(&text_vars(home.iter().chain(vars).copied())).unwrap()
    }

    fn clash(vars: &[(&str, &str)]) -> String {
        check_distinct(&listeners(&node(vars)))
            .expect_err("the ports clash")
            .to_string()
    }

    #[test]
    fn two_listeners_on_one_port_are_refused_whatever_sets_them() {
        let x = LMCACHE_EXTRA_ARGS;
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Vars, [&str; 2])] = &[
            (
                &[(MP_PORT, "19700"), (HTTP_PORT, "19700")],
                [
                    "EREBINE_AGENT_LMCACHE_MP_PORT=19700 (the server's ZMQ port)",
                    "EREBINE_AGENT_LMCACHE_HTTP_PORT=19700 (the server's HTTP port)",
                ],
            ),
            (
                &[(HTTP_PORT, "6555")],
                [
                    "EREBINE_AGENT_LMCACHE_MP_PORT=6555",
                    "EREBINE_AGENT_LMCACHE_HTTP_PORT=6555",
                ],
            ),
            (
                &[(MP_PORT, "7000"), (x, "--http-port 7000")],
                [
                    "EREBINE_AGENT_LMCACHE_MP_PORT=7000",
                    "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --http-port 7000",
                ],
            ),
            (
                &[(x, "--port=8090")],
                [
                    "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --port 8090",
                    "EREBINE_AGENT_LMCACHE_HTTP_PORT=8090",
                ],
            ),
            (
                &[(x, "--port 7100 --http-port 7100")],
                [
                    "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --port 7100",
                    "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --http-port 7100",
                ],
            ),
        ];
        for (vars, needles) in cases {
            let text = clash(vars);
            for needle in needles {
                assert!(text.contains(needle), "{needle:?} not in {text}");
            }
            assert!(text.contains("Give each its own port"), "{text}");
        }
    }

    #[test]
    fn the_metrics_endpoint_is_a_listener_unless_it_is_off() {
        let text = clash(&[(METRICS_PORT, "8090")]);
        assert!(
            text.contains("EREBINE_AGENT_LMCACHE_HTTP_PORT=8090 (the server's HTTP port) and EREBINE_AGENT_LMCACHE_METRICS_PORT=8090 (the metrics endpoint)"),
            "{text}"
        );
        let text = clash(&[(LMCACHE_EXTRA_ARGS, "--port 8091")]);
        assert!(
            text.contains("EREBINE_AGENT_LMCACHE_METRICS_PORT=8091"),
            "{text}"
        );
        let off = listeners(&node(&[(METRICS_PORT, "0"), (HTTP_PORT, "8091")]));
        assert_eq!(off.len(), 2);
        check_distinct(&off).unwrap();
        let everywhere = node(&[(crate::node::env::METRICS_HOST, "0.0.0.0")]);
        let metrics = metrics_listener(&everywhere).unwrap();
        assert_eq!(
            (metrics.host.to_string(), metrics.port),
            ("0.0.0.0".into(), 8091)
        );
    }

    #[test]
    fn a_flag_that_moves_a_port_away_ends_the_clash() {
        let vars = [
            (MP_PORT, "7000"),
            (HTTP_PORT, "7000"),
            (LMCACHE_EXTRA_ARGS, "--http-port 7001"),
        ];
        let found = listeners(&node(&vars));
        check_distinct(&found).unwrap();
        assert_eq!(found[1].port, 7001);
        assert_eq!(
            found[1].setting(),
            "--http-port in EREBINE_AGENT_LMCACHE_EXTRA_ARGS"
        );
        assert_eq!(found[0].setting(), "EREBINE_AGENT_LMCACHE_MP_PORT");
        check_distinct(&listeners(&node(&[]))).unwrap();
    }
}

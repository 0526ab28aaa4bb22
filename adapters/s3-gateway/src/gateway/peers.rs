//! Who may use a gateway: the owner of each connection's socket, looked up
//! once when it is accepted and compared with the LMCache server's uid.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;

use crate::peer::{self, PeerError};

/// Who may use a gateway: connections to `addr` whose socket belongs to
/// `server_uid`, the uid the LMCache server runs as (`docs/s3-gateway.md`,
/// "Who may use the gateway").
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peers {
    /// The uid of the LMCache server.
    pub(crate) server_uid: u32,
    /// The gateway's listening address (`127.0.0.1:<port>`).
    pub(crate) addr: SocketAddr,
}

/// Why a connection is not served.
#[derive(Debug, thiserror::Error)]
pub(super) enum PeerRefusal {
    /// Its socket belongs to another uid.
    #[error("its socket belongs to uid {uid}, not to the LMCache server's uid {server_uid}")]
    OtherUid {
        /// The socket's owner.
        uid: u32,
        /// The LMCache server's uid.
        server_uid: u32,
    },
    /// Its socket's owner cannot be found.
    #[error("the owner of its socket cannot be found: {0}")]
    Unknown(
        /// Why not.
        PeerError,
    ),
}

/// One accepted connection: where it comes from and, when it may not use
/// the gateway, why.
pub(super) struct Connection {
    pub(super) peer: SocketAddr,
    pub(super) refusal: Option<PeerRefusal>,
    /// Whether the refusal was logged (once per connection).
    pub(super) logged: AtomicBool,
}

impl Peers {
    /// The connection from `peer`, checked: its socket's owner looked up
    /// once ([`peer::socket_owner`]) and compared with the server's uid.
    /// The `sock_diag` lookup runs here; the socket tables, where it is not
    /// to be had, are read on a blocking thread, never on the runtime's
    /// (the launch runs one: a read of a busy table takes milliseconds).
    pub(super) async fn check(self, peer: SocketAddr) -> Connection {
        let local = self.addr;
        let owner = match peer::socket_owner_by_diag(peer, local) {
            Some(owner) => owner,
            None => tokio::task::spawn_blocking(move || peer::socket_owner_in_tables(peer, local))
                .await
                .unwrap_or_else(|e| {
                    Err(PeerError::Table {
                        path: "/proc/net/tcp".into(),
                        problem: format!("the lookup did not finish: {e}"),
                    })
                }),
        };
        let refusal = match owner {
            Ok(uid) if uid == self.server_uid => None,
            Ok(uid) => Some(PeerRefusal::OtherUid {
                uid,
                server_uid: self.server_uid,
            }),
            Err(e) => Some(PeerRefusal::Unknown(e)),
        };
        Connection {
            peer,
            refusal,
            logged: AtomicBool::new(false),
        }
    }
}

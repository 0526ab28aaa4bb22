//! Who is on the other end of a loopback connection: the uid that owns the
//! connecting socket, asked of the kernel. The gateway serves only the
//! LMCache server's uid (`docs/s3-gateway.md`, "Who may use the gateway").
//!
//! The connecting socket is the one whose local address is `peer` and whose
//! remote address is our `local` one. It is looked up by that address pair
//! with one `sock_diag` netlink request (`sock_diag(7)`: an exact
//! `inet_diag` lookup, a hash lookup in the kernel), and, where no
//! `sock_diag` socket can be opened, in the socket tables `/proc/net/tcp`
//! and `/proc/net/tcp6` (`proc(5)`; read up to the entry, so its cost grows
//! with the number of sockets). Either gives the socket's owner (the
//! file-system uid of the process that made it) and its inode, 0 once no
//! process holds it: the kernel then gives 0 for the uid too, so such a
//! socket names no owner.

use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The kernel's IPv4 and IPv6 TCP socket tables.
const TABLES: [&str; 2] = ["/proc/net/tcp", "/proc/net/tcp6"];

/// Why the owner of a connecting socket is not known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// No entry connects `peer` to `local`: the client closed the
    /// connection before it was looked up.
    #[error(
        "no socket in /proc/net/tcp or /proc/net/tcp6 connects {peer} to {local} (closed already?)"
    )]
    NoSocket {
        /// The connecting address.
        peer: SocketAddr,
        /// The address it connected to.
        local: SocketAddr,
    },
    /// The entry's socket is held by no process any more (inode 0): closed,
    /// its owner gone with it.
    #[error("the socket of {peer} is held by no process any more (closed)")]
    Orphaned {
        /// The connecting address.
        peer: SocketAddr,
    },
    /// A table could not be read, or its entry not parsed.
    #[error("{}: {problem}", path.display())]
    Table {
        /// The table.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// The kernel's `sock_diag` answer could not be had or read.
    #[error("sock_diag: {0}")]
    Diag(
        /// What went wrong.
        String,
    ),
}

/// The uid that owns the socket connecting from `peer` to `local` (both
/// as seen by the accepting side: `peer` the accepted connection's peer,
/// `local` its local address), by `sock_diag`, else from the socket tables
/// ([`socket_owner_in_tables`]).
///
/// # Errors
/// [`PeerError`]: no such socket (the connection is gone), a socket no
/// process holds, or an answer that cannot be had or read.
pub fn socket_owner(peer: SocketAddr, local: SocketAddr) -> Result<u32, PeerError> {
    socket_owner_by_diag(peer, local).unwrap_or_else(|| socket_owner_in_tables(peer, local))
}

/// [`socket_owner`] by `sock_diag` alone, about 8 us: `None` where no
/// `sock_diag` socket opens here, so the socket tables must be read
/// ([`socket_owner_in_tables`], milliseconds on a busy host: an async
/// caller runs that on a blocking thread).
///
/// # Errors
/// As [`socket_owner`].
pub fn socket_owner_by_diag(peer: SocketAddr, local: SocketAddr) -> Option<Result<u32, PeerError>> {
    match diag::lookup(peer, local) {
        Ok(entry) => Some(owner(entry, peer, local)),
        Err(diag::Failure::Unavailable) => None,
        Err(diag::Failure::Answer(problem)) => Some(Err(PeerError::Diag(problem))),
    }
}

/// [`socket_owner`] read from `/proc/net/tcp` and `/proc/net/tcp6`: IPv4
/// pairs in `tcp`, then, as the v4-mapped addresses an IPv6 socket
/// connecting to an IPv4 address shows, in `tcp6`; IPv6 pairs (`::1`) in
/// `tcp6`.
///
/// # Errors
/// As [`socket_owner`], and a table that cannot be read or parsed.
pub fn socket_owner_in_tables(peer: SocketAddr, local: SocketAddr) -> Result<u32, PeerError> {
    socket_owner_in(&TABLES.map(Path::new), peer, local)
}

/// The owner of the socket `entry` found for `peer` (none: no socket).
fn owner(entry: Option<Entry>, peer: SocketAddr, local: SocketAddr) -> Result<u32, PeerError> {
    match entry {
        None => Err(PeerError::NoSocket { peer, local }),
        Some(Entry { inode: 0, .. }) => Err(PeerError::Orphaned { peer }),
        Some(Entry { uid, .. }) => Ok(uid),
    }
}

/// [`socket_owner`] in the tables at `tables` (IPv4 first, then IPv6).
fn socket_owner_in(
    tables: &[&Path; 2],
    peer: SocketAddr,
    local: SocketAddr,
) -> Result<u32, PeerError> {
    let v4 = match (canonical(peer.ip()), canonical(local.ip())) {
        (IpAddr::V4(p), IpAddr::V4(l)) => Some((v4_hex(p), v4_hex(l))),
        _ => None,
    };
    let v6 = (v6_hex(&peer.ip()), v6_hex(&local.ip()));
    let searches = [(tables[0], v4), (tables[1], Some(v6))];
    for (table, pair) in searches {
        let Some((peer_ip, local_ip)) = pair else {
            continue;
        };
        let wanted = Pair {
            peer: format!("{peer_ip}:{:04X}", peer.port()),
            local: format!("{local_ip}:{:04X}", local.port()),
        };
        if let Some(entry) = find(table, &wanted)? {
            return owner(Some(entry), peer, local);
        }
    }
    owner(None, peer, local)
}

/// The addresses of an entry as the table prints them.
struct Pair {
    peer: String,
    local: String,
}

/// What names a socket's owner.
struct Entry {
    uid: u32,
    inode: u64,
}

/// The entry of `table` whose local address is `wanted.peer` and remote
/// address `wanted.local`; `None` when there is none (or no such table:
/// a kernel without IPv6 has no `tcp6`).
fn find(table: &Path, wanted: &Pair) -> Result<Option<Entry>, PeerError> {
    let unreadable = |problem: String| PeerError::Table {
        path: table.to_path_buf(),
        problem,
    };
    let file = match std::fs::File::open(table) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let mut reader = BufReader::with_capacity(64 << 10, file);
    let mut line = String::new();
    loop {
        line.clear();
        if reader
            .read_line(&mut line)
            .map_err(|e| unreadable(e.to_string()))?
            == 0
        {
            return Ok(None);
        }
        let mut columns = line.split_ascii_whitespace();
        let (Some(_), Some(local), Some(remote)) = (columns.next(), columns.next(), columns.next())
        else {
            continue;
        };
        if local != wanted.peer || remote != wanted.local {
            continue;
        }
        // st, tx_queue:rx_queue, tr:tm->when, retrnsmt, then uid, timeout, inode.
        let mut rest = columns.skip(4);
        let (uid, inode) = (rest.next(), rest.nth(1));
        let parsed = uid
            .and_then(|u| u.parse().ok())
            .zip(inode.and_then(|i| i.parse().ok()));
        return match parsed {
            Some((uid, inode)) => Ok(Some(Entry { uid, inode })),
            None => Err(unreadable(format!(
                "an entry without uid and inode: {}",
                line.trim()
            ))),
        };
    }
}

/// `ip`, with a v4-mapped IPv6 address (`::ffff:127.0.0.1`) as the IPv4
/// address it maps.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// An IPv4 address as `/proc/net/tcp` prints it: the 32-bit word in the
/// host's byte order, 8 upper-case hex digits (`127.0.0.1` is `0100007F`
/// on a little-endian host).
fn v4_hex(ip: Ipv4Addr) -> String {
    format!("{:08X}", u32::from_ne_bytes(ip.octets()))
}

/// An address as `/proc/net/tcp6` prints it: four 32-bit words, each in
/// the host's byte order; an IPv4 address as its v4-mapped form.
fn v6_hex(ip: &IpAddr) -> String {
    let v6: Ipv6Addr = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => *v6,
    };
    v6.octets()
        .chunks_exact(4)
        .fold(String::with_capacity(32), |mut out, word| {
            let word = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]);
            let _ = write!(out, "{word:08X}");
            out
        })
}

/// The exact `inet_diag` lookup of `sock_diag(7)` over netlink.
mod diag {
    use std::net::{IpAddr, SocketAddr};
    use std::os::fd::AsRawFd;

    use nix::sys::socket::{self, sockopt, AddressFamily, MsgFlags, NetlinkAddr, SockFlag};
    use nix::sys::socket::{SockProtocol, SockType};
    use nix::sys::time::TimeVal;

    use super::{canonical, Entry};

    /// `SOCK_DIAG_BY_FAMILY`, the request and answer type.
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    /// `NLMSG_ERROR`.
    const NLMSG_ERROR: u16 = 2;
    /// `NLM_F_REQUEST`, without `NLM_F_DUMP`: one socket, by its addresses.
    const NLM_F_REQUEST: u16 = 1;
    /// The largest answer read: one `inet_diag_msg` (72 bytes) and its header.
    const ANSWER_BYTES: usize = 1024;

    /// Why the lookup did not answer.
    pub(super) enum Failure {
        /// No `sock_diag` socket here (not built in, refused): look elsewhere.
        Unavailable,
        /// The kernel's answer is an error or cannot be read.
        Answer(String),
    }

    /// The socket whose local address is `peer` and remote address `local`;
    /// `None` when the kernel has none.
    pub(super) fn lookup(peer: SocketAddr, local: SocketAddr) -> Result<Option<Entry>, Failure> {
        let unavailable = |_: nix::Error| Failure::Unavailable;
        let fd = socket::socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )
        .map_err(unavailable)?;
        let bound = TimeVal::new(1, 0);
        socket::setsockopt(&fd, sockopt::ReceiveTimeout, &bound).map_err(unavailable)?;
        let kernel = NetlinkAddr::new(0, 0);
        let request = request(peer, local);
        socket::sendto(fd.as_raw_fd(), &request, &kernel, MsgFlags::empty())
            .map_err(unavailable)?;
        let mut answer = [0u8; ANSWER_BYTES];
        let n = socket::recv(fd.as_raw_fd(), &mut answer, MsgFlags::empty())
            .map_err(|e| Failure::Answer(format!("no answer: {e}")))?;
        read_answer(&answer[..n])
    }

    /// The netlink message of an `inet_diag_req_v2` for TCP sockets in any
    /// state whose source is `peer` and destination `local`: IPv4 when both
    /// are (v4-mapped addresses too), IPv6 otherwise.
    fn request(peer: SocketAddr, local: SocketAddr) -> Vec<u8> {
        let (family, src, dst) = match (canonical(peer.ip()), canonical(local.ip())) {
            (IpAddr::V4(p), IpAddr::V4(l)) => (libc::AF_INET, words_v4(p), words_v4(l)),
            (p, l) => (libc::AF_INET6, words_v6(p), words_v6(l)),
        };
        let mut out = Vec::with_capacity(72);
        out.extend_from_slice(&72u32.to_ne_bytes());
        out.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        out.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&[family as u8, libc::IPPROTO_TCP as u8, 0, 0]);
        out.extend_from_slice(&u32::MAX.to_ne_bytes());
        out.extend_from_slice(&peer.port().to_be_bytes());
        out.extend_from_slice(&local.port().to_be_bytes());
        out.extend_from_slice(&src);
        out.extend_from_slice(&dst);
        out.extend_from_slice(&[0; 4]);
        // INET_DIAG_NOCOOKIE.
        out.extend_from_slice(&[0xff; 8]);
        out
    }

    fn words_v4(ip: std::net::Ipv4Addr) -> [u8; 16] {
        let mut words = [0; 16];
        words[..4].copy_from_slice(&ip.octets());
        words
    }

    fn words_v6(ip: IpAddr) -> [u8; 16] {
        match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        }
    }

    /// The owner and inode of the `inet_diag_msg` in `answer`; `None` for
    /// the error `ENOENT` (no such socket).
    fn read_answer(answer: &[u8]) -> Result<Option<Entry>, Failure> {
        let u32_at = |at: usize| {
            answer
                .get(at..at + 4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        let kind = answer.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
        match kind {
            Some(NLMSG_ERROR) => match u32_at(16).map(|e| -(e as i32)) {
                Some(libc::ENOENT) => Ok(None),
                Some(errno) => Err(Failure::Answer(
                    nix::Error::from_raw(errno).desc().to_string(),
                )),
                None => Err(Failure::Answer("a short error message".into())),
            },
            Some(SOCK_DIAG_BY_FAMILY) => match (u32_at(16 + 64), u32_at(16 + 68)) {
                (Some(uid), Some(inode)) => Ok(Some(Entry {
                    uid,
                    inode: u64::from(inode),
                })),
                _ => Err(Failure::Answer("a short inet_diag_msg".into())),
            },
            other => Err(Failure::Answer(format!("an answer of type {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";

    fn entry(local: &str, remote: &str, uid: u32, inode: u64) -> String {
        format!("   0: {local} {remote} 01 00000000:00000000 00:00000000 00000000 {uid:>5}        0 {inode} 1 0000000000000000 20 4 30 10 -1\n")
    }

    fn tables(tcp: &str, tcp6: &str) -> (tempfile::TempDir, [PathBuf; 2]) {
        let dir = tempfile::tempdir().unwrap();
        let paths = [dir.path().join("tcp"), dir.path().join("tcp6")];
        std::fs::write(&paths[0], format!("{HEADER}{tcp}")).unwrap();
        std::fs::write(&paths[1], format!("{HEADER}{tcp6}")).unwrap();
        (dir, paths)
    }

    fn owner(paths: &[PathBuf; 2], peer: &str, local: &str) -> Result<u32, PeerError> {
        let tables = [paths[0].as_path(), paths[1].as_path()];
        socket_owner_in(&tables, peer.parse().unwrap(), local.parse().unwrap())
    }

    #[test]
    fn addresses_are_written_as_the_kernel_prints_them() {
        if cfg!(target_endian = "little") {
            assert_eq!(v4_hex(Ipv4Addr::LOCALHOST), "0100007F");
            assert_eq!(
                v6_hex(&IpAddr::V6(Ipv6Addr::LOCALHOST)),
                "00000000000000000000000001000000"
            );
            assert_eq!(
                v6_hex(&IpAddr::V4(Ipv4Addr::LOCALHOST)),
                "0000000000000000FFFF00000100007F"
            );
        }
    }

    #[test]
    fn the_entry_from_the_peer_to_us_names_the_owner() {
        let (_dir, paths) = tables(
            &[
                entry("0100007F:A000", "00000000:0000", 7, 1),
                entry("0100007F:1F90", "0100007F:C350", 0, 2),
                entry("0100007F:C350", "0100007F:1F90", 1000, 3),
            ]
            .concat(),
            "",
        );
        assert_eq!(owner(&paths, "127.0.0.1:50000", "127.0.0.1:8080"), Ok(1000));
        assert_eq!(
            owner(&paths, "[::ffff:127.0.0.1]:50000", "127.0.0.1:8080"),
            Ok(1000)
        );
    }

    #[test]
    fn an_ipv6_socket_to_an_ipv4_address_is_found_in_tcp6_and_1_in_tcp6() {
        let mapped = "0000000000000000FFFF00000100007F";
        let one = "00000000000000000000000001000000";
        let (_dir, paths) = tables(
            "",
            &[
                entry(
                    &format!("{mapped}:C350"),
                    &format!("{mapped}:1F90"),
                    65534,
                    9,
                ),
                entry(&format!("{one}:C351"), &format!("{one}:1F90"), 1001, 10),
            ]
            .concat(),
        );
        assert_eq!(
            owner(&paths, "127.0.0.1:50000", "127.0.0.1:8080"),
            Ok(65534)
        );
        assert_eq!(owner(&paths, "[::1]:50001", "[::1]:8080"), Ok(1001));
    }

    #[test]
    fn a_closed_socket_a_missing_entry_and_a_bad_table_name_no_owner() {
        let (_dir, paths) = tables(&entry("0100007F:C350", "0100007F:1F90", 0, 0), "");
        assert_eq!(
            owner(&paths, "127.0.0.1:50000", "127.0.0.1:8080"),
            Err(PeerError::Orphaned {
                peer: "127.0.0.1:50000".parse().unwrap()
            })
        );
        let gone = owner(&paths, "127.0.0.1:50001", "127.0.0.1:8080").unwrap_err();
        assert!(matches!(gone, PeerError::NoSocket { .. }), "{gone}");
        std::fs::write(
            &paths[0],
            format!("{HEADER}   0: 0100007F:C350 0100007F:1F90 01\n"),
        )
        .unwrap();
        let bad = owner(&paths, "127.0.0.1:50000", "127.0.0.1:8080").unwrap_err();
        assert!(
            bad.to_string().contains("an entry without uid and inode"),
            "{bad}"
        );
        std::fs::remove_file(&paths[1]).unwrap();
        let gone = owner(&paths, "127.0.0.1:50001", "127.0.0.1:8080").unwrap_err();
        assert!(matches!(gone, PeerError::NoSocket { .. }), "{gone}");
        std::fs::create_dir(paths[0].with_file_name("dir")).unwrap();
        let tables = [paths[0].with_file_name("dir"), paths[1].clone()];
        let unreadable = owner(&tables, "127.0.0.1:50000", "127.0.0.1:8080").unwrap_err();
        assert!(
            matches!(unreadable, PeerError::Table { .. }),
            "{unreadable}"
        );
    }

    /// Both lookups of the next connection accepted on `listener`.
    fn both(listener: &std::net::TcpListener) -> [Result<u32, PeerError>; 2] {
        let (accepted, peer) = listener.accept().unwrap();
        let local = accepted.local_addr().unwrap();
        [
            socket_owner(peer, local),
            socket_owner_in_tables(peer, local),
        ]
    }

    #[test]
    fn a_real_loopback_connection_is_owned_by_this_process_uid() {
        let me = nix::unistd::geteuid().as_raw();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let v4 = std::net::TcpStream::connect(addr).unwrap();
        assert_eq!(both(&listener), [Ok(me), Ok(me)]);
        let mapped = format!("[::ffff:127.0.0.1]:{}", addr.port());
        if let Ok(mapped) = std::net::TcpStream::connect(mapped) {
            assert_eq!(both(&listener), [Ok(me), Ok(me)]);
            drop(mapped);
        }
        if let Ok(v6) = std::net::TcpListener::bind("[::1]:0") {
            let client = std::net::TcpStream::connect(v6.local_addr().unwrap()).unwrap();
            assert_eq!(both(&v6), [Ok(me), Ok(me)]);
            drop(client);
        }
        let gone: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let missing = socket_owner(gone, addr).unwrap_err();
        assert!(matches!(missing, PeerError::NoSocket { .. }), "{missing}");
        drop(v4);
    }
}

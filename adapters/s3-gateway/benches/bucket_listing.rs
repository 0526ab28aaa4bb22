//! What the bucket bound's listings cost at a bucket's size: a gateway with
//! a bound starts on a prefix holding `BUCKET_BENCH_OBJECTS` LMCache
//! objects (default 64,000, 1 byte each) on a real S3 server (s3s-fs), and
//! how long the gateway takes to serve (the first listing runs in the
//! background), its first listing's ListObjectsV2 requests and duration are printed,
//! with the LIST requests an hour they make for an idle node and for a
//! node writing 4 MiB chunks at 100 MB/s into a full bucket of that many
//! objects (`docs/s3-gateway.md`, "The bucket bound"; results in
//! `docs/performance.md`).
//!
//! Run: `BUCKET_BENCH_S3S_FS=<s3s-fs binary> cargo bench -p
//! lmcache-s3-gateway --bench bucket_listing` (the binary of
//! `scripts/setup-s3s-fs.sh`, by default
//! `~/.cache/erebine/s3s-fs-0.14.1/bin/s3s-fs`).

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use lmcache_s3_gateway::bound::LISTING_SHARE;
use lmcache_s3_gateway::fleet::Timing;
use lmcache_s3_gateway::Gateways;

type Error = Box<dyn std::error::Error + Send + Sync>;

const KEY_ID: &str = "AKIABUCKETLISTING001";
const SECRET: &str = "bucket-listing-bench-secret-0123456789ab";
/// The chunk size of the writing node's figure.
const CHUNK: u64 = 4 << 20;
/// The writing node's rate, bytes a second.
const WRITE_RATE: f64 = 100e6;

/// s3s-fs on a free loopback port over `root`, killed when dropped.
struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_s3s_fs(root: &std::path::Path) -> Result<Server, Error> {
    let binary = std::env::var_os("BUCKET_BENCH_S3S_FS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/erebine/s3s-fs-0.14.1/bin/s3s-fs")
        });
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new(&binary)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", KEY_ID, "--secret-key", SECRET])
        .arg(root)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let server = Server(child, port);
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if started.elapsed() > Duration::from_secs(30) {
            return Err("s3s-fs did not listen within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(server)
}

fn main() -> Result<(), Error> {
    if std::env::args().any(|a| a == "--list") {
        return Ok(());
    }
    let objects: u64 = std::env::var("BUCKET_BENCH_OBJECTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64_000);
    let dir = tempfile::tempdir()?;
    let prefix_dir = dir.path().join("kv-cache/fleet");
    std::fs::create_dir_all(&prefix_dir)?;
    for i in 0..objects {
        std::fs::write(
            prefix_dir.join(format!("test-model@01000100@0@{i:064x}")),
            b"x",
        )?;
    }
    let server = start_s3s_fs(dir.path())?;
    let spec = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{}", server.1),
        "s3_bucket": "kv-cache", "s3_key_prefix": "fleet/", "s3_region": "us-east-1",
        "disable_tls": true, "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "max_capacity_gb": 1000});
    let args = vec!["--l2-adapter".to_string(), spec.to_string()];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let (_, gateways) = runtime.block_on(Gateways::start_args(&args, &|_| None, None))?;
    let serving = started.elapsed();
    let bound = loop {
        let bound = gateways.view().states()[0]
            .bucket_bound
            .clone()
            .ok_or("no bound")?;
        if bound.listings > 0 {
            break bound;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let listed = started.elapsed();
    let pages = bound.listing_pages as f64;
    let idle = pages * 3600.0 / Timing::default().listing.as_secs_f64();
    // A full bucket of `objects` chunks: the node lists after writing
    // 1/LISTING_SHARE of it.
    let every_bytes = (objects * CHUNK) as f64 / LISTING_SHARE as f64;
    let writing = pages * WRITE_RATE * 3600.0 / every_bytes;
    let puts = WRITE_RATE * 3600.0 / CHUNK as f64;
    println!(
        "{objects} objects: {} listed in {} ListObjectsV2 requests, {} ms; the gateway served after {} ms, the listing was in after {} ms",
        bound.objects,
        bound.listing_pages,
        bound.last_listing_millis,
        serving.as_millis(),
        listed.as_millis()
    );
    println!("LIST requests an hour, idle node: {idle:.0}");
    println!(
        "LIST requests an hour, node writing 4 MiB chunks at 100 MB/s into a full bucket of {objects}: {writing:.0} (beside {puts:.0} PUTs)"
    );
    drop(gateways);
    drop(server);
    Ok(())
}

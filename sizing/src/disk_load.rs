//! What the disk tier can deliver: the tokens a second it loads at the
//! volume's read rate, for an operator to compare with the engine's prefill
//! rate (`docs/sizing.md`, "What the disk tier delivers").
//!
//! Facts first: the read rate is stated by the operator or measured once by
//! [`probe_read`] (opt-in: it writes and reads a test file); the KV bytes a
//! token come from the model's shape. [`tokens_per_second`] is the pure
//! rule.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::probe::AlignedBuf;
use crate::Decision;

/// Name of the test file [`probe_read`] writes (and removes) in the cache
/// directory, followed by `.<pid>`.
pub const READ_PROBE_FILE: &str = ".erebine-read-probe";
/// The largest test file, bytes (512 MiB).
pub const READ_PROBE_BYTES: u64 = 512 << 20;
/// The longest the write, and again the read, may take: the probe ends
/// within about twice this plus one fsync.
pub const READ_PROBE_BUDGET: Duration = Duration::from_secs(2);
/// Each read and write, bytes (4 MiB, a multiple of any O_DIRECT alignment).
const BLOCK: usize = 4 << 20;

/// What [`probe_read`] measured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ReadProbe {
    /// The test file was read back.
    Measured {
        /// Bytes read.
        bytes: u64,
        /// How long the reads took, microseconds.
        micros: u64,
        /// Parallel readers (the tier's I/O workers).
        streams: u32,
        /// Whether the reads bypassed the page cache (O_DIRECT); where the
        /// volume refuses it they are buffered reads of a file whose pages
        /// were dropped first.
        odirect: bool,
    },
    /// The probe could not run, and why.
    Failed {
        /// The step and the OS error.
        why: String,
    },
}

impl ReadProbe {
    /// The measured rate, bytes a second; `None` for a failed probe.
    pub fn bytes_per_second(&self) -> Option<u64> {
        match self {
            ReadProbe::Measured { bytes, micros, .. } => {
                Some((u128::from(*bytes) * 1_000_000 / u128::from((*micros).max(1))) as u64)
            }
            ReadProbe::Failed { .. } => None,
        }
    }
}

/// Where the read rate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadRate<'a> {
    /// The operator's figure (`EREBINE_AGENT_LMCACHE_DISK_READ_GBPS`),
    /// bytes a second.
    Stated(u64),
    /// [`probe_read`]'s result.
    Probed(&'a ReadProbe),
}

/// Writes a test file of up to [`READ_PROBE_BYTES`] in `dir` (within
/// [`READ_PROBE_BUDGET`]), syncs it, reads it back once with `streams`
/// parallel readers of 4 MiB each with O_DIRECT (within the same budget
/// again), and removes it. Needs four times the file's size free.
pub fn probe_read(dir: &Path, streams: u32) -> ReadProbe {
    let path = dir.join(format!("{READ_PROBE_FILE}.{}", std::process::id()));
    let outcome = write_file(&path).and_then(|written| read_back(&path, written, streams.max(1)));
    let _ = fs::remove_file(&path);
    outcome.unwrap_or_else(|why| ReadProbe::Failed { why })
}

fn write_file(path: &Path) -> Result<u64, String> {
    let stats = crate::probe::volume_stats(path.parent().unwrap_or(path))
        .map_err(|e| format!("statvfs: {e}"))?;
    if stats.free_bytes < 4 * READ_PROBE_BYTES {
        return Err(format!(
            "the volume has {} free, under the {} the test needs",
            crate::fmt_gib(stats.free_bytes),
            crate::fmt_gib(4 * READ_PROBE_BYTES)
        ));
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    // Not zeros: a volume that compresses or dedups would read those back
    // from nothing.
    let block: Vec<u8> = (0..BLOCK).map(|i| (i % 251) as u8).collect();
    let started = Instant::now();
    let mut written = 0u64;
    while written < READ_PROBE_BYTES && started.elapsed() < READ_PROBE_BUDGET {
        file.write_all(&block).map_err(|e| format!("write: {e}"))?;
        written += BLOCK as u64;
    }
    file.sync_all().map_err(|e| format!("fsync: {e}"))?;
    Ok(written)
}

fn read_back(path: &Path, size: u64, streams: u32) -> Result<ReadProbe, String> {
    let (file, odirect) = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => (file, true),
        Err(_) => {
            let file = fs::File::open(path).map_err(|e| format!("open: {e}"))?;
            drop_cached_pages(&file);
            (file, false)
        }
    };
    let next = AtomicU64::new(0);
    let read = AtomicU64::new(0);
    let started = Instant::now();
    let failure = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..streams)
            .map(|_| scope.spawn(|| read_blocks(&file, size, &next, &read, started)))
            .collect();
        readers
            .into_iter()
            .filter_map(|r| {
                r.join()
                    .unwrap_or_else(|_| Err("a reader panicked".into()))
                    .err()
            })
            .next()
    });
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    match failure {
        Some(why) => Err(why),
        None => Ok(ReadProbe::Measured {
            bytes: read.into_inner(),
            micros,
            streams,
            odirect,
        }),
    }
}

/// Reads the next 4 MiB block of the file until the file or the budget
/// ends, counting the bytes.
fn read_blocks(
    file: &fs::File,
    size: u64,
    next: &AtomicU64,
    read: &AtomicU64,
    started: Instant,
) -> Result<(), String> {
    let mut buf = AlignedBuf::new(BLOCK);
    loop {
        let offset = next.fetch_add(BLOCK as u64, Ordering::Relaxed);
        if offset >= size || started.elapsed() >= READ_PROBE_BUDGET {
            return Ok(());
        }
        let n = file
            .read_at(buf.as_mut_slice(), offset)
            .map_err(|e| format!("read at {offset}: {e}"))?;
        read.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Asks the kernel to drop the file's cached pages, so that buffered reads
/// come from the volume (a no-op on tmpfs, whose pages are the volume).
fn drop_cached_pages(file: &fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; the call only advises the kernel.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// The tokens a second the disk tier loads at `rate`, for a model of
/// `kv_bytes_per_token` bytes of KV a token (all layers, keys and values):
/// the rate over the bytes a token. `None` without a rate (a failed probe).
///
/// Source: the tier reads at the volume's limit (the GPU node's trial,
/// `docs/performance.md`), so the volume's rate bounds the tier's.
pub fn tokens_per_second(kv_bytes_per_token: u64, rate: ReadRate<'_>) -> Option<Decision<u64>> {
    let (bytes_per_s, source) = match rate {
        ReadRate::Stated(bytes_per_s) => (bytes_per_s, "stated".to_string()),
        ReadRate::Probed(probe) => {
            let ReadProbe::Measured {
                streams, odirect, ..
            } = probe
            else {
                return None;
            };
            (
                probe.bytes_per_second()?,
                format!(
                    "measured: {streams} parallel 4 MiB reads{}",
                    if *odirect {
                        " with O_DIRECT"
                    } else {
                        ", buffered"
                    }
                ),
            )
        }
    };
    let tokens = bytes_per_s / kv_bytes_per_token.max(1);
    Some(Decision::new(
        tokens,
        "volume-read-rate",
        format!(
            "{:.2} GB/s read ({source}) over {kv_bytes_per_token} bytes of KV a token",
            bytes_per_s as f64 / 1e9
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_a_second_are_the_rate_over_the_bytes_a_token() {
        // Qwen2-7B's shape in bf16: 2 x 28 layers x 4 KV heads x 128 x 2 bytes.
        let d = tokens_per_second(57_344, ReadRate::Stated(2_000_000_000)).unwrap();
        assert_eq!(d.value, 34_877);
        assert!(
            d.reason.contains("2.00 GB/s") && d.reason.contains("57344"),
            "{}",
            d.reason
        );
        let probe = ReadProbe::Measured {
            bytes: 1 << 30,
            micros: 500_000,
            streams: 8,
            odirect: true,
        };
        assert_eq!(probe.bytes_per_second(), Some(2_147_483_648));
        let d = tokens_per_second(8192, ReadRate::Probed(&probe)).unwrap();
        assert_eq!(d.value, 262_144);
        assert!(
            d.reason.contains("8 parallel 4 MiB reads with O_DIRECT"),
            "{}",
            d.reason
        );
        let failed = ReadProbe::Failed { why: "x".into() };
        assert_eq!(tokens_per_second(8192, ReadRate::Probed(&failed)), None);
        let zero = ReadProbe::Measured {
            bytes: 0,
            micros: 0,
            streams: 1,
            odirect: false,
        };
        assert_eq!(zero.bytes_per_second(), Some(0));
    }

    #[test]
    fn the_probe_reads_its_file_back_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        match probe_read(dir.path(), 4) {
            ReadProbe::Measured { bytes, streams, .. } => {
                assert!(bytes >= BLOCK as u64, "{bytes}");
                assert_eq!(streams, 4);
            }
            ReadProbe::Failed { why } => assert!(why.contains("free"), "{why}"),
        }
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_probe_on_a_memory_backed_volume_measures_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let volume = lmcache_tier_e2e::Tmpfs::mount(&tmp.path().join("volume"), 3 << 20);
        match probe_read(volume.path(), 2) {
            ReadProbe::Measured { bytes, micros, .. } => {
                assert!(
                    bytes >= BLOCK as u64 && micros > 0,
                    "{bytes} in {micros} us"
                )
            }
            ReadProbe::Failed { why } => panic!("a 3 GiB tmpfs: {why}"),
        }
        assert_eq!(fs::read_dir(volume.path()).unwrap().count(), 0);
    }

    #[test]
    fn the_probe_on_a_small_or_missing_volume_says_why_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let volume = lmcache_tier_e2e::Tmpfs::mount(&tmp.path().join("volume"), 64 << 10);
        match probe_read(volume.path(), 2) {
            ReadProbe::Failed { why } => assert!(why.contains("under the 2.00 GiB"), "{why}"),
            other => panic!("a 64 MiB volume: {other:?}"),
        }
        assert_eq!(fs::read_dir(volume.path()).unwrap().count(), 0);
        match probe_read(Path::new("/nonexistent/erebine"), 2) {
            ReadProbe::Failed { why } => assert!(why.starts_with("statvfs"), "{why}"),
            other => panic!("a missing directory: {other:?}"),
        }
    }
}

//! Scanning a tier directory into an [`Inventory`].
//!
//! The directory is flat, as LMCache writes it. One thread reads the
//! directory (`getdents` through `readdir`) in batches of names; two to four
//! workers `fstatat` them relative to the directory descriptor without
//! following symlinks, decode the names and keep only compact records
//! (80 bytes an object, names interned). Entries are classified as:
//!
//! - object: a regular file whose name decodes ([`crate::codec`]);
//! - stale temp: a regular file named like an object with `.tmp` for `.data`
//!   (LMCache's `fs` adapter), or the temp file of our manifest or of the
//!   capacity guard's status file;
//! - ours: the manifest and the lock file;
//! - foreign: anything else — model files, READMEs, subdirectories, symlinks,
//!   devices, names that are not UTF-8. Never followed, never deleted, counted.
//!
//! Entries on another filesystem than the directory's (`st_dev`) are skipped
//! and counted; entries that vanish between `readdir` and `fstatat` are
//! counted, not errors.

use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Mutex;
use std::thread;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::libc;
use nix::sys::stat::{fstatat, FileStat, Mode};
use serde::Serialize;

use crate::codec::{
    parse_object_name, parse_temp_name, NameTable, ObjectKey, ObjectName, ObjectNameRef,
    DATA_SUFFIX, TEMP_SUFFIX,
};
use crate::identity::{MANIFEST_FILE_NAME, MANIFEST_TEMP_FILE_NAME};
use crate::lock::LOCK_FILE_NAME;
use crate::tier_dir::{AccessTimes, TierDir};

/// The status file the capacity guard (`lmcache-capacity-guard`) keeps in the
/// tier directory, replaced atomically by renaming [`GUARD_STATUS_TEMP_FILE_NAME`]
/// over it: ours, never an object, never foreign.
pub const GUARD_STATUS_FILE_NAME: &str = ".lmcache-tier-guard.json";
/// The capacity guard's status file while it is written; a stale one is ours
/// to delete.
pub const GUARD_STATUS_TEMP_FILE_NAME: &str = ".lmcache-tier-guard.json.tmp";

/// The start of the name of the file in which an S3 gateway keeps its
/// bucket bound's node id across restarts (`lmcache-s3-gateway`, one per
/// bucket and prefix; `docs/s3-gateway.md`, "Node ids"): ours, never an
/// object, never foreign.
pub const BUCKET_NODE_FILE_PREFIX: &str = ".lmcache-tier-bucket-node-";

/// Names handed to a stat worker at a time.
const BATCH_ENTRIES: usize = 4096;

/// What `du` counts for an entry and its two times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryStats {
    /// Allocated bytes: `st_blocks * 512` (a sparse or empty file counts
    /// what it occupies, not its length).
    pub allocated_bytes: u64,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    /// Last access, nanoseconds since the Unix epoch.
    pub accessed_ns: i64,
}

impl EntryStats {
    fn from_stat(st: &FileStat) -> Self {
        Self {
            allocated_bytes: u64::try_from(st.st_blocks).unwrap_or(0) * 512,
            modified_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            accessed_ns: st.st_atime * 1_000_000_000 + st.st_atime_nsec,
        }
    }
}

/// An object file found in the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectEntry {
    /// Its name, compact; [`Inventory::names`] turns it back into the file name.
    pub key: ObjectKey,
    /// Its size and times.
    pub stats: EntryStats,
}

/// Who left a stale temp file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TempOrigin {
    /// LMCache's `fs` adapter (`<object>.tmp`).
    Lmcache,
    /// This crate's manifest writer.
    Housekeeping,
}

/// A temp file left by an interrupted write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TempEntry {
    /// Its file name.
    pub name: Box<str>,
    /// Who wrote it.
    pub origin: TempOrigin,
    /// Its size and times.
    pub stats: EntryStats,
}

/// What kind of foreign entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ForeignKind {
    /// A regular file whose name is not ours or LMCache's.
    File,
    /// A directory (never entered).
    Directory,
    /// A symlink (never followed).
    Symlink,
    /// A device, FIFO or socket.
    Other,
    /// `fstatat` failed for another reason than vanishing.
    Unreadable,
}

/// An entry housekeeping does not own: kept as is, counted in reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignEntry {
    /// Its file name, as bytes on disk.
    pub name: OsString,
    /// What it is.
    pub kind: ForeignKind,
    /// Its allocated bytes (0 when unreadable).
    pub allocated_bytes: u64,
}

/// How [`classify`] sees one directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryClass<'a> {
    /// An LMCache object.
    Object(ObjectNameRef<'a>),
    /// A temp file from an interrupted write.
    StaleTemp(TempOrigin),
    /// The identity manifest.
    Manifest,
    /// The lock file.
    Lock,
    /// The capacity guard's status file.
    GuardStatus,
    /// An S3 gateway's node id file ([`BUCKET_NODE_FILE_PREFIX`]).
    BucketNode,
    /// Anything else.
    Foreign,
}

/// Classifies a directory entry by its name and whether it is a regular file
/// (as `lstat` says: a symlink is never a regular file here).
pub fn classify(name: &OsStr, is_regular_file: bool) -> EntryClass<'_> {
    if !is_regular_file {
        return EntryClass::Foreign;
    }
    let Ok(name) = std::str::from_utf8(name.as_bytes()) else {
        return EntryClass::Foreign;
    };
    if name.ends_with(DATA_SUFFIX) {
        return match parse_object_name(name) {
            Ok(parsed) => EntryClass::Object(parsed),
            Err(_) => EntryClass::Foreign,
        };
    }
    match name {
        MANIFEST_FILE_NAME => EntryClass::Manifest,
        LOCK_FILE_NAME => EntryClass::Lock,
        GUARD_STATUS_FILE_NAME => EntryClass::GuardStatus,
        MANIFEST_TEMP_FILE_NAME | GUARD_STATUS_TEMP_FILE_NAME => {
            EntryClass::StaleTemp(TempOrigin::Housekeeping)
        }
        _ if name.ends_with(TEMP_SUFFIX) && parse_temp_name(name).is_ok() => {
            EntryClass::StaleTemp(TempOrigin::Lmcache)
        }
        _ if name.starts_with(BUCKET_NODE_FILE_PREFIX) => EntryClass::BucketNode,
        _ => EntryClass::Foreign,
    }
}

/// A count of entries and their allocated bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct CountBytes {
    /// Entries.
    pub count: u64,
    /// Allocated bytes (`st_blocks * 512`).
    pub bytes: u64,
}

impl CountBytes {
    pub(crate) fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }

    fn merge(&mut self, other: CountBytes) {
        self.count += other.count;
        self.bytes += other.bytes;
    }
}

/// Totals of an [`Inventory`], for logs and JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct InventoryTotals {
    /// LMCache objects.
    pub objects: CountBytes,
    /// Stale temp files.
    pub stale_temps: CountBytes,
    /// Foreign entries (kept).
    pub foreign: CountBytes,
    /// The manifest, the lock file and the capacity guard's status file.
    pub ours: CountBytes,
    /// Entries skipped because they are on another filesystem.
    pub other_filesystem_entries: u64,
    /// Entries that vanished while the scan ran.
    pub vanished_entries: u64,
}

/// Everything a scan found in a tier directory.
#[derive(Debug, Clone)]
pub struct Inventory {
    path: PathBuf,
    access_times: AccessTimes,
    names: NameTable,
    objects: Vec<ObjectEntry>,
    temps: Vec<TempEntry>,
    foreign: Vec<ForeignEntry>,
    ours: CountBytes,
    other_filesystem: u64,
    vanished: u64,
}

impl Inventory {
    /// An empty inventory of `path` (to fill by hand, e.g. in tests or from
    /// another listing); [`scan`] makes real ones.
    pub fn new(path: impl Into<PathBuf>, access_times: AccessTimes) -> Self {
        Self {
            path: path.into(),
            access_times,
            names: NameTable::new(),
            objects: Vec::new(),
            temps: Vec::new(),
            foreign: Vec::new(),
            ours: CountBytes::default(),
            other_filesystem: 0,
            vanished: 0,
        }
    }

    /// Records an object; returns its key.
    pub fn add_object(&mut self, name: &ObjectName, stats: EntryStats) -> ObjectKey {
        let key = self.names.intern_owned(name);
        self.objects.push(ObjectEntry { key, stats });
        key
    }

    /// Records a stale temp file.
    pub fn add_temp(&mut self, name: &str, origin: TempOrigin, stats: EntryStats) {
        self.temps.push(TempEntry {
            name: name.into(),
            origin,
            stats,
        });
    }

    /// Records a foreign entry.
    pub fn add_foreign(
        &mut self,
        name: impl Into<OsString>,
        kind: ForeignKind,
        allocated_bytes: u64,
    ) {
        self.foreign.push(ForeignEntry {
            name: name.into(),
            kind,
            allocated_bytes,
        });
    }

    /// The directory scanned.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Whether its volume records access times (decides the trim order).
    pub fn access_times(&self) -> AccessTimes {
        self.access_times
    }

    /// The table that turns object keys back into names.
    pub fn names(&self) -> &NameTable {
        &self.names
    }

    /// The objects, in directory order.
    pub fn objects(&self) -> &[ObjectEntry] {
        &self.objects
    }

    /// The stale temp files.
    pub fn temps(&self) -> &[TempEntry] {
        &self.temps
    }

    /// The foreign entries.
    pub fn foreign(&self) -> &[ForeignEntry] {
        &self.foreign
    }

    /// Counts and bytes per class.
    pub fn totals(&self) -> InventoryTotals {
        let mut totals = InventoryTotals {
            ours: self.ours,
            other_filesystem_entries: self.other_filesystem,
            vanished_entries: self.vanished,
            ..InventoryTotals::default()
        };
        for object in &self.objects {
            totals.objects.add(object.stats.allocated_bytes);
        }
        for temp in &self.temps {
            totals.stale_temps.add(temp.stats.allocated_bytes);
        }
        for foreign in &self.foreign {
            totals.foreign.add(foreign.allocated_bytes);
        }
        totals
    }

    /// Bytes the tier may take back: allocated bytes of objects and stale
    /// temp files. This is R of the sizing rules, which counts as free
    /// (`docs/sizing.md`, "Disk tier capacity").
    pub fn reclaimable_bytes(&self) -> u64 {
        let totals = self.totals();
        totals.objects.bytes + totals.stale_temps.bytes
    }

    fn absorb(&mut self, part: Inventory) {
        let remap = self.names.absorb(&part.names);
        self.objects.reserve(part.objects.len());
        self.objects
            .extend(part.objects.into_iter().map(|o| ObjectEntry {
                key: remap(o.key),
                stats: o.stats,
            }));
        self.temps.extend(part.temps);
        self.foreign.extend(part.foreign);
        self.ours.merge(part.ours);
        self.other_filesystem += part.other_filesystem;
        self.vanished += part.vanished;
    }
}

/// Failure to read the directory itself (entries never fail a scan).
#[derive(Debug, thiserror::Error)]
#[error("cannot read tier directory {path}: {source}")]
pub struct ScanError {
    /// The directory.
    pub path: PathBuf,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

/// A batch of NUL-terminated names read from the directory.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    ends: Vec<u32>,
}

/// Scans `dir` (see the module docs).
///
/// # Errors
/// [`ScanError`] when the directory cannot be opened or read.
pub fn scan(dir: &TierDir) -> Result<Inventory, ScanError> {
    let scan_err = |e: Errno| ScanError {
        path: dir.path().to_path_buf(),
        source: e.into(),
    };
    let mut reader = Dir::openat(
        dir.fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(scan_err)?;
    let workers = thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 4);
    let (sender, receiver) = sync_channel::<Batch>(2 * workers);
    let receiver = Mutex::new(receiver);
    let (read_result, parts) = thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| s.spawn(|| stat_worker(dir, &receiver)))
            .collect();
        let read_result = (|| {
            let mut batch = Batch::default();
            for entry in reader.iter() {
                let entry = entry?;
                let name = entry.file_name().to_bytes_with_nul();
                if name == b".\0" || name == b"..\0" {
                    continue;
                }
                batch.bytes.extend_from_slice(name);
                batch.ends.push(batch.bytes.len() as u32);
                if batch.ends.len() == BATCH_ENTRIES {
                    // A send fails only if every worker is gone (panicked);
                    // the join below reports that.
                    if sender.send(std::mem::take(&mut batch)).is_err() {
                        break;
                    }
                }
            }
            if !batch.ends.is_empty() {
                let _ = sender.send(batch);
            }
            Ok(())
        })();
        drop(sender);
        let parts: Vec<Inventory> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect();
        (read_result, parts)
    });
    read_result.map_err(scan_err)?;
    let mut parts = parts.into_iter();
    let mut inventory = parts
        .next()
        .unwrap_or_else(|| Inventory::new(dir.path(), dir.access_times()));
    for part in parts {
        inventory.absorb(part);
    }
    Ok(inventory)
}

fn stat_worker(dir: &TierDir, batches: &Mutex<Receiver<Batch>>) -> Inventory {
    let mut part = Inventory::new(dir.path(), dir.access_times());
    loop {
        // A poisoned lock means another worker panicked; its join reports it.
        let next = match batches.lock() {
            Ok(receiver) => receiver.recv(),
            Err(_) => return part,
        };
        let Ok(batch) = next else {
            return part;
        };
        let mut start = 0usize;
        for &end in &batch.ends {
            let with_nul = &batch.bytes[start..end as usize];
            start = end as usize;
            let Ok(cname) = CStr::from_bytes_with_nul(with_nul) else {
                continue;
            };
            stat_one(dir, &mut part, cname);
        }
    }
}

fn stat_one(dir: &TierDir, part: &mut Inventory, cname: &CStr) {
    let name = OsStr::from_bytes(cname.to_bytes());
    let st = match fstatat(dir.fd(), cname, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => {
            part.vanished += 1;
            return;
        }
        Err(_) => {
            part.add_foreign(name, ForeignKind::Unreadable, 0);
            return;
        }
    };
    if st.st_dev != dir.device() {
        part.other_filesystem += 1;
        return;
    }
    let format = st.st_mode & libc::S_IFMT;
    let stats = EntryStats::from_stat(&st);
    match classify(name, format == libc::S_IFREG) {
        EntryClass::Object(parsed) => {
            let key = part.names.intern(&parsed);
            part.objects.push(ObjectEntry { key, stats });
        }
        EntryClass::StaleTemp(origin) => {
            // classify only says StaleTemp for UTF-8 names.
            part.add_temp(&name.to_string_lossy(), origin, stats);
        }
        EntryClass::Manifest
        | EntryClass::Lock
        | EntryClass::GuardStatus
        | EntryClass::BucketNode => part.ours.add(stats.allocated_bytes),
        EntryClass::Foreign => {
            let kind = match format {
                libc::S_IFREG => ForeignKind::File,
                libc::S_IFDIR => ForeignKind::Directory,
                libc::S_IFLNK => ForeignKind::Symlink,
                _ => ForeignKind::Other,
            };
            part.add_foreign(name, kind, stats.allocated_bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier_dir::Access;
    use std::fs;

    fn fixture_names() -> Vec<String> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/lmcache-0.5.6/object-names.txt"
        );
        let mut names: Vec<String> = fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read the recorded object names at {path}: {e}"))
            .lines()
            .filter(|l| l.ends_with(DATA_SUFFIX))
            .map(str::to_owned)
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn classifies_every_kind_of_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let names = fixture_names();
        for name in names.iter().filter(|n| **n != names[1]) {
            fs::write(tmp.path().join(name), vec![1u8; 8192]).unwrap();
        }
        let temp = names[0].replace(DATA_SUFFIX, TEMP_SUFFIX);
        fs::write(tmp.path().join(&temp), b"partial").unwrap();
        fs::write(tmp.path().join(MANIFEST_TEMP_FILE_NAME), b"{").unwrap();
        fs::write(tmp.path().join(MANIFEST_FILE_NAME), b"{}").unwrap();
        fs::write(tmp.path().join(LOCK_FILE_NAME), b"").unwrap();
        fs::write(tmp.path().join(GUARD_STATUS_FILE_NAME), b"{}").unwrap();
        fs::write(tmp.path().join(GUARD_STATUS_TEMP_FILE_NAME), b"{").unwrap();
        let node_file = format!("{BUCKET_NODE_FILE_PREFIX}0123456789abcdef");
        fs::write(tmp.path().join(node_file), b"{}").unwrap();
        fs::write(tmp.path().join("model.safetensors"), b"weights").unwrap();
        fs::write(tmp.path().join("notes.tmp"), b"not an object").unwrap();
        fs::create_dir(tmp.path().join(&names[1])).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", tmp.path().join("link.data")).unwrap();
        fs::write(tmp.path().join(OsStr::from_bytes(b"bad\xffname.data")), b"").unwrap();

        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        let inventory = scan(&dir).unwrap();
        let totals = inventory.totals();
        assert_eq!(totals.objects.count as usize, names.len() - 1);
        assert!(totals.objects.bytes >= 8192 * (names.len() as u64 - 1));
        assert_eq!(totals.stale_temps.count, 3);
        assert_eq!(totals.ours.count, 4);
        assert_eq!(totals.foreign.count, 5);
        assert_eq!(
            inventory.reclaimable_bytes(),
            totals.objects.bytes + totals.stale_temps.bytes
        );
        let mut decoded: Vec<String> = inventory
            .objects()
            .iter()
            .map(|o| inventory.names().name(&o.key).to_string())
            .collect();
        decoded.sort();
        let mut want = names.clone();
        want.remove(1);
        assert_eq!(decoded, want);
        let mut kinds: Vec<_> = inventory
            .foreign()
            .iter()
            .map(|f| (f.name.to_string_lossy().into_owned(), f.kind))
            .collect();
        kinds.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(kinds.iter().map(|k| k.1).collect::<Vec<_>>(), {
            let mut want = vec![
                (names[1].clone(), ForeignKind::Directory),
                ("bad\u{fffd}name.data".to_owned(), ForeignKind::File),
                ("link.data".to_owned(), ForeignKind::Symlink),
                ("model.safetensors".to_owned(), ForeignKind::File),
                ("notes.tmp".to_owned(), ForeignKind::File),
            ];
            want.sort_by(|a, b| a.0.cmp(&b.0));
            want.into_iter().map(|w| w.1).collect::<Vec<_>>()
        });
        let temp_origins: Vec<_> = inventory.temps().iter().map(|t| t.origin).collect();
        assert!(temp_origins.contains(&TempOrigin::Lmcache));
        assert!(temp_origins.contains(&TempOrigin::Housekeeping));
    }

    #[test]
    fn many_objects_across_batches_and_workers_keep_one_name_table() {
        let tmp = tempfile::tempdir().unwrap();
        let count = BATCH_ENTRIES * 3 + 17;
        for i in 0..count {
            let model = ["org-SEP-a", "org-SEP-b", "c"][i % 3];
            let salt = if i % 5 == 0 { "@tenant" } else { "" };
            let name = format!("{model}@0x04000400@0@{i:064x}{salt}.data");
            fs::File::create(tmp.path().join(name)).unwrap();
        }
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        let inventory = scan(&dir).unwrap();
        assert_eq!(inventory.objects().len(), count);
        assert_eq!(inventory.names().model_count(), 3);
        for object in inventory.objects() {
            let name = inventory.names().name(&object.key).to_string();
            assert!(tmp.path().join(&name).is_file(), "{name}");
        }
        assert_eq!(inventory.reclaimable_bytes(), 0);
    }

    #[test]
    fn an_empty_directory_scans_to_an_empty_inventory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        let inventory = scan(&dir).unwrap();
        assert_eq!(inventory.totals(), InventoryTotals::default());
    }
}

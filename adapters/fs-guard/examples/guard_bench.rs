//! Measures the capacity guard for `benches/capacity_guard/run.sh`. Prints
//! one line of figures per command.
//!
//! - `guard-bench events DIR N`: a generator thread stores N objects as
//!   LMCache does (1-byte `.tmp` file renamed to `.data`) and opens and reads
//!   each, as fast as it can; then waits until the guard tracks N objects with
//!   `du`'s bytes. Lost events would show as rescans (queue overflows).
//! - `guard-bench cpu DIR SECONDS`: 200 stores a second (5 events each: 1,000
//!   events/s) for SECONDS; the guard thread's CPU time from
//!   `/proc/self/task/*/schedstat`.
//! - `guard-bench memory N...`: heap bytes per object of a tracker of N
//!   objects (named like `make_tier.py`'s), from a counting allocator, for
//!   each N: grown one write at a time, after evicting a fifth of its bytes
//!   from there, and made from a start-up count of N objects.
//! - `guard-bench count DIR`: housekeeping's scan alone and the guard's
//!   start-up count (scan + tracker) on the same directory, in the order
//!   scan, count, count, scan (two pairs, each side first once); the
//!   tracker's share (index and LRU order) in wall and CPU time.
//! - `guard-bench evict DIR`: a guard with the capacity just under the usage,
//!   trigger 1.0 and ratio 0.2, so its first cycle evicts a fifth of the
//!   objects; prints that cycle from the status file.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lmcache_capacity_guard::capacity::guard_specs;
use lmcache_capacity_guard::status::{read_status, GuardStatus};
use lmcache_capacity_guard::tracker::Tracker;
use lmcache_capacity_guard::{Guard, GuardOptions};
use lmcache_housekeeping::codec::parse_object_name;
use lmcache_housekeeping::scan::EntryStats;
use lmcache_housekeeping::tier_dir::AccessTimes;
use lmcache_housekeeping::{scan, Access, Inventory, ObjectName, TierDir};
use lmcache_tier_spec::Cascade;

/// Status interval while a figure waits on the status file.
const FAST_STATUS: Duration = Duration::from_millis(20);

struct Counting;
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new, Ordering::Relaxed);
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
        System.realloc(ptr, layout, new)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A 64-hex-digit hash from `i` (splitmix64, four rounds).
fn hash(i: u64) -> String {
    let mut x = i;
    (0..4)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            format!("{:016x}", z ^ (z >> 31))
        })
        .collect()
}

/// Names in `make_tier.py`'s mix of objects (TP=2 model, 10% salted; another
/// model; `bench l2` names).
fn name(i: u64) -> String {
    let h = hash(i);
    match i % 20 {
        0..=15 => {
            let salt = if i.is_multiple_of(10) {
                "@tenant-3"
            } else {
                ""
            };
            format!(
                "meta-llama-SEP-Llama-3.1-8B-Instruct@0x0200020{}@0@{h}{salt}.data",
                i & 1
            )
        }
        16..=17 => format!("Qwen-SEP-Qwen2.5-7B-Instruct@0x01000100@0@{h}.data"),
        _ => format!("bench-model@0x{:08x}@0@{}.data", i % 4, &h[..32]),
    }
}

fn store(dir: &Path, i: u64) {
    let data = name(i);
    let tmp = data.replace(".data", ".tmp");
    fs::write(dir.join(&tmp), b"k").unwrap();
    fs::rename(dir.join(&tmp), dir.join(&data)).unwrap();
}

fn du_objects(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".data"))
        .filter_map(|e| fs::symlink_metadata(e.path()).ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// A guard on `dir`; `status_interval` as in [`GuardOptions`].
fn guard(dir: &Path, capacity_gib: f64, eviction: &str, status_interval: Duration) -> Guard {
    let json = format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":{capacity_gib}{eviction}}}"#,
        dir.display()
    );
    let spec = guard_specs(&Cascade::parse(&json, "bench").unwrap())
        .unwrap()
        .remove(0);
    let options = GuardOptions {
        status_interval,
        ..GuardOptions::default()
    };
    Guard::start(spec, options).unwrap()
}

fn wait(dir: &Path, ok: impl Fn(&GuardStatus) -> bool) -> GuardStatus {
    let dir = TierDir::open(dir, Access::ReadOnly).unwrap();
    loop {
        if let Ok(Some(s)) = read_status(&dir) {
            if ok(&s) {
                return s;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// CPU nanoseconds of this process's thread named `name` (the kernel keeps 15 bytes of a name).
fn thread_cpu_ns(name: &str) -> u64 {
    for task in fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if name.starts_with(comm.trim()) {
            let stat = fs::read_to_string(task.path().join("schedstat")).unwrap();
            return stat.split_whitespace().next().unwrap().parse().unwrap();
        }
    }
    panic!("no thread {name}");
}

/// Heap bytes now.
fn heap() -> usize {
    ALLOCATED.load(Ordering::Relaxed)
}

/// Prints the heap bytes per object of trackers of `n` objects.
fn memory(n: u64) {
    let names: Vec<String> = (0..n).map(name).collect();
    let before = heap();
    let mut grown = Tracker::new();
    for name in &names {
        grown.upsert(&parse_object_name(name).unwrap(), 4096, false);
    }
    let grown_bytes = heap() - before;
    grown.take_lru(grown.usage() / 5);
    let evicted_bytes = heap() - before;
    let left = grown.len();
    drop(grown);
    let mut inventory = Inventory::new("/bench", AccessTimes::Recorded);
    for (i, name) in names.iter().enumerate() {
        let owned: ObjectName = name.parse().unwrap();
        let at = i as i64 * 1_000_000;
        let stats = EntryStats {
            allocated_bytes: 4096,
            modified_ns: at,
            accessed_ns: at,
        };
        inventory.add_object(&owned, stats);
    }
    let before = heap();
    let counted = Tracker::from_inventory(&inventory);
    let counted_bytes = heap() - before;
    assert_eq!(counted.len() as u64, n);
    println!(
        "memory objects={n} grown_heap_bytes={grown_bytes} grown_bytes_per_object={:.1} after_evicting_a_fifth_objects={left} bytes_per_object={:.1} start_up_count_heap_bytes={counted_bytes} bytes_per_object={:.1}",
        grown_bytes as f64 / n as f64,
        evicted_bytes as f64 / left as f64,
        counted_bytes as f64 / n as f64,
    );
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    match arg(1).as_str() {
        "events" => {
            let dir = Path::new(&args[2]);
            let n: u64 = arg(3).parse().unwrap();
            let g = guard(dir, 1.0, "", FAST_STATUS);
            wait(dir, |_| true);
            let started = Instant::now();
            let generator = {
                let dir = dir.to_path_buf();
                std::thread::spawn(move || {
                    for i in 0..n {
                        store(&dir, i);
                        fs::read(dir.join(name(i))).unwrap();
                    }
                })
            };
            generator.join().unwrap();
            let burst = started.elapsed();
            let du = du_objects(dir);
            let s = wait(dir, |s| s.tracked.objects == n && s.tracked.bytes == du);
            println!(
                "events objects={n} burst_s={:.2} stores_and_reads_per_s={:.0} inotify_events_per_s={:.0} caught_up_after_burst_ms={} rescans={} tracked_bytes={} du_bytes={du}",
                burst.as_secs_f64(),
                n as f64 / burst.as_secs_f64(),
                7.0 * n as f64 / burst.as_secs_f64(),
                started.elapsed().saturating_sub(burst).as_millis(),
                s.rescans,
                s.tracked.bytes,
            );
            g.stop();
        }
        "cpu" => {
            let dir = Path::new(&args[2]);
            let seconds: u64 = arg(3).parse().unwrap();
            // The status interval a server runs with (1 s).
            let g = guard(dir, 1.0, "", GuardOptions::default().status_interval);
            wait(dir, |_| true);
            let before = thread_cpu_ns("capacity-guard-0");
            let started = Instant::now();
            let stores = seconds * 200;
            for i in 0..stores {
                let due = started + Duration::from_micros(i * 5000);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                store(dir, i);
            }
            let wall = started.elapsed();
            wait(dir, |s| s.tracked.objects == stores);
            let cpu = thread_cpu_ns("capacity-guard-0") - before;
            println!(
                "cpu events_per_s={:.0} wall_s={:.1} guard_cpu_ms={:.1} guard_core_percent={:.2}",
                5.0 * stores as f64 / wall.as_secs_f64(),
                wall.as_secs_f64(),
                cpu as f64 / 1e6,
                100.0 * cpu as f64 / wall.as_nanos() as f64
            );
            g.stop();
        }
        "memory" => {
            for n in args[2..].iter().map(|a| a.parse::<u64>().unwrap()) {
                memory(n);
            }
        }
        "count" => {
            // Scan, count, count, scan: each comes first and second once, so
            // neither is favoured by what the other left in the caches.
            let dir = Path::new(&args[2]);
            let tier = TierDir::open(dir, Access::ReadOnly).unwrap();
            let time_scan = || {
                let started = Instant::now();
                let objects = scan(&tier).unwrap().objects().len();
                (started.elapsed().as_secs_f64(), objects)
            };
            let time_count = || {
                let started = Instant::now();
                let inventory = scan(&tier).unwrap();
                let (order_started, order_cpu) = (Instant::now(), thread_cpu_ns("guard-bench"));
                let tracker = Tracker::from_inventory(&inventory);
                let order_cpu_s = (thread_cpu_ns("guard-bench") - order_cpu) as f64 / 1e9;
                let order_s = order_started.elapsed().as_secs_f64();
                let count_s = started.elapsed().as_secs_f64();
                (count_s, order_s, order_cpu_s, tracker.len())
            };
            let (scan_1, objects) = time_scan();
            let count_1 = time_count();
            let count_2 = time_count();
            let (scan_2, _) = time_scan();
            for (pass, scan_s, (count_s, order_s, order_cpu_s, tracked)) in
                [(1, scan_1, count_1), (2, scan_2, count_2)]
            {
                println!(
                    "count pass={pass} objects={objects} housekeeping_scan_s={scan_s:.2} guard_start_count_s={count_s:.2} of_which_lru_order_s={order_s:.2} lru_order_cpu_s={order_cpu_s:.2} tracked={tracked}",
                );
            }
        }
        "evict" => {
            let dir = Path::new(&args[2]);
            let tier = TierDir::open(dir, Access::ReadOnly).unwrap();
            let usage = Tracker::from_inventory(&scan(&tier).unwrap()).usage();
            let capacity = (usage - 1) as f64 / (1u64 << 30) as f64;
            let g = guard(
                dir,
                capacity,
                r#","eviction":{"trigger_watermark":1.0,"eviction_ratio":0.2}"#,
                FAST_STATUS,
            );
            let s = wait(dir, |s| s.evictions.cycles > 0);
            let cycle = s.evictions.last_cycle.unwrap();
            println!(
                "evict tracked_at_start={} evicted={} evict_cycle_s={:.2} start_count_ms={}",
                s.start.found.objects,
                cycle.deleted.objects,
                cycle.millis as f64 / 1000.0,
                s.start.millis
            );
            g.stop();
        }
        _ => {
            eprintln!("usage: guard-bench events DIR N | cpu DIR SECONDS | memory N... | count DIR | evict DIR");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}

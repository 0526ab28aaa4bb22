//! The text form of an [`Inspection`]: aligned tables for people, in the
//! order `inspect` prints them: the server and what it reports, the L2
//! tiers, each S3 gateway (or the endpoint where none answers), each disk
//! tier as read from disk.
//!
//! Every value shown may come from the server or a gateway, which any
//! local process can impersonate: cells go through [`row`], which shows
//! control characters as `?`.

use lmcache_capacity_guard::status::{CountBytes, FreeSpace};
use lmcache_s3_gateway::state::GatewayState;
use lmcache_sizing::fmt_gib;

use super::launch_metrics::{describe, describe_tiers, LaunchMetrics};
use super::{DiskRow, Inspection, TierRow};
use crate::plan::gpu::{ExtensionCheck, GpuFacts};

impl Inspection {
    /// Aligned tables for people.
    pub fn to_text(&self) -> String {
        let mut out = table(&self.head_rows());
        if !self.tiers.is_empty() {
            out.push_str("\nL2 tiers, in cascade order\n");
            out.push_str(&tiers_table(&self.tiers));
        }
        for t in &self.tiers {
            out.push_str(&gateway_sections(t));
        }
        for d in &self.disk {
            out.push_str(&disk_section(d));
        }
        out
    }

    /// The first table: the server and its verdict, the stock `lmcache`,
    /// the engine, the workers, L1 and the store controller, each when
    /// known.
    fn head_rows(&self) -> Vec<Vec<String>> {
        let s = &self.server;
        let verdict = match (s.reachable, s.healthy) {
            (false, _) => "UNREACHABLE: showing what the disk tier holds".to_string(),
            (true, true) => "healthy".to_string(),
            (true, false) if s.unhealthy_parts.is_empty() => "UNHEALTHY".to_string(),
            (true, false) => format!("UNHEALTHY: {}", s.unhealthy_parts.join(", ")),
        };
        let mut head = vec![row([
            "server",
            &self.url,
            &format!("{}, {verdict}", s.answer),
        ])];
        if let Some(install) = &self.lmcache {
            head.push(row([
                "lmcache",
                install.version.as_deref().unwrap_or("?"),
                &install.describe(),
            ]));
        }
        if let Some(gpu) = &self.gpu {
            head.push(gpu_row(gpu));
        }
        if let Some(engine) = &s.engine_type {
            head.push(row([
                "engine",
                engine,
                &format!(
                    "chunk size {} tokens, hash {}",
                    opt(s.chunk_size),
                    s.hash_algorithm.as_deref().unwrap_or("-")
                ),
            ]));
        }
        if let Some(w) = &self.worker_liveness {
            head.push(row([
                "workers",
                &format!("{} tracked", opt(w.tracked_instances)),
                &format!(
                    "reaping {}, timeout {} s, registration grace {} s",
                    yes_no(w.enabled, "on", "off"),
                    opt(w.reap_timeout_seconds),
                    opt(w.registration_grace_seconds)
                ),
            ]));
        }
        if let Some(l1) = &self.l1 {
            head.push(row([
                "L1",
                &format!("{} of {}", bytes(l1.used_bytes), bytes(l1.total_bytes)),
                &format!("{} objects", opt(l1.objects)),
            ]));
        }
        if let Some(c) = &self.store_controller {
            head.push(row([
                "store controller",
                yes_no(c.is_healthy, "healthy", "UNHEALTHY"),
                &format!(
                    "thread {}, {} pending keys, {} tasks in flight, {}/{} tiers active, {} draining",
                    yes_no(c.thread_alive, "alive", "DEAD"),
                    opt(c.pending_keys_count),
                    opt(c.in_flight_task_count),
                    opt(c.num_active_adapters),
                    opt(c.num_l2_adapters),
                    opt(c.num_draining_adapters)
                ),
            ]));
        }
        if let Some(launch) = &self.launch {
            head.push(launch_row(launch));
            if let LaunchMetrics::Read { url, figures } = launch {
                for line in describe_tiers(figures) {
                    head.push(row(["tier", url, &line]));
                }
            }
        }
        head
    }
}

/// The node's GPUs and whether LMCache's compiled extensions load there.
fn gpu_row(gpu: &GpuFacts) -> Vec<String> {
    let verdict = match (&gpu.extensions, crate::plan::gpu::warning(gpu)) {
        (_, Some(warning)) => format!("WARNING: {warning}"),
        (ExtensionCheck::Loaded { torch, extensions }, None) => format!(
            "LMCache's compiled extensions load ({}) with torch {}",
            extensions.join(", "),
            torch.as_deref().unwrap_or("?")
        ),
        (_, None) => String::new(),
    };
    row(["gpu", &format!("{} visible", gpu.devices), &verdict])
}

/// The L2 tiers, one row each, in cascade order.
/// `used` is the true usage (on disk for a scanned filesystem tier);
/// LMCache's own count since its start follows, labelled, as a footnote
/// explains.
fn tiers_table(tiers: &[TierRow]) -> String {
    let mut rows = vec![row([
        "#",
        "type",
        "location",
        "healthy",
        "workers",
        "O_DIRECT",
        "capacity",
        "used",
        "LMCache's count",
        "eviction",
    ])];
    for t in tiers {
        let used = match t.used_source {
            Some("disk") => format!("{} on disk", bytes(t.used_bytes)),
            Some("bucket") => format!("{} in the bucket", bytes(t.used_bytes)),
            _ => bytes(t.used_bytes),
        };
        rows.push(row([
            &t.position.to_string(),
            t.adapter_type.as_deref().unwrap_or("-"),
            t.location.as_deref().unwrap_or("-"),
            yes_no(t.healthy, "yes", "NO"),
            &opt(t.workers),
            yes_no(t.use_odirect, "on", "off"),
            &bytes(t.capacity_bytes),
            &used,
            &bytes(t.lmcache_used_bytes),
            t.eviction_policy.as_deref().unwrap_or("-"),
        ]));
    }
    let mut out = table(&rows);
    if tiers.iter().any(|t| t.used_source == Some("disk")) {
        out.push_str("used: the objects on disk now; LMCache's count: what LMCache counted since its start (fs_native counts from 0 at each start)\n");
    }
    if tiers.iter().any(|t| t.used_source == Some("bucket")) {
        out.push_str("in the bucket: the LMCache objects under the tier's prefix, as its gateway last listed them, with this node's requests since; LMCache's count: this process's stores since its start\n");
    }
    out
}

/// What tier `t` says about its S3 gateway: the gateway's state, and the
/// endpoint where nothing answers; empty for a tier without either.
fn gateway_sections(t: &TierRow) -> String {
    let mut out = String::new();
    if let Some(g) = &t.gateway {
        out.push_str(&gateway_text(t, g));
    }
    if let (Some(cause), Some(endpoint)) = (&t.endpoint_down, &t.location) {
        out.push_str(&format!(
            "\nS3 tier {} on {}: nothing answers ({}): its gateway (or whatever should listen there) is down; writes to this tier fail until the server is restarted\n",
            t.position,
            printable(endpoint),
            printable(cause)
        ));
    }
    out
}

/// The text section of one tier's gateway.
fn gateway_text(tier: &TierRow, g: &GatewayState) -> String {
    let r = &g.requests;
    let prefix = match g.key_prefix.as_str() {
        "" => String::new(),
        p => format!(", key prefix {p}"),
    };
    let last = match &g.last_upstream_error {
        Some(e) => format!("; last at {}: {}", e.at, e.message),
        None => String::new(),
    };
    let mut rows = vec![
        row([
            "  upstream",
            &format!(
                "{}, bucket {}{prefix}, region {}, credentials from {}",
                g.upstream, g.bucket, g.region, g.credential_source
            ),
        ]),
        row([
            "  requests",
            &format!(
                "HEAD {}, GET {}, PUT {}, POST {}, DELETE {}, other {}; {} refused (403)",
                r.head, r.get, r.put, r.post, r.delete, r.other, g.rejected
            ),
        ]),
        row([
            "  traffic",
            &format!("{} bytes up, {} bytes down", g.bytes_up, g.bytes_down),
        ]),
        row([
            "  upstream errors",
            &format!(
                "{} (5xx or broken off), {} unreachable{last}",
                g.upstream_errors, g.upstream_unreachable
            ),
        ]),
        row(["  upstream denied", &denied_text(g)]),
    ];
    if let Some(b) = &g.bucket_bound {
        rows.push(row(["  bucket bound", &bound_text(b)]));
        rows.push(row(["  bucket evictor", &evictor_text(b)]));
    }
    format!(
        "\nS3 gateway of tier {} on {} (started {})\n{}",
        tier.position,
        printable(tier.location.as_deref().unwrap_or("-")),
        printable(&g.started_at),
        table(&rows)
    )
}

/// The store's 401 and 403 answers (credentials refused while running) in
/// one line (`docs/s3-gateway.md`, "Credentials refused while running").
fn denied_text(g: &GatewayState) -> String {
    match &g.last_upstream_denied {
        Some(last) => format!(
            "{} (401/403: the store refuses the credentials); last at {}: {}",
            g.upstream_denied, last.at, last.message
        ),
        None => format!("{} (401/403 from the store)", g.upstream_denied),
    }
}

/// The bucket bound's figures in one line.
fn bound_text(b: &lmcache_s3_gateway::bound::BoundState) -> String {
    format!(
        "{} in {} objects of {} (evicts from {}); {} objects ({}) evicted, {} failed; {} listings ({} requests, last {} ms, {} failed); other nodes added {} objects ({})",
        bytes(Some(b.usage_bytes)),
        b.objects,
        bytes(Some(b.spec.capacity_bytes)),
        bytes(Some(b.spec.trigger_bytes)),
        b.evicted_objects,
        bytes(Some(b.evicted_bytes)),
        b.eviction_failures,
        b.listings,
        b.listing_pages,
        b.last_listing_millis,
        b.listing_failures,
        b.others_added_objects,
        bytes(Some(b.others_added_bytes)),
    )
}

/// Who evicts for the bound's prefix, in one line (`docs/s3-gateway.md`,
/// "A fleet on one bucket").
fn evictor_text(b: &lmcache_s3_gateway::bound::BoundState) -> String {
    use lmcache_s3_gateway::fleet::Mode;
    if b.mode == Mode::EveryNode {
        return "every node lists and evicts on its own (the store takes no conditional writes)"
            .to_string();
    }
    let who = match (b.evictor, b.lease_holder.as_str()) {
        (true, _) => "this node holds the lease and evicts".to_string(),
        (false, "") => "no lease holder seen yet".to_string(),
        (false, holder) => format!("node {} holds the lease", printable(holder)),
    };
    let unchanged = b
        .lease_unchanged_millis
        .map_or("-".to_string(), |ms| format!("{:.1} s", ms as f64 / 1e3));
    format!(
        "{who} (node {} here; lease unchanged for {unchanged}, period {} s; taken {} times, lost {}); {} reporters, the fleet writes {}/s; {} reports sent, {} read",
        printable(&b.node),
        b.spec.timing.lease.as_secs(),
        b.lease.taken,
        b.lease.lost,
        b.reporters,
        bytes(Some(b.fleet_write_bytes_per_s)),
        b.reports_sent,
        b.reports_read,
    )
}

/// The section of one disk tier directory: its identity, what is on disk,
/// its capacity guard and any problem reading it.
fn disk_section(d: &DiskRow) -> String {
    let mut rows = Vec::new();
    let identity = match &d.identity {
        Some(i) => format!(
            "model {}, TP {}, PP {}, KV dtype {}, block {}, chunk {} (written {})",
            i.model,
            i.tensor_parallel_size,
            i.pipeline_parallel_size,
            i.kv_cache_dtype,
            i.block_size,
            i.chunk_size,
            d.written_at.as_deref().unwrap_or("-")
        ),
        None => format!("manifest {}", d.manifest),
    };
    rows.push(row(["  identity", &identity]));
    if let Some(u) = &d.usage {
        rows.push(row([
            "  on disk",
            &format!(
                "{} objects {}; {} stale temp files {}; {} other entries {} (kept)",
                u.objects.count,
                fmt_gib(u.objects.bytes),
                u.stale_temps.count,
                fmt_gib(u.stale_temps.bytes),
                u.foreign.count,
                fmt_gib(u.foreign.bytes)
            ),
        ]));
    }
    if let Some(g) = &d.guard {
        let state = match d.guard_running {
            Some(false) => "STOPPED, last state",
            _ => "running, state",
        };
        rows.push(row([
            "  capacity guard",
            &format!(
                "pid {} ({state} {} s old): {} objects {} of {} (evicts from {}); {} eviction cycles deleted {} objects {}{}",
                g.pid,
                d.guard_state_age_seconds.unwrap_or(0),
                g.tracked.objects,
                fmt_gib(g.tracked.bytes),
                fmt_gib(g.capacity_bytes),
                fmt_gib(g.trigger_bytes),
                g.evictions.cycles,
                g.evictions.deleted.objects,
                fmt_gib(g.evictions.deleted.bytes),
                undeletable(&g.undeletable)
            ),
        ]));
    }
    if let Some(f) = d.guard.as_ref().and_then(|g| g.free_space) {
        let running = d.guard_running != Some(false);
        rows.push(row(["  free space", &free_space(&f, running)]));
    }
    if let Some(p) = &d.problem {
        rows.push(row(["  problem", p]));
    }
    let path = printable(&d.path.display().to_string());
    format!("\ndisk tier {path}\n{}", table(&rows))
}

/// The part of a guard's row about the objects it could not delete, if
/// any: `; 3 objects it cannot delete (0.38 GiB), still counted`.
fn undeletable(count: &CountBytes) -> String {
    match count.objects {
        0 => String::new(),
        n => format!(
            "; {n} objects it cannot delete ({}), still counted",
            fmt_gib(count.bytes)
        ),
    }
}

/// The free space the guard keeps on the tier's volume, what it evicted to
/// keep it, and whether the volume is short with nothing left to evict
/// (now, for a `running` guard; at its last state for a stopped one).
fn free_space(f: &FreeSpace, running: bool) -> String {
    let short = match (f.short_since_unix_ms, f.shortages) {
        (Some(_), _) if !running => "; was short when the guard stopped".to_string(),
        (Some(_), _) => {
            "; SHORT NOW: below the line with nothing of the tier left to free, something else fills the volume"
                .to_string()
        }
        (None, 0) => String::new(),
        (None, n) => format!("; short {n} times with the tier empty"),
    };
    let inodes = match &f.inodes {
        Some(i) => format!(
            ", {} inodes free of {} (keeps {})",
            i.free_inodes, i.volume_inodes, i.line_inodes
        ),
        None => String::new(),
    };
    format!(
        "{} free of {} (keeps {}: reserve {}){inodes}; {} cycles evicted {} objects, freed {} to keep it{short}",
        fmt_gib(f.free_bytes),
        fmt_gib(f.volume_bytes),
        fmt_gib(f.line_bytes),
        fmt_gib(f.reserve_bytes),
        f.evictions.cycles,
        f.evictions.deleted.objects,
        fmt_gib(f.evictions.deleted.bytes)
    )
}

/// A table row. Control characters in a cell (the values come from the
/// server and the gateways, which any local process can impersonate) are
/// shown as `?`, so no answer can draw rows or move the terminal's cursor.
fn row<const N: usize>(cells: [&str; N]) -> Vec<String> {
    cells.iter().map(|c| printable(c)).collect()
}

/// `text` with control characters shown as `?`.
pub(super) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

fn yes_no(v: Option<bool>, yes: &'static str, no: &'static str) -> &'static str {
    match v {
        Some(true) => yes,
        Some(false) => no,
        None => "-",
    }
}

fn bytes(v: Option<u64>) -> String {
    v.map(fmt_gib).unwrap_or_else(|| "-".into())
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The launch's row: its figures, from its metrics endpoint.
fn launch_row(launch: &LaunchMetrics) -> Vec<String> {
    match launch {
        LaunchMetrics::Off => row(["launch", "-", "metrics endpoint off"]),
        LaunchMetrics::NoAnswer { url, why } => row([
            "launch",
            url,
            &format!("no answer from its metrics endpoint ({why})"),
        ]),
        LaunchMetrics::Read { url, figures } => row(["launch", url, &describe(figures)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_cells_show_control_characters_as_question_marks() {
        assert_eq!(
            row(["a\u{1b}[2Jb\nserver  healthy", "ok"]),
            ["a?[2Jb?server  healthy", "ok"]
        );
    }
}

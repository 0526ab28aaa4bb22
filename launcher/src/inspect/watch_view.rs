//! The frame `lmcache-tier inspect --watch` draws ([`super::live`]): a
//! header, a usage bar per tier against its capacity, then the text view
//! ([`Inspection::to_text`]), every row marked `*` when its values changed
//! since the previous refresh. Pure functions of two refreshes and the
//! terminal's size; `docs/inspect.md`, "`inspect --watch`", shows a frame.

use std::cmp::Ordering;
use std::collections::HashSet;
use std::time::Duration;

use lmcache_sizing::fmt_gib;

use super::text::printable;
use super::{Inspection, ServerState, TierRow};

/// The margin of a row whose values changed since the previous refresh.
const CHANGED: &str = "* ";
/// The margin of a row that did not change.
const SAME: &str = "  ";
/// The fewest and the most cells of a usage bar.
const BAR_CELLS: std::ops::RangeInclusive<usize> = 10..=60;
/// The most characters of a disk tier's path in a bar's label; longer ones
/// keep their end.
const PATH_CHARS: usize = 40;

/// One tier's usage against its capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Gauge {
    /// What it measures: `L1`, `L2 tier 0 FSNativeL2Adapter`,
    /// `guard <dir>` (a disk tier's capacity guard).
    label: String,
    /// Bytes used (for a guard: the bytes it tracks in the tier).
    used: u64,
    /// Capacity in bytes, above 0.
    capacity: u64,
}

/// What one refresh read, as a frame shows it and the next one compares it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Snapshot {
    /// When it was read (RFC 3339 UTC).
    at: String,
    /// The server's state.
    state: ServerState,
    /// Usage against capacity, tier by tier.
    gauges: Vec<Gauge>,
    /// The text view, line by line.
    lines: Vec<String>,
    /// The same lines with the capacity guard's state age at 0, since it
    /// counts up by itself: what tells a changed row.
    compared: Vec<String>,
}

impl Snapshot {
    /// The snapshot of `report`, read at `at` (RFC 3339 UTC).
    pub(super) fn of(report: &Inspection, at: String) -> Snapshot {
        let mut ageless = report.clone();
        for disk in &mut ageless.disk {
            disk.guard_state_age_seconds = None;
        }
        Snapshot {
            at,
            state: report.server.state,
            gauges: gauges(report),
            lines: report.to_text().lines().map(str::to_string).collect(),
            compared: ageless.to_text().lines().map(str::to_string).collect(),
        }
    }
}

/// The frame for a terminal of `size` (columns, rows) showing `now`, with
/// the changes since `before` marked, refreshed every `interval`: at most
/// `rows` lines of at most `columns` characters, control characters shown
/// as `?`. Lines longer than the terminal are cut, as `watch(1)` cuts them.
pub(super) fn frame(
    now: &Snapshot,
    before: Option<&Snapshot>,
    interval: Duration,
    size: (usize, usize),
) -> Vec<String> {
    let mut lines = vec![header(&now.at, interval, now.state), String::new()];
    lines.extend(usage_section(now, before, size.0));
    lines.push(String::new());
    lines.extend(marked_text(now, before));
    fit(&lines, size)
}

/// The first line: when the view was read, how often, the server's state
/// and how to stop.
fn header(at: &str, interval: Duration, state: ServerState) -> String {
    let server = match state {
        ServerState::Up => "server up",
        ServerState::Unhealthy => "server UNHEALTHY",
        ServerState::Down => "server DOWN (no answer), still refreshing",
    };
    format!(
        "lmcache-tier inspect --watch: read {at}, every {} s; {server}; Ctrl-C to stop",
        interval.as_secs_f64()
    )
}

/// The usage bars under their title, or why there are none.
fn usage_section(now: &Snapshot, before: Option<&Snapshot>, columns: usize) -> Vec<String> {
    if now.gauges.is_empty() {
        return vec!["usage against capacity: no tier reports a capacity and a usage".into()];
    }
    let mut lines = vec!["usage against capacity".to_string()];
    lines.extend(gauge_lines(
        &now.gauges,
        before.map(|b| b.gauges.as_slice()),
        columns,
    ));
    lines
}

/// The text view with each line's margin: [`CHANGED`] when it was not in
/// the previous refresh's view.
fn marked_text(now: &Snapshot, before: Option<&Snapshot>) -> Vec<String> {
    changed_lines(before.map(|b| b.compared.as_slice()), &now.compared)
        .into_iter()
        .zip(&now.lines)
        .map(|(changed, line)| format!("{}{line}", margin(changed)).trim_end().to_string())
        .collect()
}

fn margin(changed: bool) -> &'static str {
    if changed {
        CHANGED
    } else {
        SAME
    }
}

/// For each line of `now`: whether it is new since `before` (none on the
/// first refresh, where there is nothing to compare with).
fn changed_lines(before: Option<&[String]>, now: &[String]) -> Vec<bool> {
    let Some(before) = before else {
        return vec![false; now.len()];
    };
    let seen: HashSet<&str> = before.iter().map(String::as_str).collect();
    now.iter()
        .map(|line| !seen.contains(line.as_str()))
        .collect()
}

/// The gauges of `report`: L1, each L2 tier that reports a capacity and a
/// usage, and each disk tier's capacity guard (tracked bytes against its
/// capacity). A capacity of 0 has no bar.
fn gauges(report: &Inspection) -> Vec<Gauge> {
    let l1 = report
        .l1
        .iter()
        .filter_map(|l1| gauge("L1".into(), l1.used_bytes?, l1.total_bytes?));
    let tiers = report
        .tiers
        .iter()
        .filter_map(|t| gauge(tier_label(t), t.used_bytes?, t.capacity_bytes?));
    let guards = report.disk.iter().filter_map(|d| {
        let g = d.guard.as_ref()?;
        let path = shorten(&d.path.display().to_string(), PATH_CHARS);
        gauge(format!("guard {path}"), g.tracked.bytes, g.capacity_bytes)
    });
    l1.chain(tiers).chain(guards).collect()
}

fn gauge(label: String, used: u64, capacity: u64) -> Option<Gauge> {
    (capacity > 0).then(|| Gauge {
        label: printable(&label),
        used,
        capacity,
    })
}

fn tier_label(t: &TierRow) -> String {
    format!(
        "L2 tier {} {}",
        t.position,
        t.adapter_type.as_deref().unwrap_or("-")
    )
}

/// `text` in at most `most` characters: a longer one keeps its end after
/// `...` (the end of a path names the tier).
fn shorten(text: &str, most: usize) -> String {
    let count = text.chars().count();
    if count <= most {
        return text.to_string();
    }
    let tail: String = text.chars().skip(count + 3 - most).collect();
    format!("...{tail}")
}

/// One line per gauge: margin, label, bar, percent, amounts and, when the
/// usage changed since `before`, the change. The bars share one width,
/// what the longest line leaves of `columns`, within [`BAR_CELLS`].
fn gauge_lines(now: &[Gauge], before: Option<&[Gauge]>, columns: usize) -> Vec<String> {
    let label_width = now.iter().map(|g| g.label.chars().count()).max();
    let label_width = label_width.unwrap_or(0);
    let rows: Vec<(bool, &Gauge, String)> = now
        .iter()
        .map(|g| {
            let prior = before.map(|b| b.iter().find(|p| p.label == g.label));
            let (changed, figures) = figures(g, prior);
            (changed, g, figures)
        })
        .collect();
    let widest = rows.iter().map(|(_, _, f)| f.chars().count()).max();
    let taken = SAME.len() + label_width + 2 + 2 + 1 + widest.unwrap_or(0);
    let cells = columns
        .saturating_sub(taken)
        .clamp(*BAR_CELLS.start(), *BAR_CELLS.end());
    rows.into_iter()
        .map(|(changed, g, figures)| {
            format!(
                "{}{:<label_width$}  {} {figures}",
                margin(changed),
                g.label,
                bar(g.used, g.capacity, cells)
            )
        })
        .collect()
}

/// Whether gauge `g` changed since `prior` and its figures: percent, used
/// of capacity, and the change of usage. `prior` is `None` on the first
/// refresh, `Some(None)` for a gauge that was not there before (changed).
fn figures(g: &Gauge, prior: Option<Option<&Gauge>>) -> (bool, String) {
    let amounts = format!(
        "{:>3}% {} of {}",
        percent(g.used, g.capacity),
        fmt_gib(g.used),
        fmt_gib(g.capacity)
    );
    match prior {
        None => (false, amounts),
        Some(None) => (true, amounts),
        Some(Some(p)) => match delta(p.used, g.used) {
            Some(d) => (true, format!("{amounts}  {d}")),
            None => (p.capacity != g.capacity, amounts),
        },
    }
}

/// `[####------]`: `used` of `capacity` (above 0) in `cells` cells, rounded
/// down; full when over the capacity.
fn bar(used: u64, capacity: u64, cells: usize) -> String {
    let filled = u128::from(used) * cells as u128 / u128::from(capacity);
    let filled = usize::try_from(filled).unwrap_or(cells).min(cells);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(cells - filled))
}

/// `used` in whole percent of `capacity` (above 0), rounded to the
/// nearest as the GiB beside it are; above 100 when over it.
fn percent(used: u64, capacity: u64) -> u128 {
    (u128::from(used) * 200 + u128::from(capacity)) / (2 * u128::from(capacity))
}

/// The change from `before` to `now` bytes, `+0.03 GiB` or `-1.20 GiB`;
/// `None` when equal.
fn delta(before: u64, now: u64) -> Option<String> {
    match now.cmp(&before) {
        Ordering::Equal => None,
        Ordering::Greater => Some(format!("+{}", fmt_gib(now - before))),
        Ordering::Less => Some(format!("-{}", fmt_gib(before - now))),
    }
}

/// `lines` fitted to `size` (columns, rows): control characters as `?`,
/// each cut to the width, and when there are more than the rows, the last
/// row says how many are hidden.
fn fit(lines: &[String], (columns, rows): (usize, usize)) -> Vec<String> {
    let cut = |line: &str| printable(line).chars().take(columns).collect::<String>();
    let rows = rows.max(1);
    if lines.len() <= rows {
        return lines.iter().map(|l| cut(l)).collect();
    }
    let mut fitted: Vec<String> = lines[..rows - 1].iter().map(|l| cut(l)).collect();
    let hidden = lines.len() - (rows - 1);
    fitted.push(cut(&format!(
        "({hidden} more lines: enlarge the terminal, or run inspect without --watch)"
    )));
    fitted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Poll, ServerStatus};
    use std::path::PathBuf;

    const GIB: u64 = 1 << 30;

    fn g(label: &str, used: u64, capacity: u64) -> Gauge {
        Gauge {
            label: label.into(),
            used,
            capacity,
        }
    }

    #[test]
    fn a_bar_fills_its_share_of_the_cells_rounded_down_and_stops_full() {
        assert_eq!(
            bar(45 * GIB / 100, GIB, 20),
            "[########------------]",
            "0.45 of 20 cells is 8.x"
        );
        assert_eq!(bar(GIB / 2, GIB, 20), "[##########----------]");
        assert_eq!(bar(0, GIB, 10), "[----------]");
        assert_eq!(bar(3 * GIB, GIB, 10), "[##########]");
        assert_eq!(bar(u64::MAX, 1, 10), "[##########]");
        assert_eq!(percent(GIB / 2, GIB), 50);
        assert_eq!(percent(3 * GIB / 2, GIB), 150);
        assert_eq!(percent(GIB / 10, GIB), 10, "9.99... rounds to 10");
        assert_eq!(percent(GIB / 1000, GIB), 0);
    }

    #[test]
    fn a_delta_is_signed_gib_and_none_when_nothing_changed() {
        assert_eq!(delta(GIB, GIB), None);
        assert_eq!(delta(0, 3 * GIB / 100 + 1).as_deref(), Some("+0.03 GiB"));
        assert_eq!(delta(2 * GIB, 4 * GIB / 5).as_deref(), Some("-1.20 GiB"));
        assert_eq!(delta(0, 1).as_deref(), Some("+<0.01 GiB"));
    }

    #[test]
    fn gauge_lines_mark_a_changed_usage_with_its_delta_and_share_a_bar_width() {
        let before = [
            g("L1", GIB / 4, GIB),
            g("L2 tier 0 FSNativeL2Adapter", 0, GIB),
        ];
        let now = [
            g("L1", GIB / 4, GIB),
            g("L2 tier 0 FSNativeL2Adapter", GIB / 2, GIB),
        ];
        let lines = gauge_lines(&now, Some(&before), 100);
        assert_eq!(
            lines[0],
            format!(
                "  {:<27}  [{}{}]  25% 0.25 GiB of 1.00 GiB",
                "L1",
                "#".repeat(7),
                "-".repeat(23)
            )
        );
        assert!(
            lines[1].starts_with(&format!(
                "* L2 tier 0 FSNativeL2Adapter  [{}-",
                "#".repeat(15)
            )) && lines[1].ends_with("]  50% 0.50 GiB of 1.00 GiB  +0.50 GiB"),
            "{lines:#?}"
        );
        assert_eq!(lines[1].chars().count(), 100, "{lines:#?}");
        let widths: Vec<usize> = lines.iter().map(|l| l.find(']').unwrap()).collect();
        assert_eq!(widths[0], widths[1], "{lines:#?}");
    }

    #[test]
    fn gauge_lines_mark_nothing_first_and_a_new_or_resized_gauge_later() {
        let now = [g("L1", 1, GIB), g("guard /t", 0, 2 * GIB)];
        assert!(gauge_lines(&now, None, 80)
            .iter()
            .all(|l| l.starts_with(SAME)));
        let before = [g("L1", 1, 2 * GIB)];
        let lines = gauge_lines(&now, Some(&before), 80);
        assert!(lines.iter().all(|l| l.starts_with(CHANGED)), "{lines:#?}");
        assert!(lines.iter().all(|l| !l.contains('+')), "{lines:#?}");
    }

    #[test]
    fn a_narrow_terminal_keeps_the_smallest_bar_and_a_wide_one_the_largest() {
        let now = [g("L1", GIB, 2 * GIB)];
        let narrow = gauge_lines(&now, None, 20);
        assert!(narrow[0].contains(&format!("[{}{}]", "#".repeat(5), "-".repeat(5))));
        let wide = gauge_lines(&now, None, 400);
        assert!(wide[0].contains(&format!("[{}{}]", "#".repeat(30), "-".repeat(30))));
    }

    #[test]
    fn lines_not_in_the_previous_view_are_changed() {
        let before = ["a".to_string(), "b".into(), String::new()];
        let now = ["a".to_string(), "c".into(), String::new()];
        assert_eq!(changed_lines(None, &now), [false, false, false]);
        assert_eq!(changed_lines(Some(&before), &now), [false, true, false]);
    }

    #[test]
    fn long_paths_keep_their_end() {
        assert_eq!(shorten("/short", 10), "/short");
        assert_eq!(shorten("/a/very/long/path/cache", 12), "...ath/cache");
        assert_eq!(shorten("/a/very/long/path/cache", 12).len(), 12);
    }

    #[test]
    fn a_frame_fits_the_terminal_and_says_how_many_lines_it_hides() {
        let lines: Vec<String> = (0..10).map(|i| format!("line {i} \u{1b}[2J")).collect();
        let fitted = fit(&lines, (8, 4));
        assert_eq!(fitted, ["line 0 ?", "line 1 ?", "line 2 ?", "(7 more "]);
        assert_eq!(fit(&lines[..2], (80, 4)), ["line 0 ?[2J", "line 1 ?[2J"]);
    }

    fn report(used: u64, up: bool) -> Inspection {
        let body = serde_json::json!({"is_healthy": true, "engine_type": "mp",
            "storage_manager": {"l2_adapters": [
                {"type": "FSNativeL2Adapter", "base_path": "/nowhere/cache", "is_healthy": true}],
            "l2_eviction_controller": {"adapters": [
                {"total_capacity_bytes": GIB, "total_bytes_used": used}]}}});
        let poll = match up {
            true => Poll::Up(Box::new(
                ServerStatus::parse(body.to_string().as_bytes()).unwrap(),
            )),
            false => Poll::NoAnswer("connection refused".into()),
        };
        let url = "http://127.0.0.1:1/status";
        Inspection::build(url, &poll, &[PathBuf::from("/nowhere/cache")], None)
    }

    #[test]
    fn a_frame_has_the_header_a_bar_per_tier_and_marks_what_changed() {
        let at = "2025-01-02T03:04:05Z".to_string();
        let first = Snapshot::of(&report(GIB / 4, true), at.clone());
        let second = Snapshot::of(&report(GIB / 2, true), at);
        let interval = Duration::from_millis(500);
        let shown = frame(&first, None, interval, (120, 50));
        assert_eq!(
            shown[0],
            "lmcache-tier inspect --watch: read 2025-01-02T03:04:05Z, every 0.5 s; server up; Ctrl-C to stop"
        );
        let bar_line = |f: &[String]| {
            f.iter()
                .find(|l| l.contains("L2 tier 0 FSNativeL2Adapter  ["))
                .cloned()
                .unwrap_or_else(|| panic!("{f:#?}"))
        };
        assert!(bar_line(&shown).contains("25% 0.25 GiB of 1.00 GiB"));
        assert!(
            shown[1..].iter().all(|l| !l.starts_with(CHANGED)),
            "{shown:#?}"
        );
        let shown = frame(&second, Some(&first), interval, (120, 50));
        assert!(bar_line(&shown).starts_with("* "), "{shown:#?}");
        assert!(bar_line(&shown).ends_with("+0.25 GiB"), "{shown:#?}");
        let marked: Vec<&String> = shown.iter().filter(|l| l.starts_with(CHANGED)).collect();
        assert_eq!(marked.len(), 2, "the bar and the tier's row: {shown:#?}");
        assert!(marked[1].contains("FSNativeL2Adapter"), "{shown:#?}");
        let again = frame(&second, Some(&second), interval, (120, 50));
        assert!(again.iter().all(|l| !l.starts_with(CHANGED)), "{again:#?}");
    }

    #[test]
    fn a_server_that_is_down_is_said_in_the_header_and_the_view() {
        let down = Snapshot::of(&report(0, false), "t".into());
        let shown = frame(&down, None, Duration::from_secs(2), (200, 50));
        assert!(
            shown[0].contains("every 2 s; server DOWN (no answer), still refreshing"),
            "{shown:#?}"
        );
        assert_eq!(
            shown[2],
            "usage against capacity: no tier reports a capacity and a usage"
        );
        assert!(
            shown.iter().any(|l| l.contains("UNREACHABLE")),
            "{shown:#?}"
        );
    }

    /// A capacity guard's state for the report's disk tier: `tracked` of
    /// 1 GiB, written `age` seconds ago.
    fn with_guard(mut report: Inspection, tracked: u64, age: u64) -> Inspection {
        let state = serde_json::json!({"version": 1, "pid": 1, "tier": 0,
            "adapter_type": "FSNativeL2Adapter", "base_path": "/nowhere/cache",
            "role": "hard_bound", "capacity_bytes": GIB, "trigger_bytes": GIB,
            "eviction_ratio": 0.1, "tracked": {"objects": 1, "bytes": tracked},
            "start": {"objects": 0, "bytes": 0, "millis": 1},
            "evictions": {"cycles": 0, "objects": 0, "bytes": 0, "last_cycle": null},
            "following": "inotify", "rescans": 0, "updated_unix_ms": 1});
        report.disk[0].guard = Some(serde_json::from_value(state).unwrap());
        report.disk[0].guard_running = Some(true);
        report.disk[0].guard_state_age_seconds = Some(age);
        report
    }

    #[test]
    fn a_guard_has_a_bar_and_its_state_age_alone_marks_nothing() {
        let old = Snapshot::of(&with_guard(report(0, false), GIB / 10, 3), "t".into());
        let new = Snapshot::of(&with_guard(report(0, false), GIB / 10, 4), "t".into());
        let shown = frame(&new, Some(&old), Duration::from_secs(1), (200, 50));
        assert!(shown.iter().all(|l| !l.starts_with(CHANGED)), "{shown:#?}");
        assert!(
            shown
                .iter()
                .any(|l| l.starts_with("  guard /nowhere/cache  [#")
                    && l.ends_with(" 10% 0.10 GiB of 1.00 GiB")),
            "{shown:#?}"
        );
        assert!(
            shown.iter().any(|l| l.contains("state 4 s old")),
            "{shown:#?}"
        );
        let grown = Snapshot::of(&with_guard(report(0, false), GIB / 5, 5), "t".into());
        let shown = frame(&grown, Some(&new), Duration::from_secs(1), (200, 50));
        let marked: Vec<&String> = shown.iter().filter(|l| l.starts_with(CHANGED)).collect();
        assert_eq!(marked.len(), 2, "the bar and the guard's row: {shown:#?}");
        assert!(marked[0].ends_with("+0.10 GiB"), "{shown:#?}");
        assert!(marked[1].contains("capacity guard"), "{shown:#?}");
    }
}

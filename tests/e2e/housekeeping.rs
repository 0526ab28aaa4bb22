//! End to end with the real server: launch housekeeping keeps the cache across
//! a restart with the same launch identity (the bench's first lookups hit),
//! serves a disk hit from L1 the next time (LMCache's L2 prefetch policy
//! `retain`), purges it when the identity changes (the log says which field), and never
//! touches a file that is not a cache object. After the restart `inspect`
//! shows the tier's true usage, what is on disk, beside LMCache's own count,
//! which starts again from 0.

use std::fs;
use std::time::Duration;

use lmcache_tier_e2e::{
    binaries, data_objects, free_port, run_one_layer_bench, stop_launch, wait_for_status, Binaries,
    Proc,
};

const BINS: Binaries = binaries!();

/// `lmcache-tier inspect --json` of the node at `url` whose disk tier is
/// `cache`.
fn inspect_json(url: &str, cache: &std::path::Path) -> serde_json::Value {
    let out = std::process::Command::new(BINS.lmcache_tier())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", cache)
        .args(["inspect", "--json", "--url", url])
        .output()
        .expect("inspect runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// The `(L1, L2)` counts of each of LMCache's `N/M retained keys (x L1,
/// y L2)` lines in `log`.
fn retained(log: &str) -> Vec<(u32, u32)> {
    log.split("retained keys (")
        .skip(1)
        .filter_map(|rest| {
            let (l1, rest) = rest.split_once(" L1, ")?;
            let (l2, _) = rest.split_once(" L2)")?;
            Some((l1.parse().ok()?, l2.parse().ok()?))
        })
        .collect()
}

#[test]
fn restart_keeps_the_cache_and_an_identity_change_purges_it() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cache = dir.join("cache");
    let (mp_port, http_port) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{http_port}/status");
    let chunk_256 = ["--max-num-batched-tokens", "512"];

    // 1. First launch: the bench stores sequences 0..3.
    let mut launch = Proc::spawn(
        BINS.launch_command(dir, mp_port, http_port, &chunk_256),
        &dir.join("launch-1.log"),
    );
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let first = run_one_layer_bench(dir, mp_port, http_port, 0, 3);
    assert!(first.status.success(), "{}", first.output);
    assert_eq!(
        first.full_cold_hits(),
        0,
        "a fresh cache cannot hit:\n{}",
        first.output
    );
    stop_launch(&mut launch);
    let stored = data_objects(&cache);
    assert!(
        stored.len() >= 12,
        "3 requests x 4 chunks expected, found {stored:?}"
    );
    assert!(
        cache.join(".lmcache-tier-identity.json").is_file(),
        "no identity manifest"
    );
    let foreign = cache.join("model.safetensors");
    fs::write(&foreign, b"not a cache object").unwrap();

    // 2. Same identity: every object is kept, and the bench's cold lookups of
    //    the same sequences hit on the disk tier.
    let mut launch = Proc::spawn(
        BINS.launch_command(dir, mp_port, http_port, &chunk_256),
        &dir.join("launch-2.log"),
    );
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    assert_eq!(
        data_objects(&cache),
        stored,
        "objects of the same identity were removed"
    );
    let report = inspect_json(&url, &cache);
    let tier = &report["tiers"][0];
    assert_eq!(tier["type"], "FSNativeL2Adapter", "{report:#}");
    assert_eq!(tier["used_source"], "disk", "{report:#}");
    assert_eq!(tier["lmcache_used_bytes"], 0, "{report:#}");
    assert_eq!(
        tier["used_bytes"], report["disk"][0]["usage"]["objects"]["bytes"],
        "{report:#}"
    );
    assert!(
        tier["used_bytes"].as_u64().unwrap() >= stored.len() as u64 * (1 << 20),
        "{report:#}"
    );
    let before = launch.output().len();
    let second = run_one_layer_bench(dir, mp_port, http_port, 0, 3);
    assert!(second.status.success(), "{}", second.output);
    assert_eq!(
        second.full_cold_hits(),
        3,
        "cold lookups should hit after a restart:\n{}",
        second.output
    );
    let from_disk = retained(&launch.output()[before..]);
    assert!(
        from_disk.iter().filter(|&&(_, l2)| l2 > 0).count() >= 3,
        "each request's first read after the restart comes from the disk tier: {from_disk:?}"
    );
    // 2b. A disk hit stays in L1 (the plan's --l2-prefetch-policy retain):
    //     the same sequences again are served from L1 alone.
    let before = launch.output().len();
    let third = run_one_layer_bench(dir, mp_port, http_port, 0, 3);
    assert!(third.status.success(), "{}", third.output);
    assert_eq!(third.full_cold_hits(), 3, "{}", third.output);
    let from_l1 = retained(&launch.output()[before..]);
    assert!(
        !from_l1.is_empty() && from_l1.iter().all(|&(l1, l2)| l1 > 0 && l2 == 0),
        "the repeats should come from L1 alone: {from_l1:?}"
    );
    let log = launch.output();
    assert!(log.contains("housekeeping"), "{log}");
    stop_launch(&mut launch);

    // 3. Another chunk size: every object is purged and the log says why.
    let mut launch = Proc::spawn(
        BINS.launch_command(
            dir,
            mp_port,
            http_port,
            &["--max-num-batched-tokens", "1024"],
        ),
        &dir.join("launch-3.log"),
    );
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    assert_eq!(
        data_objects(&cache),
        Vec::<String>::new(),
        "objects of the old chunk size survived"
    );
    let log = launch.output();
    assert!(log.contains("chunk_size changed from 256 to 512"), "{log}");
    stop_launch(&mut launch);
    assert_eq!(fs::read(&foreign).unwrap(), b"not a cache object");
}

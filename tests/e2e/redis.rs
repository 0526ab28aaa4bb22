//! End to end: Debian's `redis-server` on loopback as a `resp` tier
//! (`docs/redis.md`), behind real launches with LMCache's CPU bench: its
//! chunks stored in Redis and loaded back by a node that starts empty, the
//! password on no command line and in no log, dry run or `inspect`; a
//! Redis that would refuse stores and one that is down stop the launch;
//! one without `maxmemory`, one shared with another cache identity and one
//! restarted under the server are warned of.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use lmcache_resp::identity::marker_key;
use lmcache_tier_e2e::redis::{Redis, RedisOptions};
use lmcache_tier_e2e::{
    binaries, cmdline_and_environ, free_port, get_text, processes_mentioning, run_one_layer_bench,
    stop_launch, wait_for_status, wait_until, Binaries, Proc,
};

const BINS: Binaries = binaries!();
const PASSWORD: &str = "e2e-Redis-S3CRET-4711";

/// The chunks of one CPU-bench sequence at the launches' `--chunk-size 32`.
const SEQUENCE_CHUNKS: usize = 1024 / 32;

/// A `resp` tier on `redis`, with `extra` keys.
fn resp_tier(redis: &Redis, extra: serde_json::Value) -> serde_json::Value {
    let mut tier = serde_json::json!({"type": "resp", "host": "127.0.0.1", "port": redis.port});
    tier.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    tier
}

/// `lmcache-tier launch` in `node` with `tier` as its only L2 tier and
/// `args` after `--model test-model`, its metrics on `metrics_port`.
fn launch_command(
    node: &Path,
    ports: (u16, u16, u16),
    tier: &serde_json::Value,
    args: &[&str],
) -> Command {
    let (mp_port, http_port, metrics_port) = ports;
    let mut cmd = BINS.launch_command(node, mp_port, http_port, args);
    cmd.env(
        "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        serde_json::json!([tier]).to_string(),
    )
    .env(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    )
    .env("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size 32")
    .env("LMCACHE_TRACK_USAGE", "false");
    cmd
}

/// [`launch_command`] started, once its server answers.
fn launch(node: &Path, ports: (u16, u16, u16), tier: &serde_json::Value) -> Proc {
    std::fs::create_dir_all(node).unwrap();
    let cmd = launch_command(node, ports, tier, &[]);
    let mut launch = Proc::spawn(cmd, &node.join("launch.log"));
    let url = format!("http://127.0.0.1:{}/status", ports.1);
    wait_for_status(&url, &mut launch, Duration::from_secs(300));
    launch
}

fn ports() -> (u16, u16, u16) {
    (free_port(), free_port(), free_port())
}

/// LMCache's keys in `redis` (its keys hold an `@`; the identity hash does
/// not).
fn lmcache_keys(redis: &Redis) -> usize {
    redis.keys("*@*").len()
}

#[test]
fn a_launch_stores_and_loads_through_redis_with_its_password_on_no_command_line() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_redis!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let options = RedisOptions {
        password: Some(PASSWORD),
        ..RedisOptions::default()
    };
    let redis = Redis::start(dir, free_port(), options);
    let tier = resp_tier(
        &redis,
        serde_json::json!({"password": PASSWORD, "max_capacity_gb": 0.2}),
    );

    // The dry run shows where the password goes, never the password.
    let node = dir.join("writer");
    std::fs::create_dir_all(&node).unwrap();
    let dry = launch_command(&node, ports(), &tier, &["--dry-run", "--json"])
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{plan}{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(!plan.contains(PASSWORD), "{plan}");
    let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert_eq!(plan["env"]["LMCACHE_RESP_PASSWORD"], "<redacted>", "{plan}");

    // A node stores 4 sequences in Redis.
    let writer_ports = ports();
    let mut writer = launch(&node, writer_ports, &tier);
    let mentioning = processes_mentioning(PASSWORD);
    assert!(
        mentioning.is_empty(),
        "the password on a command line: {mentioning:?}"
    );
    let servers = processes_mentioning(&format!("--port {}", writer_ports.0));
    let lmcache = servers
        .iter()
        .find(|(_, cmdline)| cmdline.contains("bin/lmcache server"))
        .unwrap_or_else(|| panic!("no lmcache server among {servers:?}"));
    assert!(
        cmdline_and_environ(lmcache.0).contains(&format!("LMCACHE_RESP_PASSWORD={PASSWORD}")),
        "LMCache reads it from its environment"
    );
    let stored = run_one_layer_bench(&node, writer_ports.0, writer_ports.1, 0, 4);
    assert!(stored.status.success(), "bench failed:\n{}", stored.output);
    let expected = 4 * SEQUENCE_CHUNKS;
    assert!(
        wait_until(Duration::from_secs(60), || lmcache_keys(&redis) >= expected),
        "{} of {expected} chunks in Redis",
        lmcache_keys(&redis)
    );
    // inspect shows the launch's last read of the Redis (every 10 s): the
    // chunks' 16 MiB once a read follows the bench.
    let used_memory = || {
        let inspect = BINS.inspect_json(&node, writer_ports.1, writer_ports.2);
        let text = inspect.to_string();
        assert!(!text.contains(PASSWORD), "{text}");
        let series = inspect["launch"]["figures"]["tier_series"]
            .as_array()
            .cloned();
        let used = series
            .into_iter()
            .flatten()
            .find(|s| s["name"] == "resp_used_memory_bytes");
        used.and_then(|s| s["value"].as_f64()).unwrap_or(0.0)
    };
    assert!(
        wait_until(Duration::from_secs(30), || used_memory()
            > (16 << 20) as f64),
        "inspect's used memory: {}",
        used_memory()
    );
    let page = get_text(&format!("http://127.0.0.1:{}/metrics", writer_ports.2)).unwrap();
    assert!(
        page.contains(r#"lmcache_tier_resp_up{tier="0",kind="resp"} 1"#),
        "{page}"
    );
    stop_launch(&mut writer);
    let log = writer.output();
    assert!(!log.contains(PASSWORD), "the password in the launch log");
    assert!(log.contains("L2 tier 0 (resp): Redis 7."), "{log}");

    // A node that starts empty loads them back from Redis.
    let reader_node = dir.join("reader");
    let reader_ports = ports();
    let mut reader = launch(&reader_node, reader_ports, &tier);
    let loaded = run_one_layer_bench(&reader_node, reader_ports.0, reader_ports.1, 0, 4);
    assert!(loaded.status.success(), "bench failed:\n{}", loaded.output);
    assert!(
        loaded.full_cold_hits() >= 4,
        "cold lookups that hit:\n{}",
        loaded.output
    );
    stop_launch(&mut reader);
}

#[test]
fn a_redis_that_would_refuse_stores_or_is_down_stops_the_launch_before_the_server() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_redis!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let full = Redis::start(
        dir,
        free_port(),
        RedisOptions {
            maxmemory: "64mb",
            policy: "noeviction",
            ..RedisOptions::default()
        },
    );
    let nobody = free_port();
    let down = serde_json::json!({"type": "resp", "host": "127.0.0.1", "port": nobody});
    for (tier, said) in [
        (
            resp_tier(&full, serde_json::json!({})),
            "maxmemory-policy noeviction, which evicts none of LMCache's keys",
        ),
        (down, "cannot use Redis at 127.0.0.1:"),
    ] {
        let node = dir.join(format!("node-{}", tier["port"]));
        std::fs::create_dir_all(&node).unwrap();
        let ports = ports();
        let out = launch_command(&node, ports, &tier, &[]).output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{log}");
        assert!(log.contains(said), "{log}");
        assert!(!log.contains("LMCache server started"), "{log}");
        assert!(processes_mentioning(&format!("--port {}", ports.0)).is_empty());
    }
}

#[test]
fn a_redis_without_maxmemory_shared_across_identities_and_restarted_is_warned_of() {
    lmcache_tier_e2e::require_lmcache!();
    lmcache_tier_e2e::require_redis!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut redis = Redis::start(
        dir,
        free_port(),
        RedisOptions {
            maxmemory: "0",
            ..RedisOptions::default()
        },
    );
    // Another identity of the same model served from this Redis before.
    redis.cli(&["HSET", &marker_key("test-model"), "00000000deadbeef", "1"]);
    let node = dir.join("node");
    let ports = ports();
    let mut launch = launch(&node, ports, &resp_tier(&redis, serde_json::json!({})));
    let log = launch.output();
    assert!(
        log.contains("has no maxmemory, and the tier no max_capacity_gb"),
        "{log}"
    );
    assert!(
        log.contains("under other cache identities too (00000000deadbeef;"),
        "{log}"
    );
    let recorded = redis.cli(&["HKEYS", &marker_key("test-model")]);
    assert_eq!(recorded.lines().count(), 2, "{recorded}");

    redis.restart();
    let metrics = format!("http://127.0.0.1:{}/metrics", ports.2);
    let restarted = r#"lmcache_tier_resp_restarts_seen_total{tier="0",kind="resp"} 1"#;
    assert!(
        wait_until(Duration::from_secs(30), || {
            launch
                .output()
                .contains("restarted under the running LMCache server")
                && get_text(&metrics).is_some_and(|page| page.contains(restarted))
        }),
        "{}",
        launch.output()
    );
    stop_launch(&mut launch);
}

//! The `resp` adapter against Debian's real `redis-server` on loopback
//! (`docs/redis.md`): reached with its credentials, judged by its
//! `maxmemory` and policy, the identity recorded, and its figures read at
//! every scrape, through the same seam the launch drives.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use lmcache_resp::adapter::{RespTiers, RESP_CHECKED};
use lmcache_resp::identity::{marker_key, CacheIdentity};
use lmcache_resp::RespError;
use lmcache_tier_e2e::redis::{Redis, RedisOptions};
use lmcache_tier_e2e::{free_port, require_redis, wait_until};
use lmcache_tier_spec::adapter::{RunningTiers, StartContext, TierAdapter};
use lmcache_tier_spec::Cascade;

const PASSWORD: &str = "resp-test-S3CRET";

fn cascade(tiers: &[serde_json::Value]) -> Cascade {
    Cascade::parse(&serde_json::Value::from(tiers.to_vec()).to_string(), "test").unwrap()
}

fn tier(port: u16, extra: serde_json::Value) -> serde_json::Value {
    let mut tier = serde_json::json!({"type": "resp", "host": "127.0.0.1", "port": port});
    tier.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    tier
}

fn identity(tag: &str) -> CacheIdentity {
    CacheIdentity {
        model: "org/model".into(),
        tag: tag.into(),
    }
}

/// Starts the adapter of `cascade` with `env` as the server's environment.
async fn start(
    cascade: &Cascade,
    identity: Option<CacheIdentity>,
    env: &[(&str, &str)],
) -> Result<lmcache_resp::adapter::RunningResp, RespError> {
    // Read every 100 ms rather than every 10 s: the tests wait on reads.
    let adapter = RespTiers::of(cascade, identity).with_watch_period(Duration::from_millis(100));
    adapter.check()?;
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = move |name: &str| env.get(name).cloned();
    let context = StartContext {
        env: &lookup,
        owner: "test",
        node_dir: None,
    };
    adapter.start(&context).await
}

/// The series of `running` now, as `family{tier} -> value`.
fn series(running: &lmcache_resp::adapter::RunningResp) -> BTreeMap<String, u64> {
    let source = running.series().expect("a resp tier has series");
    source
        .series()
        .into_iter()
        .map(|s| (format!("{}{{{}}}", s.family, s.tier), s.value))
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_with_a_password_is_reached_and_its_credentials_leave_the_command_line() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    let options = RedisOptions {
        password: Some(PASSWORD),
        maxmemory: "64mb",
        ..RedisOptions::default()
    };
    let redis = Redis::start(dir.path(), free_port(), options);
    let written = cascade(&[
        serde_json::json!({"type": "fs", "base_path": "/x"}),
        tier(
            redis.port,
            serde_json::json!({"password": PASSWORD, "num_workers": 2}),
        ),
    ]);
    let running = start(&written, Some(identity("aaaa")), &[]).await.unwrap();

    let mut server = written.clone();
    running.server_tiers(&mut server);
    assert_eq!(
        server.tiers()[0],
        written.tiers()[0],
        "other kinds as written"
    );
    let resp = server.tiers()[1].to_arg();
    assert!(
        !resp.contains(PASSWORD) && !resp.contains("password"),
        "{resp}"
    );
    assert!(resp.contains(r#""num_workers":2"#), "{resp}");
    assert_eq!(
        running.server_env(),
        [
            ("LMCACHE_RESP_PASSWORD", Some(PASSWORD.to_string())),
            (RESP_CHECKED, Some("1".to_string()))
        ]
    );

    // The watcher's next read sees the identity hash the start wrote.
    let hash = || series(&running).get("resp_keys{1}") == Some(&1);
    assert!(
        wait_until(Duration::from_secs(10), hash),
        "{:?}",
        series(&running)
    );
    let figures = series(&running);
    assert_eq!(figures["resp_up{1}"], 1, "{figures:?}");
    assert_eq!(figures["resp_max_memory{1}"], 64 << 20, "{figures:?}");
    assert!(figures["resp_used_memory{1}"] > 0, "{figures:?}");
    assert!(figures.contains_key("resp_keyspace_hits{1}"), "{figures:?}");
    assert_eq!(
        redis.cli(&["HKEYS", &marker_key("org/model")]),
        "aaaa",
        "the launch's identity is recorded"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn credentials_come_from_the_environment_and_wrong_ones_are_named_not_shown() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    let options = RedisOptions {
        password: Some(PASSWORD),
        ..RedisOptions::default()
    };
    let redis = Redis::start(dir.path(), free_port(), options);
    let plain = cascade(&[tier(redis.port, serde_json::json!({}))]);
    let running = start(&plain, None, &[("LMCACHE_RESP_PASSWORD", PASSWORD)])
        .await
        .unwrap();
    assert_eq!(
        running.server_env(),
        [(RESP_CHECKED, Some("1".to_string()))],
        "the environment's credentials pass through"
    );
    assert_eq!(redis.cli(&["DBSIZE"]), "0", "no identity without a launch");

    for (written, env) in [
        (serde_json::json!({"password": "not-it"}), vec![]),
        (
            serde_json::json!({}),
            vec![("LMCACHE_RESP_PASSWORD", "not-it")],
        ),
        (serde_json::json!({}), vec![]),
        (
            serde_json::json!({"username": "nobody", "password": PASSWORD}),
            vec![],
        ),
    ] {
        let e = start(&cascade(&[tier(redis.port, written.clone())]), None, &env)
            .await
            .err()
            .unwrap_or_else(|| panic!("{written} {env:?} was let in"));
        let text = e.to_string();
        assert!(matches!(e, RespError::Unreachable { .. }), "{text}");
        assert!(
            text.starts_with(&format!(
                "L2 tier 0 (resp): cannot use Redis at 127.0.0.1:{}: ",
                redis.port
            )),
            "{text}"
        );
        assert!(
            !text.contains("not-it") && !text.contains(PASSWORD),
            "{text}"
        );
        assert!(text.contains("\"password\""), "{text}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_that_would_refuse_stores_is_refused_and_one_that_is_down_is_named() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    for policy in ["noeviction", "volatile-lru"] {
        let options = RedisOptions {
            maxmemory: "64mb",
            policy,
            ..RedisOptions::default()
        };
        let redis = Redis::start(dir.path(), free_port(), options);
        let unbounded = cascade(&[tier(redis.port, serde_json::json!({}))]);
        let e = start(&unbounded, None, &[]).await.err().unwrap();
        assert!(matches!(e, RespError::Refused { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("maxmemory-policy {policy}")),
            "{e}"
        );
        let bounded = cascade(&[tier(
            redis.port,
            serde_json::json!({"max_capacity_gb": 0.03}),
        )]);
        start(&bounded, None, &[]).await.unwrap();
        let over = cascade(&[tier(
            redis.port,
            serde_json::json!({"max_capacity_gb": 0.1}),
        )]);
        let e = start(&over, None, &[]).await.err().unwrap();
        assert!(e.to_string().contains("is above Redis's maxmemory"), "{e}");
    }
    let unlimited = Redis::start(
        dir.path(),
        free_port(),
        RedisOptions {
            maxmemory: "0",
            policy: "noeviction",
            ..RedisOptions::default()
        },
    );
    let warned_only = cascade(&[tier(unlimited.port, serde_json::json!({}))]);
    start(&warned_only, None, &[]).await.unwrap();

    let nobody = free_port();
    let e = start(&cascade(&[tier(nobody, serde_json::json!({}))]), None, &[])
        .await
        .err()
        .unwrap();
    assert!(matches!(e, RespError::Unreachable { .. }), "{e}");
    assert!(
        e.to_string().contains(&format!("127.0.0.1:{nobody}")),
        "{e}"
    );
    assert!(e.to_string().contains("Start the Redis"), "{e}");
}

#[tokio::test(flavor = "current_thread")]
async fn identities_are_recorded_and_a_restarted_redis_is_read_again() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    let mut redis = Redis::start(dir.path(), free_port(), RedisOptions::default());
    let tiers = cascade(&[tier(redis.port, serde_json::json!({}))]);
    start(&tiers, Some(identity("aaaa")), &[]).await.unwrap();
    let running = start(&tiers, Some(identity("bbbb")), &[]).await.unwrap();
    let recorded = redis.cli(&["HKEYS", &marker_key("org/model")]);
    let mut recorded: Vec<&str> = recorded.lines().collect();
    recorded.sort();
    assert_eq!(recorded, ["aaaa", "bbbb"]);

    redis.restart();
    // The kept connection died with the old Redis: the watcher's read
    // connects again at once and sees the new run_id.
    let restarted = || series(&running).get("resp_restarts_seen{0}") == Some(&1);
    assert!(
        wait_until(Duration::from_secs(10), restarted),
        "{:?}",
        series(&running)
    );
    let again = series(&running);
    assert_eq!(again["resp_up{0}"], 1, "{again:?}");
    assert_eq!(
        again["resp_keys{0}"], 0,
        "the restarted Redis is empty: {again:?}"
    );
    drop(redis);
    let down = || series(&running)["resp_up{0}"] == 0;
    assert!(wait_until(Duration::from_secs(10), down));
    let down = series(&running);
    assert_eq!(down["resp_up{0}"], 0, "{down:?}");
    assert_eq!(
        down.keys().collect::<Vec<_>>(),
        ["resp_restarts_seen{0}", "resp_up{0}"],
        "only what needs no answer: {down:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_that_refuses_info_is_used_unjudged_and_shown_answering() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    for refusal in [
        "rename-command INFO \"\"\n",
        "user default on nopass ~* &* +@all -info\n",
    ] {
        let options = RedisOptions {
            maxmemory: "64mb",
            policy: "noeviction",
            extra: refusal,
            ..RedisOptions::default()
        };
        let redis = Redis::start(dir.path(), free_port(), options);
        let tiers = cascade(&[tier(redis.port, serde_json::json!({}))]);
        let running = start(&tiers, Some(identity("aaaa")), &[])
            .await
            .unwrap_or_else(|e| panic!("{refusal}: {e}"));
        let figures = series(&running);
        assert_eq!(figures["resp_up{0}"], 1, "{refusal}: {figures:?}");
        assert!(!figures.contains_key("resp_used_memory{0}"), "{figures:?}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_server_started_by_a_launch_leaves_the_tiers_to_the_launch() {
    // No Redis at all: the launch checked it, the server does not again.
    let tiers = cascade(&[tier(free_port(), serde_json::json!({}))]);
    let running = start(&tiers, None, &[(RESP_CHECKED, "1")]).await.unwrap();
    assert!(running.series().is_none());
    assert_eq!(running.server_env(), [(RESP_CHECKED, None)]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_that_cannot_take_lmcaches_stores_is_refused() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    let primary = Redis::start(dir.path(), free_port(), RedisOptions::default());
    let replica_of = format!("replicaof 127.0.0.1 {}\n", primary.port);
    let users = "user default on nopass ~* &* +@all -set\n";
    let cases = [
        (replica_of.as_str(), "is a read-only replica"),
        (users, "refuses a write as this user"),
        ("maxclients 4\n", "takes at most 4 clients"),
    ];
    for (config, said) in cases {
        let options = RedisOptions {
            extra: config,
            ..RedisOptions::default()
        };
        let redis = Redis::start(dir.path(), free_port(), options);
        let tiers = cascade(&[tier(redis.port, serde_json::json!({}))]);
        let e = start(&tiers, None, &[])
            .await
            .err()
            .unwrap_or_else(|| panic!("{config} let in"));
        assert!(matches!(e, RespError::Refused { .. }), "{config}: {e}");
        assert!(e.to_string().contains(said), "{config}: {e}");
    }
    let few_workers = cascade(&[tier(primary.port, serde_json::json!({"num_workers": 2}))]);
    start(&few_workers, None, &[]).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_username_in_the_spec_pairs_with_the_password_in_the_environment() {
    require_redis!();
    let dir = tempfile::tempdir().unwrap();
    let options = RedisOptions {
        extra: "user kv on >kv-S3CRET ~* &* +@all\n",
        ..RedisOptions::default()
    };
    let redis = Redis::start(dir.path(), free_port(), options);
    let tiers = cascade(&[tier(redis.port, serde_json::json!({"username": "kv"}))]);
    let running = start(&tiers, None, &[("LMCACHE_RESP_PASSWORD", "kv-S3CRET")])
        .await
        .unwrap();
    assert_eq!(
        running.server_env(),
        [
            ("LMCACHE_RESP_USERNAME", Some("kv".to_string())),
            (RESP_CHECKED, Some("1".to_string()))
        ],
        "the password stays where it was"
    );
}

/// A Redis stand-in that answers `INFO` one byte every 300 ms, for ever: a
/// fault a real Redis does not produce on loopback (a peer on a slow or
/// lossy link), so a fake, said so here.
fn dripping_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = stream.read(&mut [0u8; 1024]);
                let _ = stream.write_all(b"$100000\r\n");
                while stream.write_all(b"x").is_ok() {
                    std::thread::sleep(Duration::from_millis(300));
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_that_drips_its_answer_ends_the_start_within_its_deadline() {
    let port = dripping_server();
    let tiers = cascade(&[tier(port, serde_json::json!({}))]);
    let started = Instant::now();
    let e = start(&tiers, None, &[]).await.err().unwrap();
    let took = started.elapsed();
    assert!(e.to_string().contains("did not end within 20 s"), "{e}");
    assert!(took < Duration::from_secs(25), "{took:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_launch_reads_no_handover_variable_of_its_own() {
    // A launch (one with a cache identity) checks its tiers whatever its
    // environment says: here a Redis that is not there.
    let tiers = cascade(&[tier(free_port(), serde_json::json!({}))]);
    let e = start(&tiers, Some(identity("aaaa")), &[(RESP_CHECKED, "1")]).await;
    assert!(
        matches!(e, Err(RespError::Unreachable { .. })),
        "{:?}",
        e.err()
    );
}

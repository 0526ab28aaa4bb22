//! End to end through the library, as the node agent uses it: plan from an
//! environment map, start the real server with `launch::start`, receive the
//! liveness events, stop through the handle.

use std::time::Duration;

use lmcache_launcher::launch::{self, RunOptions};
use lmcache_launcher::watch::Event;
use lmcache_launcher::{plan, DiskAccess, EngineFacts, Facts, HostFacts, Planned, Vars};
use lmcache_tier_e2e::{
    binaries, free_port, get_json, lmcache_venv, processes_mentioning, Binaries,
};

const BINS: Binaries = binaries!();

#[tokio::test(flavor = "current_thread")]
async fn the_agent_starts_watches_and_stops_a_server_through_the_handle() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let http_port = free_port();
    let vars: Vars = [
        ("PATH", "/usr/bin:/bin".to_string()),
        ("VIRTUAL_ENV", lmcache_venv().display().to_string()),
        ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache".into()),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1".into()),
        (
            "EREBINE_AGENT_LMCACHE_DISK_PATH",
            dir.join("cache").display().to_string(),
        ),
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2".into()),
        ("EREBINE_AGENT_LMCACHE_MP_PORT", free_port().to_string()),
        ("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string()),
        (
            "EREBINE_AGENT_LMCACHE_METRICS_PORT",
            free_port().to_string(),
        ),
        (
            "EREBINE_AGENT_LMCACHE_PATH",
            BINS.erebine_lmcache().display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    let facts = EngineFacts {
        model: "test-model".into(),
        tensor_parallel_size: 1,
        pipeline_parallel_size: 1,
        data_parallel_size: 1,
        kv_cache_dtype: "auto".into(),
        block_size: 16,
        max_num_batched_tokens: 512,
        hybrid_attention: false,
        ..EngineFacts::default()
    };
    let measured = Facts::measure(&facts, &vars, DiskAccess::Create).unwrap();
    let host = HostFacts::from(&measured);
    let Planned::Server(plan) = plan(&facts, &vars, &host).unwrap() else {
        panic!("the lmcache backend plans a server");
    };

    let mut handle = launch::start(*plan, RunOptions::default());
    let first = tokio::time::timeout(Duration::from_secs(180), handle.events.recv())
        .await
        .expect("an event within 180 s");
    assert!(
        matches!(first, Some(Event::Ready)),
        "first event: {first:?}"
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    let status = tokio::task::spawn_blocking(move || get_json(&url))
        .await
        .unwrap();
    assert!(status.is_some(), "the server answers /status once Ready");

    handle.stop();
    let ended = tokio::time::timeout(Duration::from_secs(60), handle.wait())
        .await
        .expect("the launch ends within 60 s of stop()");
    assert!(ended.is_ok(), "{ended:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "processes left after stop(): {left:?}");
}

//! Golden plans: the whole plan (argv, env, connector config, cascade,
//! decisions, housekeeping) of representative nodes, through the library's
//! entry point with fixed host facts, so the result is the same on every
//! machine.
//!
//! The expected plans are `tests/golden/<name>.json`. After an intended
//! change, rewrite them with `EREBINE_BLESS_GOLDEN=1 cargo test -p
//! lmcache-launcher --test golden_plans` and review the diff.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use lmcache_launcher::plan::raw_block::{DeviceKind, TierDevice};
use lmcache_launcher::{
    plan, DiskAccess, DiskFacts, EngineFacts, Facts, HostFacts, LaunchPlan, PlanError, Planned,
    Vars,
};
use lmcache_sizing::engine::{EngineGpu, GpuModel};
use lmcache_sizing::rules::{OdirectProbe, VolumeStats};
use lmcache_sizing::volume::Filesystem;
use lmcache_sizing::{Decision, GIB};

const DISK_PATH: &str = "/var/lib/inference/.cache/erebine/lmcache";

/// A local `fs` disk tier in front of a shared S3-compatible bucket, each
/// with `max_capacity_gb` and an LRU `eviction` block, with stand-in secrets.
const FS_THEN_S3_CASCADE: &str = r#"[{"type":"fs","base_path":"/var/lib/inference/.cache/erebine/lmcache","max_capacity_gb":150,"eviction":{"eviction_policy":"LRU","trigger_watermark":0.8,"eviction_ratio":0.2}},{"shared":true,"type":"s3","s3_endpoint":"swift.example.net","s3_bucket":"kv-cache","s3_region":"REGION","s3_prefer_http2":false,"aws_access_key_id":"AKIAEXAMPLE","aws_secret_access_key":"s3cr3t-example","max_capacity_gb":2000,"eviction":{"eviction_policy":"LRU","trigger_watermark":0.8,"eviction_ratio":0.2}}]"#;

fn facts(tp: u32) -> EngineFacts {
    EngineFacts {
        model: "meta-llama/Llama-3.1-70B-Instruct".into(),
        tensor_parallel_size: tp,
        pipeline_parallel_size: 1,
        data_parallel_size: 1,
        kv_cache_dtype: "auto".into(),
        block_size: 16,
        max_num_batched_tokens: Some(2048),
        hybrid_attention: false,
        ..EngineFacts::default()
    }
}

/// A 256 GiB, 32-core host with a 2 TiB ext4 cache volume, shared with
/// other data, that takes O_DIRECT.
fn host() -> HostFacts {
    host_on("ext4", false)
}

/// [`host`] with its cache volume of type `fs_type`, a volume of its own
/// (the cache directory is the mount point of the whole filesystem) when
/// `own_volume`.
fn host_on(fs_type: &str, own_volume: bool) -> HostFacts {
    HostFacts {
        memory: Decision::new(256 * GIB, "given", "golden host: 256 GiB"),
        physical_cores: 32,
        executable: None,
        disk: Some(DiskFacts {
            measured_at: DISK_PATH.into(),
            volume: VolumeStats {
                total_bytes: 2048 * GIB,
                free_bytes: 1800 * GIB,
                block_size: 4096,
            },
            filesystem: Filesystem {
                fs_type: fs_type.into(),
                read_only: false,
                source: None,
                own_volume,
            },
            reclaimable_bytes: 0,
            odirect: OdirectProbe::Succeeded,
            read_probe: None,
            tier: Default::default(),
        }),
        gpu: None,
        engine_gpu: None,
        odirect_tiers: Vec::new(),
        raw_block_devices: Vec::new(),
        lmcache_version: None,
        weights: None,
        node: None,
    }
}

/// A plan from the facts of this machine, measured with `access`, as a
/// launch (`Create`) or a dry run (`Inspect`) makes it.
fn plan_measured(
    engine: &EngineFacts,
    vars: &Vars,
    access: DiskAccess,
) -> Result<Planned, PlanError> {
    let facts = Facts::measure(engine, vars, access)?;
    plan(engine, vars, &HostFacts::from(&facts))
}

struct Node {
    _dir: tempfile::TempDir,
    dir: String,
    vars: Vars,
}

/// A node with the lmcache backend, the default disk path of a node whose
/// `HOME` is `/var/lib/inference`, and a stand-in `erebine-lmcache` in a temp
/// dir (shown as `$TMP` in the golden files).
fn node(pairs: &[(&str, &str)]) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("erebine-lmcache");
    fs::write(&exe, "#!/bin/sh\nexit 99\n").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    let mut vars: Vars = [
        ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache"),
        ("EREBINE_AGENT_LMCACHE_DISK_PATH", DISK_PATH),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "32"),
    ]
    .into_iter()
    .map(|(k, v)| (k.into(), v.into()))
    .collect();
    vars.insert("EREBINE_AGENT_LMCACHE_PATH".into(), exe.into_os_string());
    for (k, v) in pairs {
        vars.insert(k.into(), v.into());
    }
    Node {
        dir: dir.path().display().to_string(),
        _dir: dir,
        vars,
    }
}

fn plan_of(node: &Node, facts: &EngineFacts) -> LaunchPlan {
    plan_on(node, facts, &host())
}

fn plan_on(node: &Node, facts: &EngineFacts, host: &HostFacts) -> LaunchPlan {
    match plan(facts, &node.vars, host).unwrap() {
        Planned::Server(plan) => *plan,
        Planned::NothingToLaunch(n) => panic!("nothing to launch: {}", n.reason),
    }
}

#[track_caller]
fn assert_golden(name: &str, node: &Node, plan: &LaunchPlan) {
    let text = format!("{:#}\n", Planned::Server(Box::new(plan.clone())).to_json())
        .replace(&node.dir, "$TMP");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.json"));
    if std::env::var_os("EREBINE_BLESS_GOLDEN").is_some() {
        fs::write(&path, &text).unwrap();
        return;
    }
    let expected = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; bless it with EREBINE_BLESS_GOLDEN=1",
            path.display()
        )
    });
    assert!(
        text == expected,
        "{name}: the plan differs from {}; got:\n{text}",
        path.display()
    );
}

fn count(args: &[String], flag: &str) -> usize {
    args.iter().filter(|a| *a == flag).count()
}

fn value_of<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

#[test]
fn tp4_with_an_fs_then_s3_cascade() {
    let node = node(&[
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "150"),
        ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", FS_THEN_S3_CASCADE),
    ]);
    let plan = plan_of(&node, &facts(4));
    assert_eq!(value_of(&plan.args, "--max-gpu-workers"), ["4"]);
    assert_eq!(count(&plan.args, "--l2-adapter"), 2);
    assert!(
        plan.args.iter().any(|a| a.contains("s3cr3t-example")),
        "the server gets the secret"
    );
    let shown = plan.to_json().to_string() + &plan.log_line();
    assert!(
        !shown.contains("s3cr3t-example"),
        "a printed plan shows the secret"
    );
    assert!(
        plan.housekeeping.is_none(),
        "a custom cascade is not housekept"
    );
    // Once the gateways are known, the server's argv is rendered from the
    // rewritten cascade: each tier in its own place, everything else as planned.
    let mut rewritten = plan.cascade.clone();
    rewritten.0[1] = rewritten.0[1].rewritten(
        &["aws_secret_access_key"],
        [("s3_endpoint", "127.0.0.1:9".into())],
    );
    let args = plan.server_args(&rewritten);
    assert_eq!(args.len(), plan.args.len());
    let tiers = value_of(&args, "--l2-adapter");
    assert_eq!(tiers, [rewritten.0[0].to_arg(), rewritten.0[1].to_arg()]);
    assert!(!args.iter().any(|a| a.contains("s3cr3t-example")));
    let others = |a: &[String]| {
        a.iter()
            .filter(|a| !a.starts_with('{'))
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(others(&args), others(&plan.args));
    assert_golden("tp4_fs_then_s3", &node, &plan);
}

#[test]
fn l1_only() {
    let node = node(&[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0")]);
    let plan = plan_of(&node, &facts(1));
    assert_eq!(count(&plan.args, "--l2-adapter"), 0);
    assert_eq!(value_of(&plan.args, "--l1-size-gb"), ["32"]);
    assert!(plan.housekeeping.is_none());
    assert_golden("l1_only", &node, &plan);
}

#[test]
fn an_h200_without_the_engines_batched_tokens_plans_vllms_default_for_it() {
    let node = node(&[]);
    let engine = EngineFacts {
        max_num_batched_tokens: None,
        ..facts(1)
    };
    let h200 = |vllm: Option<&str>| HostFacts {
        engine_gpu: Some(EngineGpu {
            model: GpuModel::Read {
                name: "NVIDIA H200".into(),
                memory_bytes: 143_771 << 20,
            },
            vllm_version: vllm.map(Into::into),
        }),
        ..host()
    };
    let plan = plan_on(&node, &engine, &h200(Some("0.26.0")));
    assert_golden("h200_vllm_default_batched_tokens", &node, &plan);
    assert_eq!(value_of(&plan.args, "--chunk-size"), ["4096"]);
    assert!(
        plan.decisions.warnings.is_empty(),
        "{:?}",
        plan.decisions.warnings
    );
    // A GPU the launch could not read: vLLM's smallest default, warned.
    let unread = HostFacts {
        engine_gpu: Some(EngineGpu {
            model: GpuModel::Unread {
                why: "nvidia-smi is not on PATH".into(),
            },
            vllm_version: None,
        }),
        ..host()
    };
    let plan = plan_on(&node, &engine, &unread);
    assert_eq!(value_of(&plan.args, "--chunk-size"), ["1024"]);
    assert!(
        plan.decisions
            .warnings
            .iter()
            .any(|w| w.contains("nvidia-smi is not on PATH")
                && w.contains("--max-num-batched-tokens")),
        "{:?}",
        plan.decisions.warnings
    );
    // The engine's value wins.
    let given = EngineFacts {
        max_num_batched_tokens: Some(2048),
        ..facts(1)
    };
    let plan = plan_on(&node, &given, &h200(None));
    assert_eq!(value_of(&plan.args, "--chunk-size"), ["1024"]);
}

#[test]
fn the_launch_line_says_how_many_tokens_a_second_the_disk_tier_loads() {
    let stated = node(&[
        ("EREBINE_AGENT_LMCACHE_KV_BYTES_PER_TOKEN", "57344"),
        ("EREBINE_AGENT_LMCACHE_DISK_READ_GBPS", "2"),
    ]);
    let plan = plan_of(&stated, &facts(1));
    let line = plan.log_line();
    assert!(
        line.contains(
            "disk_load=34877 tokens/s (2.00 GB/s read (stated) over 57344 bytes of KV a token)"
        ),
        "{line}"
    );
    // No KV size, or a probe not run (a dry run): no figure, and no guess.
    for pairs in [
        [
            ("EREBINE_AGENT_LMCACHE_DISK_READ_GBPS", "2"),
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "32"),
        ],
        [
            ("EREBINE_AGENT_LMCACHE_DISK_READ_GBPS", "probe"),
            ("EREBINE_AGENT_LMCACHE_KV_BYTES_PER_TOKEN", "57344"),
        ],
    ] {
        let plan = plan_of(&node(&pairs), &facts(1));
        assert!(
            !plan.log_line().contains("disk_load"),
            "{}",
            plan.log_line()
        );
    }
}

#[test]
fn disk_only_runs_l1_as_a_write_buffer() {
    let node = node(&[
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "0"),
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "400"),
    ]);
    let plan = plan_of(&node, &facts(2));
    assert_eq!(value_of(&plan.args, "--eviction-policy"), ["noop"]);
    assert_eq!(value_of(&plan.args, "--l2-store-policy"), ["skip_l1"]);
    let tier: serde_json::Value =
        serde_json::from_str(value_of(&plan.args, "--l2-adapter")[0]).unwrap();
    assert_eq!(tier["type"], "fs_native");
    assert_eq!(tier["max_capacity_gb"], 400.0);
    assert_eq!(tier["num_workers"], 16);
    assert_eq!(tier["use_odirect"], true);
    assert_eq!(
        plan.housekeeping.as_ref().unwrap().capacity_bytes,
        400 * GIB
    );
    assert_golden("disk_only", &node, &plan);
}

/// Where the docs put the cache directory in the image: a disk of its own
/// mounted there takes 75% of the disk (1,536 GiB of 2 TiB, where the
/// shared volume gives 8 x the 32 GiB L1); the container's writable layer
/// (overlay) is sized from the volume under it, with a warning that the
/// objects go with the container.
#[test]
fn a_disk_of_its_own_and_a_containers_writable_layer() {
    let node = node(&[]);
    let shared = plan_of(&node, &facts(1));
    let own = plan_on(&node, &facts(1), &host_on("xfs", true));
    let overlay = plan_on(&node, &facts(1), &host_on("overlay", false));
    let capacity = |plan: &LaunchPlan| plan.decisions.disk.as_ref().unwrap().capacity.clone();
    assert_eq!(capacity(&shared).value, 256 * GIB);
    assert_eq!(
        (capacity(&own).value, capacity(&own).rule),
        (1536 * GIB, "derived-75pct-own-volume")
    );
    assert_eq!(capacity(&overlay).value, 256 * GIB);
    let lost = "its objects are lost with the container";
    assert!(
        overlay.decisions.warnings.iter().any(|w| w.contains(lost)),
        "{:?}",
        overlay.decisions.warnings
    );
    assert!(!own.decisions.warnings.iter().any(|w| w.contains(lost)));
    assert!(!shared.decisions.warnings.iter().any(|w| w.contains(lost)));
    assert_golden("own_volume", &node, &own);
    assert_golden("overlay", &node, &overlay);
}

#[test]
fn extra_args_override_chunk_size_and_replace_the_tiers() {
    let node = node(&[
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
            r#"--chunk-size 512 --l2-adapter {"type":"fs","base_path":"/mnt/fast","max_capacity_gb":50} --enable-gc-monitor --port=7555"#,
        ),
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_CONFIG",
            r#"{"lmcache.mp.timeout":30,"lmcache.mp.host":"tcp://localhost"}"#,
        ),
        ("EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR", "yes"),
        ("EREBINE_AGENT_LMCACHE_LOG_LEVEL", "warning"),
    ]);
    let plan = plan_of(&node, &facts(1));
    // A repeated flag wins: the node's own occurrence is gone, and the extra
    // --l2-adapter replaces the built-in tier instead of adding to it.
    assert_eq!(value_of(&plan.args, "--chunk-size"), ["512"]);
    assert_eq!(value_of(&plan.args, "--port"), ["7555"]);
    assert_eq!(
        value_of(&plan.args, "--l2-adapter"),
        [r#"{"type":"fs","base_path":"/mnt/fast","max_capacity_gb":50}"#]
    );
    assert_eq!(
        plan.args[plan.args.len() - 3..],
        ["--enable-gc-monitor", "--port", "7555"],
        "the extra arguments come last, in order"
    );
    assert_eq!(plan.cascade.tiers().len(), 1);
    assert_eq!(
        plan.server_args(&plan.cascade),
        plan.args,
        "the extra arguments' tier is rendered in its own place"
    );
    assert_eq!(plan.decisions.chunk_size.value, 512);
    assert_eq!(plan.mp_port, 7555);
    assert_eq!(
        plan.connector_config["kv_connector_extra_config"]["lmcache.mp.port"],
        7555
    );
    assert_eq!(
        plan.connector_config["kv_connector_extra_config"]["lmcache.mp.host"], "tcp://localhost",
        "EXTRA_CONFIG keys win"
    );
    assert!(plan.decisions.disk.is_none() && plan.housekeeping.is_none());
    assert_eq!(
        value_of(&plan.args, "--lookup-hash-log-dir"),
        [format!("{DISK_PATH}/lookup_hashes").as_str()]
    );
    assert_golden("extra_args_override", &node, &plan);
}

#[test]
fn extra_chunk_size_keeps_the_housekeeping_identity_true() {
    let node = node(&[
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "100"),
        ("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--chunk-size=256"),
    ]);
    let plan = plan_of(&node, &facts(1));
    assert_eq!(value_of(&plan.args, "--chunk-size"), ["256"]);
    assert_eq!(plan.housekeeping.unwrap().identity.chunk_size, 256);
    assert_eq!(plan.decisions.replaced_by_extra_args[0].node, "1024");
}

#[test]
fn hybrid_attention_raises_the_chunk_size_to_a_block_multiple() {
    let node = node(&[
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0"),
        ("EREBINE_AGENT_LMCACHE_CHUNK_SIZE", "256"),
    ]);
    let mut hybrid = facts(1);
    hybrid.hybrid_attention = true;
    hybrid.block_size = 528;
    let plan = plan_of(&node, &hybrid);
    assert_eq!(value_of(&plan.args, "--chunk-size"), ["528"]);
    assert_eq!(
        plan.decisions.chunk_size.rule,
        "explicit-raised-hybrid-block"
    );

    let node = node_with_extra_chunk("1000");
    let err = lmcache_launcher::plan(&hybrid, &node.vars, &host())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("EREBINE_AGENT_LMCACHE_EXTRA_ARGS (--chunk-size)"),
        "{err}"
    );
    assert!(
        err.contains("multiple of the hybrid-attention model's 528"),
        "{err}"
    );
}

fn node_with_extra_chunk(tokens: &str) -> Node {
    node(&[
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0"),
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
            &format!("--chunk-size {tokens}"),
        ),
    ])
}

#[test]
fn backends_other_than_lmcache_have_nothing_to_launch() {
    for backend in ["native", "none"] {
        let node = node(&[("EREBINE_AGENT_KV_CACHE_BACKEND", backend)]);
        let planned = plan(&facts(1), &node.vars, &host()).unwrap();
        let json = planned.to_json();
        assert!(planned.server().is_none(), "{backend}");
        assert_eq!(json["backend"], backend);
        assert!(json["nothing_to_launch"]
            .as_str()
            .unwrap()
            .contains("no LMCache server"));
    }
}

#[test]
fn the_lookup_hash_log_dir_is_created_0700_at_launch_and_not_in_a_dry_run() {
    let node_dir = tempfile::tempdir().unwrap();
    let cache = node_dir.path().join("cache");
    // Measured on this machine: an L1 it can hold.
    let mut node = node(&[
        ("EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR", "1"),
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "100"),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1"),
    ]);
    node.vars.insert(
        "EREBINE_AGENT_LMCACHE_DISK_PATH".into(),
        cache.clone().into_os_string(),
    );
    let dir = cache.join("lookup_hashes");
    plan_measured(&facts(1), &node.vars, DiskAccess::Inspect).unwrap();
    assert!(!cache.exists(), "a dry run created {}", cache.display());
    plan_measured(&facts(1), &node.vars, DiskAccess::Create).unwrap();
    let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "{}", dir.display());

    fs::remove_dir(&dir).unwrap();
    fs::write(&dir, "").unwrap();
    let err = plan_measured(&facts(1), &node.vars, DiskAccess::Create)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR")
            && err.contains("not a directory"),
        "{err}"
    );
}

/// S3 key prefixes that are not stable key prefixes: empty or dot segments,
/// a leading `/`, characters outside S3's safe set.
const BAD_KEY_PREFIXES: &[&str] = &["./", "a/./b/", "../", "a/..", "a//b/", "/lead/", "a b/"];

#[test]
fn the_plan_refuses_an_s3_key_prefix_with_path_syntax_naming_the_tier_and_the_key() {
    for prefix in BAD_KEY_PREFIXES {
        let cascade = serde_json::json!([
            {"type": "fs", "base_path": "/tmp/x"},
            {"type": "s3", "s3_endpoint": "127.0.0.1:9", "s3_bucket": "kv-cache",
             "s3_key_prefix": prefix, "s3_region": "us-east-1", "disable_tls": true,
             "aws_access_key_id": "AK", "aws_secret_access_key": "SK"}
        ]);
        let node = node(&[("EREBINE_AGENT_LMCACHE_L2_ADAPTER", &cascade.to_string())]);
        let err = lmcache_launcher::plan(&facts(1), &node.vars, &host())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("EREBINE_AGENT_LMCACHE_L2_ADAPTER")
                && err.contains(&format!("L2 tier 1 (s3): s3_key_prefix: {prefix:?}")),
            "{prefix}: {err}"
        );
    }
}

/// The reap grace of workers after a restart is the server's reap timeout
/// as its arguments set it (the last one wins, as argparse reads them),
/// else LMCache's default 120 s, also when reaping is off (0).
#[test]
fn the_rejoin_grace_is_the_servers_reap_timeout_else_lmcaches_default() {
    use std::time::Duration;
    let plan = plan_of(&node(&[]), &facts(1));
    assert_eq!(plan.worker_reap_timeout(), None);
    assert_eq!(plan.rejoin_grace(), Duration::from_secs(120));
    let extra = node(&[(
        "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
        "--worker-reap-timeout-seconds 45 --worker-registration-grace-seconds 60",
    )]);
    let mut plan = plan_of(&extra, &facts(1));
    assert_eq!(plan.worker_reap_timeout(), Some(Duration::from_secs(45)));
    assert_eq!(plan.rejoin_grace(), Duration::from_secs(45));
    // Arguments added after planning (the `--server-arg` test hook), in
    // argparse's abbreviated `=` form.
    plan.args.push("--worker-reap-timeout=30.5".into());
    assert_eq!(plan.rejoin_grace(), Duration::from_secs_f64(30.5));
    plan.args.push("--worker-reap-timeout-seconds".into());
    plan.args.push("0".into());
    assert_eq!(plan.worker_reap_timeout(), Some(Duration::ZERO));
    assert_eq!(plan.rejoin_grace(), Duration::from_secs(120));
}

#[test]
fn facts_no_host_has_are_refused_naming_the_field() {
    let node = node(&[]);
    let no_memory = HostFacts {
        memory: Decision::new(0, "given", "a caller's zero"),
        ..host()
    };
    let no_cores = HostFacts {
        physical_cores: 0,
        ..host()
    };
    for (host, field) in [
        (no_memory, "HostFacts.memory"),
        (no_cores, "HostFacts.physical_cores"),
    ] {
        let err = plan(&facts(1), &node.vars, &host).unwrap_err();
        assert!(matches!(err, PlanError::HostFact { .. }), "{err}");
        assert!(err.to_string().starts_with(field), "{err}");
    }
}

#[test]
fn a_read_only_volume_gets_no_disk_tier_it_cannot_write() {
    let read_only = || {
        let mut host = host();
        host.disk.as_mut().unwrap().filesystem.read_only = true;
        host
    };
    let err = plan(&facts(1), &node(&[]).vars, &read_only()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("EREBINE_AGENT_LMCACHE_DISK_PATH=") && text.contains("read-only"),
        "{text}"
    );
    let l1_only = node(&[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0")]);
    assert!(plan(&facts(1), &l1_only.vars, &read_only()).is_ok());
}

#[test]
fn an_l1_set_by_hand_is_judged_against_the_memory_it_would_take() {
    // The golden host has 256 GiB.
    let refused = node(&[("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "300")]);
    let err = plan(&facts(1), &refused.vars, &host()).unwrap_err();
    assert!(matches!(err, PlanError::L1AboveMemory(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.starts_with(
            "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=300 gives L1 300.00 GiB, more than the 256.00 GiB"
        ) && text.contains("golden host: 256 GiB"),
        "{text}"
    );
    let extra = node(&[("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--l1-size-gb 512")]);
    let err = plan(&facts(1), &extra.vars, &host())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("EREBINE_AGENT_LMCACHE_EXTRA_ARGS --l1-size-gb 512 gives L1"),
        "{err}"
    );
    let above_share = node(&[
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "100"),
        ("EREBINE_AGENT_HOST_AGENT_COUNT", "4"),
    ]);
    let warned = plan_of(&above_share, &facts(1));
    assert!(
        warned.decisions.warnings.iter().any(|w| w.starts_with("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=100 gives L1 100.00 GiB, above this node's 64.00 GiB share")),
        "{:?}",
        warned.decisions.warnings
    );
    let within = node(&[
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "48"),
        ("EREBINE_AGENT_HOST_AGENT_COUNT", "4"),
    ]);
    assert!(!plan_of(&within, &facts(1))
        .decisions
        .warnings
        .iter()
        .any(|w| w.contains("share of memory")));
}

/// An L1 set by hand within the node's share of memory but above what fits
/// beside the engine there (the share less max(25%, 8 GiB)) is said, from
/// the variable and from EXTRA_ARGS alike, on a host and in a container;
/// one within it is not.
#[test]
fn an_explicit_l1_above_what_fits_beside_the_engine_is_warned_about() {
    let memory = |gib: f64, rule: &'static str| HostFacts {
        memory: Decision::new((gib * GIB as f64) as u64, rule, format!("{rule} {gib} GiB")),
        ..host()
    };
    let cases = [
        (
            memory(23.5, "host-ram"),
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "20"),
            true,
        ),
        (
            memory(23.5, "host-ram"),
            ("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--l1-size-gb 20"),
            true,
        ),
        (
            memory(8.0, "cgroup-limit"),
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "7.5"),
            true,
        ),
        (
            memory(23.5, "host-ram"),
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "15"),
            false,
        ),
        (
            memory(256.0, "host-ram"),
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "192"),
            false,
        ),
    ];
    for (host, var, warned) in cases {
        let p = plan_on(&node(&[var]), &facts(1), &host);
        let said = p
            .decisions
            .warnings
            .iter()
            .find(|w| w.contains("more than fits beside the engine"));
        assert_eq!(
            said.is_some(),
            warned,
            "{var:?}: {:?}",
            p.decisions.warnings
        );
        if let Some(w) = said {
            assert!(
                w.contains("likely to be OOM-killed") && w.contains("set it to at most"),
                "{w}"
            );
        }
    }
}

#[test]
fn an_l1_raised_to_its_floor_above_a_quarter_of_the_share_is_warned_about() {
    let small = HostFacts {
        memory: Decision::new(
            8 * GIB,
            "cgroup-limit",
            "cgroup memory limit 8.00 GiB in /sys/fs/cgroup/memory.max",
        ),
        ..host()
    };
    let node = node(&[("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "")]);
    let Planned::Server(plan) = plan(&facts(1), &node.vars, &small).unwrap() else {
        panic!("a server is planned");
    };
    assert_eq!(plan.decisions.l1_size.value, 4 * GIB);
    assert!(
        plan.decisions.warnings.iter().any(|w| w.starts_with(
            "L1 is raised to its 4.00 GiB floor, above a quarter of this node's 8.00 GiB share"
        ) && w.contains("/sys/fs/cgroup/memory.max")),
        "{:?}",
        plan.decisions.warnings
    );
}

#[test]
fn a_custom_filesystem_tier_without_a_capacity_is_warned_about() {
    let unbounded = |warnings: &[String]| -> Vec<String> {
        warnings
            .iter()
            .filter(|w| w.contains("has no max_capacity_gb"))
            .cloned()
            .collect()
    };
    let cascade = r#"[{"type":"fs","base_path":"/data/a"},{"type":"fs_native","base_path":"/data/b","max_capacity_gb":0},{"type":"fs","base_path":"/data/c","max_capacity_gb":100},{"type":"s3","s3_endpoint":"swift.example.net","s3_bucket":"kv-cache","s3_region":"REGION","aws_access_key_id":"AKIAEXAMPLE","aws_secret_access_key":"s3cr3t-example"}]"#;
    let custom = node(&[("EREBINE_AGENT_LMCACHE_L2_ADAPTER", cascade)]);
    let warned = unbounded(&plan_of(&custom, &facts(1)).decisions.warnings);
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(
        warned[0].starts_with("L2 tier 0 (fs at /data/a) has no max_capacity_gb"),
        "{}",
        warned[0]
    );
    assert!(
        warned[1].starts_with("L2 tier 1 (fs_native at /data/b)"),
        "{}",
        warned[1]
    );
    assert!(warned[0].contains(r#"add "max_capacity_gb": <GiB>"#));
    let extra = node(&[(
        "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
        r#"--l2-adapter {"type":"fs_native","base_path":"/data/d"}"#,
    )]);
    let warned = unbounded(&plan_of(&extra, &facts(1)).decisions.warnings);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(
        warned[0].contains("EREBINE_AGENT_LMCACHE_EXTRA_ARGS"),
        "{}",
        warned[0]
    );
    assert!(unbounded(&plan_of(&node(&[]), &facts(1)).decisions.warnings).is_empty());
}

/// A ramfs mounted for a test (root), unmounted when dropped.
struct Ramfs(PathBuf);

impl Drop for Ramfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_custom_tier_that_asks_for_odirect_where_it_fails_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let ram = Ramfs(dir.path().join("ram"));
    fs::create_dir(&ram.0).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "ramfs", "ramfs"])
        .arg(&ram.0)
        .status()
        .unwrap();
    assert!(mounted.success(), "mounting a ramfs needs root");
    let on_disk = dir.path().join("disk-tier");
    let spec = |path: &std::path::Path, odirect: bool| {
        format!(
            r#"{{"type":"fs_native","base_path":"{}","max_capacity_gb":1,"use_odirect":{odirect}}}"#,
            path.display()
        )
    };
    let cascade = format!(
        r#"[{},{},{},{{"type":"fs","base_path":"{}"}}]"#,
        spec(&ram.0.join("tier"), true),
        spec(&on_disk, true),
        spec(&ram.0.join("buffered"), false),
        ram.0.join("unbounded").display()
    );
    let node = node(&[
        ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", &cascade),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1"),
    ]);
    let Planned::Server(plan) = plan_measured(&facts(1), &node.vars, DiskAccess::Inspect).unwrap()
    else {
        panic!("a server is planned");
    };
    let odirect: Vec<&String> = plan
        .decisions
        .warnings
        .iter()
        .filter(|w| w.contains(r#"sets "use_odirect": true"#))
        .collect();
    assert_eq!(odirect.len(), 1, "{:#?}", plan.decisions.warnings);
    assert!(
        odirect[0].starts_with(&format!(
            "L2 tier 0 (fs_native at {}/tier)",
            ram.0.display()
        )) && odirect[0].contains("O_DIRECT test write there failed"),
        "{}",
        odirect[0]
    );
    assert!(
        !ram.0.join("tier").exists(),
        "the probe created the tier directory"
    );
    // The tier on the ramfs with no max_capacity_gb only grows, in memory.
    let unbounded: Vec<&String> = plan
        .decisions
        .warnings
        .iter()
        .filter(|w| w.contains("has no max_capacity_gb"))
        .collect();
    assert_eq!(unbounded.len(), 1, "{:#?}", plan.decisions.warnings);
    assert!(
        unbounded[0].starts_with(&format!("L2 tier 3 (fs at {}/unbounded)", ram.0.display())),
        "{}",
        unbounded[0]
    );
}

#[test]
fn several_nodes_on_one_host_share_its_volume_as_they_share_its_memory() {
    // A 100 GiB volume with 56 GiB free: 46 GiB of room after the 10 GiB
    // reserve. One node alone plans 32 GiB (8 x its 4 GiB L1); four nodes
    // planning that each would ask 128 GiB of it.
    let mut small = host();
    let disk = small.disk.as_mut().unwrap();
    disk.volume.total_bytes = 100 * GIB;
    disk.volume.free_bytes = 56 * GIB;
    let capacity = |pairs: &[(&str, &str)]| {
        let mut vars = vec![("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "4")];
        vars.extend_from_slice(pairs);
        let Planned::Server(plan) = plan(&facts(1), &node(&vars).vars, &small).unwrap() else {
            panic!("a server is planned");
        };
        plan.decisions.disk.unwrap().capacity
    };
    assert_eq!(capacity(&[]).value, 32 * GIB);
    let shared = capacity(&[("EREBINE_AGENT_HOST_AGENT_COUNT", "4")]);
    assert!(
        4 * shared.value <= 46 * GIB && shared.value >= 11 * GIB,
        "{shared:?}"
    );
    assert!(
        shared
            .reason
            .contains("this node's 1/4 share of the volume")
            && shared.reason.contains("EREBINE_AGENT_HOST_AGENT_COUNT=4"),
        "{}",
        shared.reason
    );
    // An explicit size is the operator's, whatever the count.
    let explicit = capacity(&[
        ("EREBINE_AGENT_HOST_AGENT_COUNT", "4"),
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "20"),
    ]);
    assert_eq!(explicit.value, 20 * GIB);
}

#[test]
fn explicit_disk_sizes_are_judged_against_this_nodes_share_of_the_volume() {
    // 56 GiB free: each of 4 nodes has a 14 GiB share of it.
    let mut small = host();
    let disk = small.disk.as_mut().unwrap();
    disk.volume.total_bytes = 100 * GIB;
    disk.volume.free_bytes = 56 * GIB;
    let warnings = |nodes: &str, size: &str| {
        let vars = [
            ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "4"),
            ("EREBINE_AGENT_HOST_AGENT_COUNT", nodes),
            ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", size),
        ];
        let Planned::Server(plan) = plan(&facts(1), &node(&vars).vars, &small).unwrap() else {
            panic!("a server is planned");
        };
        plan.decisions.warnings
    };
    for (nodes, size) in [("4", "20"), ("4", "15"), ("2", "30"), ("8", "7.5")] {
        let shared: Vec<String> = warnings(nodes, size)
            .into_iter()
            .filter(|w| w.contains("share of the room"))
            .collect();
        assert_eq!(shared.len(), 1, "{nodes} x {size}: {shared:#?}");
        assert!(
            shared[0].starts_with(&format!("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB={size} gives"))
                && shared[0].contains(&format!("EREBINE_AGENT_HOST_AGENT_COUNT={nodes}"))
                && shared[0].contains("56.00 GiB free"),
            "{}",
            shared[0]
        );
    }
    for (nodes, size) in [("4", "14"), ("1", "50"), ("4", "10")] {
        let all = warnings(nodes, size);
        assert!(
            all.iter().all(|w| !w.contains("share of the room")),
            "{nodes} x {size}: {all:#?}"
        );
    }
    // Above the whole volume's free space, the volume's own warning says it.
    let all = warnings("4", "60");
    assert!(
        all.iter()
            .any(|w| w.contains("more than the 56.00 GiB free")),
        "{all:#?}"
    );
    assert!(
        all.iter().all(|w| !w.contains("share of the room")),
        "{all:#?}"
    );
}

/// [`host`] with LMCache `version` installed.
fn host_with_lmcache(version: &str) -> HostFacts {
    HostFacts {
        lmcache_version: Some(version.into()),
        ..host()
    }
}

#[test]
fn each_lmcache_version_gets_the_command_line_it_accepts() {
    let cascade = r#"[{"type":"fs_native","base_path":"/data/a","max_capacity_gb":100,"affinity_tag":"gpu0"}]"#;
    let tiered = node(&[
        ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", cascade),
        (
            "EREBINE_AGENT_LMCACHE_API_KEY_FILE",
            "/run/erebine/lmcache.key",
        ),
        ("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--l2-prefetch-max 4"),
    ]);
    let next = plan_on(&tiered, &facts(1), &host_with_lmcache("0.5.7rc2"));
    assert_golden("lmcache_0_5_7rc2", &tiered, &next);
    assert_eq!(
        value_of(&next.args, "--api-key-file"),
        ["/run/erebine/lmcache.key"]
    );
    let adapter = value_of(&next.args, "--l2-adapter");
    assert!(!adapter[0].contains("affinity_tag"), "{adapter:?}");
    let said = next.decisions.warnings.join("\n");
    assert!(
        said.contains("\"affinity_tag\" dropped: LMCache 0.5.7rc2 (a pre-release) refuses it"),
        "{said}"
    );
    assert!(
        said.contains("ignores --l2-prefetch-max-in-flight"),
        "{said}"
    );
    for (old, host) in [
        ("0.5.6", host_with_lmcache("0.5.6")),
        ("of unknown version", host()),
    ] {
        let plan = plan_on(&tiered, &facts(1), &host);
        assert_eq!(count(&plan.args, "--api-key-file"), 0, "{old}");
        assert!(value_of(&plan.args, "--l2-adapter")[0].contains("\"affinity_tag\":\"gpu0\""));
        let said = plan.decisions.warnings.join("\n");
        assert!(
            said.contains(&format!(
                "EREBINE_AGENT_LMCACHE_API_KEY_FILE is set, but LMCache {old} has no API key"
            )),
            "{said}"
        );
        assert!(
            !said.contains("affinity_tag") && !said.contains("max-in-flight"),
            "{said}"
        );
    }
}

#[test]
fn extra_args_are_read_with_the_flags_of_the_installed_version() {
    let next_only = node(&[(
        "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
        "--l2-prefetch-inflight-watermark 0.25 --enable-token-trace",
    )]);
    let next = plan_on(&next_only, &facts(1), &host_with_lmcache("0.5.7rc2"));
    assert_eq!(
        value_of(&next.args, "--l2-prefetch-inflight-watermark"),
        ["0.25"]
    );
    for host in [host_with_lmcache("0.5.6"), host()] {
        let e = plan(&facts(1), &next_only.vars, &host)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--l2-prefetch-inflight-watermark")
                && e.contains("(LMCache 0.5.6)")
                && e.contains("EREBINE_AGENT_LMCACHE_EXTRA_ARGS"),
            "{e}"
        );
    }
    // A flag 0.5.7 removed is refused there (its argparse reads it as an
    // ambiguous abbreviation), and kept where it exists.
    let old_only = node(&[(
        "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
        "--enable transfer_query",
    )]);
    let e = plan(&facts(1), &old_only.vars, &host_with_lmcache("0.5.7"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"--enable\" abbreviates several flags") && e.contains("--enable-token-trace"),
        "{e}"
    );
    let kept = plan_on(&old_only, &facts(1), &host_with_lmcache("0.5.6"));
    assert_eq!(value_of(&kept.args, "--enable"), ["transfer_query"]);
}

#[test]
fn a_raw_block_tier_is_passed_as_written_with_its_device_measured() {
    let cascade = r#"[{"type":"raw_block","device_path":"/dev/nvme1n1","slot_bytes":4194304,"capacity_bytes":0},{"type":"raw_block","device_path":"/dev/nvme9n9","slot_bytes":4194304}]"#;
    let node = node(&[("EREBINE_AGENT_LMCACHE_L2_ADAPTER", cascade)]);
    let devices = vec![
        TierDevice {
            position: 0,
            device_path: "/dev/nvme1n1".into(),
            kind: DeviceKind::Block,
            size_bytes: Some(3840 * GIB),
            in_use: Vec::new(),
            sink: false,
        },
        TierDevice {
            position: 1,
            device_path: "/dev/nvme9n9".into(),
            kind: DeviceKind::Missing,
            size_bytes: None,
            in_use: Vec::new(),
            sink: false,
        },
    ];
    let host = HostFacts {
        raw_block_devices: devices,
        ..host()
    };
    let plan = plan_on(&node, &facts(1), &host);
    assert_eq!(
        value_of(&plan.args, "--l2-adapter")[0],
        r#"{"type":"raw_block","device_path":"/dev/nvme1n1","slot_bytes":4194304,"capacity_bytes":0}"#
    );
    let warned: Vec<&String> = plan
        .decisions
        .warnings
        .iter()
        .filter(|w| w.contains("raw_block"))
        .collect();
    assert_eq!(warned.len(), 1, "{warned:#?}");
    assert!(
        warned[0].starts_with(
            "L2 tier 1 (raw_block) names device_path /dev/nvme9n9, and nothing is there"
        ),
        "{}",
        warned[0]
    );
    assert_golden("raw_block", &node, &plan);
    let mut busy = host.clone();
    busy.raw_block_devices[0].in_use = vec!["its partition nvme1n1p1 is mounted at /data".into()];
    let err = lmcache_launcher::plan(&facts(1), &node.vars, &busy)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("EREBINE_AGENT_LMCACHE_L2_ADAPTER")
            && err.contains("L2 tier 0 (raw_block): device_path /dev/nvme1n1 is in use: its partition nvme1n1p1 is mounted at /data")
            && err.contains("overwrites a raw_block device whole"),
        "{err}"
    );
    let mut sink = host;
    sink.raw_block_devices[1].kind = DeviceKind::Char;
    sink.raw_block_devices[1].sink = true;
    let plan = plan_on(&node, &facts(1), &sink);
    assert!(
        plan.decisions
            .warnings
            .iter()
            .any(|w| w.starts_with("L2 tier 1 (raw_block)") && w.contains("/dev/null or /dev/zero")),
        "{:?}",
        plan.decisions.warnings
    );
}

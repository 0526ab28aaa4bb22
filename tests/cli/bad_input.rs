//! Bad input to `lmcache-tier`: each case is a clear error naming the
//! variable, flag or path and the fix, a meaningful exit status, nothing
//! started and nothing deleted.
//!
//! Where a case needs a stock `lmcache` to be found, a stand-in script is put
//! in a temporary virtual environment: every case fails before it would run,
//! and the stand-in writes a marker file if it ever does. Beside it, a
//! stand-in `python3` imports boto3 (it exits 0), as `s3_bucket` tiers need
//! of the server's Python.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::net::TcpListener;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::process::Command;

use crate::kit::{assert_fails, stderr, Case};

#[test]
fn unparsable_and_negative_variables_name_the_variable() {
    for (var, val) in [
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "lots"),
        ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "-2"),
        ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "1e999"),
        ("EREBINE_AGENT_LMCACHE_CHUNK_SIZE", "-256"),
        ("EREBINE_AGENT_LMCACHE_MP_PORT", "http"),
        ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", "{\"type\":"),
    ] {
        let mut case = Case::new();
        case.set(var, val);
        for args in [
            &["launch"][..],
            &["launch", "--dry-run", "--json"],
            &["size"],
        ] {
            if args[0] == "size" && !var.contains("SIZE_GB") {
                continue;
            }
            assert_fails(&case.run(args), 2, &[var]);
        }
        assert!(
            !case.path().join("cache").exists(),
            "{var}: cache dir created"
        );
    }
}

#[test]
fn text_variables_that_are_not_utf8_are_refused_by_name_never_read_lossily() {
    for var in [
        "EREBINE_AGENT_LMCACHE_DISK_PATH",
        "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB",
        "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
        "EREBINE_AGENT_LMCACHE_LOG_LEVEL",
    ] {
        let mut case = Case::new();
        let mut value = case.path().join("nu").into_os_string().into_vec();
        value.push(0xff);
        case.set(var, OsString::from_vec(value));
        for args in [
            &["launch"][..],
            &["launch", "--dry-run"],
            &["size"],
            &["inspect"],
        ] {
            assert_fails(&case.run(args), 2, &[&format!("{var} is not UTF-8 text")]);
        }
        let entries: Vec<_> = fs::read_dir(case.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            !entries
                .iter()
                .any(|name| name.to_string_lossy().starts_with("nu")),
            "{var}: {entries:?}"
        );
    }
}

#[test]
fn extra_args_the_server_would_refuse_are_refused_before_anything_starts() {
    for (value, needle) in [
        ("--eviction-policy -x", "--eviction-policy needs a value"),
        (
            "--eviction-policy FIFO",
            "write one of LRU, ARC, IsolatedLRU, noop",
        ),
        (
            "--no-such-flag 1",
            "\"--no-such-flag\" is not a flag of `lmcache server`",
        ),
        ("--chunk-size 256 512", "\"512\" is not a flag"),
        ("--max-workers many", "write a whole number"),
        ("--help", "prints LMCache's help"),
        ("--l2", "abbreviates several flags"),
    ] {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", value);
        for args in [&["launch"][..], &["launch", "--dry-run"]] {
            assert_fails(
                &case.run(args),
                2,
                &[
                    "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
                    needle,
                    "would refuse it",
                ],
            );
        }
        assert!(
            !case.path().join("cache").exists(),
            "{value}: cache dir created"
        );
    }
}

#[test]
fn the_lmcache_version_is_shown_and_an_untested_one_warned_about() {
    let case = Case::new();
    let out = case.run(&["launch", "--dry-run", "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["lmcache"]["version"], serde_json::Value::Null);
    let dist = case
        .path()
        .join("venv/lib/python3.11/site-packages/lmcache-0.4.9.dist-info");
    fs::create_dir_all(&dist).unwrap();
    fs::write(dist.join("METADATA"), "Name: lmcache\nVersion: 0.4.9\n").unwrap();
    let out = case.run(&["launch", "--dry-run", "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["lmcache"]["version"], "0.4.9");
    assert_eq!(plan["lmcache"]["tested"], false);
    let out = case.run(&["launch", "--dry-run"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(
            |l| l.starts_with("LMCACHE_TRACK_USAGE=false PYTHONUNBUFFERED=1 ")
                && l.contains("erebine-lmcache server --host 127.0.0.1")
        ),
        "the text plan gives the server's command line with its variables:\n{text}"
    );
    assert!(
        text.contains("LMCache 0.4.9 (")
            && text.contains("is not a tested version (0.5.4, 0.5.5, 0.5.6, 0.5.7rc2)"),
        "{text}"
    );
    let out = case.run(&["inspect", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["lmcache"]["version"], "0.4.9");
}

#[test]
fn a_home_that_cannot_hold_the_default_disk_path_is_refused() {
    let mut not_utf8 = b"/tmp/h".to_vec();
    not_utf8.push(0xff);
    for (home, needle) in [
        (
            OsString::from("rel"),
            "HOME=\"rel\" is not valid: give HOME as an absolute path",
        ),
        (OsString::from_vec(not_utf8), "HOME is not UTF-8 text"),
    ] {
        for backend in ["native", "lmcache"] {
            let mut case = Case::new();
            case.vars
                .remove(std::ffi::OsStr::new("EREBINE_AGENT_LMCACHE_DISK_PATH"));
            case.set("HOME", home.clone())
                .set("EREBINE_AGENT_KV_CACHE_BACKEND", backend);
            for args in [
                &["launch"][..],
                &["launch", "--dry-run"],
                &["size"],
                &["inspect"],
            ] {
                let out = case.run(args);
                assert_fails(&out, 2, &[needle]);
            }
            assert!(!case.path().join("rel").exists(), "{backend}");
        }
    }
}

#[test]
fn a_relative_disk_path_is_refused_whatever_the_backend() {
    for backend in ["native", "none", "lmcache"] {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_KV_CACHE_BACKEND", backend)
            .set("EREBINE_AGENT_LMCACHE_DISK_PATH", "relative/cache");
        for args in [
            &["launch"][..],
            &["launch", "--dry-run"],
            &["size"],
            &["inspect"],
        ] {
            let out = case.run(args);
            assert_fails(
                &out,
                2,
                &["EREBINE_AGENT_LMCACHE_DISK_PATH", "absolute path"],
            );
        }
        assert!(!case.path().join("relative").exists(), "{backend}");
    }
}

#[test]
fn negative_flags_are_refused_by_name() {
    let case = Case::new();
    let out = case.run(&["launch", "--lmcache-disk-size-gb", "-5"]);
    assert_fails(&out, 2, &["--lmcache-disk-size-gb", "non-negative"]);
    let out = case.run(&["size", "--l1-gb", "x"]);
    assert_fails(&out, 2, &["--l1-gb"]);
    let out = case.run(&["launch", "--tensor-parallel-size", "0"]);
    assert_fails(&out, 2, &["--tensor-parallel-size"]);
    for flag in [
        "--ready-timeout",
        "--stop-grace",
        "--restart-backoff",
        "--fast-failure-window",
        "--unresponsive-timeout",
    ] {
        let out = case.run(&["launch", flag, "18446744073709551615", "--dry-run"]);
        assert_fails(&out, 2, &[flag, "0..=604800"]);
    }
}

#[test]
fn a_disk_path_that_is_a_file_is_refused_and_left_intact() {
    let mut case = Case::new();
    let file = case.path().join("model.safetensors");
    fs::write(&file, b"weights").unwrap();
    case.set(
        "EREBINE_AGENT_LMCACHE_DISK_PATH",
        file.display().to_string(),
    );
    for args in [&["launch"][..], &["size"]] {
        let out = case.run(args);
        assert_fails(
            &out,
            2,
            &["EREBINE_AGENT_LMCACHE_DISK_PATH", "not a directory"],
        );
    }
    assert_eq!(fs::read(&file).unwrap(), b"weights");
}

#[test]
fn a_disk_path_on_a_pseudo_filesystem_or_relative_is_refused() {
    for (path, fs_type) in [
        ("/proc/self/erebine-cache", "proc"),
        ("/sys/erebine-cache", "sysfs"),
    ] {
        let mut case = Case::new();
        case.own_ports()
            .set("EREBINE_AGENT_LMCACHE_DISK_PATH", path);
        for args in [&["launch"][..], &["launch", "--dry-run"], &["size"]] {
            assert_fails(
                &case.run(args),
                2,
                &[
                    &format!("EREBINE_AGENT_LMCACHE_DISK_PATH={path}"),
                    &format!("{fs_type} is a kernel pseudo-filesystem, not storage"),
                ],
            );
        }
        case.set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0");
        for args in [&["launch", "--dry-run"][..], &["size"]] {
            let out = case.run(args);
            assert!(out.status.success(), "{path} {args:?}: {}", stderr(&out));
        }
    }
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_DISK_PATH", "relative/cache");
    assert_fails(&case.run(&["launch"]), 2, &["absolute"]);
}

#[test]
fn a_port_in_use_is_named_and_nothing_starts() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let mp_port = free.local_addr().unwrap().port().to_string();
    drop(free);
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_HTTP_PORT", &port)
        .set("EREBINE_AGENT_LMCACHE_MP_PORT", &mp_port);
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        4,
        &["EREBINE_AGENT_LMCACHE_HTTP_PORT", &port, "in use"],
    );
}

#[test]
fn missing_lmcache_lists_every_place_looked() {
    let mut case = Case::new();
    case.vars.remove(std::ffi::OsStr::new("VIRTUAL_ENV"));
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        3,
        &[
            "stock `lmcache`",
            "VIRTUAL_ENV",
            "vllm",
            "PATH",
            "pip install lmcache==0.5.6",
        ],
    );
    assert!(!case.path().join("cache").exists());
}

#[test]
fn missing_server_executable_is_named() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_PATH", "/nonexistent/erebine-lmcache");
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        3,
        &["EREBINE_AGENT_LMCACHE_PATH", "/nonexistent/erebine-lmcache"],
    );
}

#[test]
fn zero_l1_and_zero_disk_is_refused() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "0")
        .set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0");
    let out = case.run(&["launch", "--dry-run"]);
    assert_fails(
        &out,
        2,
        &["nothing to cache", "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB"],
    );
}

fn dry_run_plan(case: &Case, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["launch", "--dry-run", "--json"];
    args.extend_from_slice(extra);
    let out = case.run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn argv(plan: &serde_json::Value) -> Vec<String> {
    plan["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn zero_l1_with_a_disk_tier_runs_l1_as_a_write_buffer() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "0")
        .set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2");
    let plan = dry_run_plan(&case, &[]);
    let args = argv(&plan).join(" ");
    assert!(
        args.contains("--l1-size-gb 1 --eviction-policy noop --l2-store-policy skip_l1"),
        "{args}"
    );
    assert_eq!(plan["decisions"]["l1_size"]["rule"], "write-buffer");
}

#[test]
fn dry_run_plans_both_listeners_on_loopback_and_sizes_the_tier() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_MP_PORT", "7001")
        .set("EREBINE_AGENT_LMCACHE_HTTP_PORT", "7002")
        .set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "2");
    let plan = dry_run_plan(
        &case,
        &[
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size",
            "2",
            "--data-parallel-size",
            "2",
        ],
    );
    let args = argv(&plan);
    let expected_prefix = [
        "server",
        "--host",
        "127.0.0.1",
        "--port",
        "7001",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        "7002",
        "--chunk-size",
        "1024",
        "--l1-size-gb",
        "1",
        "--eviction-policy",
        "LRU",
        "--l2-prefetch-policy",
        "retain",
        "--max-gpu-workers",
        "8",
        "--l2-adapter",
    ];
    assert_eq!(&args[..expected_prefix.len()], expected_prefix);
    let tier: serde_json::Value = serde_json::from_str(args.last().unwrap()).unwrap();
    assert_eq!(tier["type"], "fs_native");
    assert_eq!(tier["max_capacity_gb"], 2.0);
    assert_eq!(
        tier["base_path"],
        case.path().join("cache").display().to_string()
    );
    assert_eq!(plan["env"]["LMCACHE_TRACK_USAGE"], "false");
    assert_eq!(plan["status_url"], "http://127.0.0.1:7002/status");
    assert!(
        !case.path().join("cache").exists(),
        "--dry-run created the directory"
    );
}

#[test]
fn size_json_has_every_documented_field() {
    let case = Case::new();
    let out = case.run(&[
        "size",
        "--json",
        "--l1-gb",
        "2",
        "--path",
        &case.path().display().to_string(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for field in [
        "volume_bytes",
        "free_bytes",
        "reclaimable_bytes",
        "l1_bytes",
        "capacity_bytes",
        "capacity_rule",
        "io_workers",
        "use_odirect",
        "odirect_reason",
        "fs_type",
        "volume_kind",
        "volume_kind_rule",
        "warnings",
    ] {
        assert!(!v[field].is_null(), "{field} missing in {v:#}");
    }
    assert_eq!(v["l1_bytes"], 2u64 << 30);
    assert!(v["disk_load_tokens_per_s"].is_null(), "{v:#}");
}

#[test]
fn size_says_what_the_disk_tier_loads_stated_or_probed_and_the_probe_leaves_nothing() {
    let case = Case::new();
    let dir = case.path().display().to_string();
    let size = |extra: &[&str]| {
        let mut args = vec!["size", "--json", "--l1-gb", "2", "--path", &dir];
        args.extend_from_slice(extra);
        let out = case.run(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let stated = size(&["--kv-bytes-per-token", "57344", "--disk-read-gbps", "2"]);
    assert_eq!(stated["disk_load_tokens_per_s"], 34_877, "{stated:#}");
    assert!(
        stated["disk_load_reason"]
            .as_str()
            .is_some_and(|r| r.contains("2.00 GB/s read (stated)")),
        "{stated:#}"
    );
    let probed = size(&["--kv-bytes-per-token", "8192", "--disk-read-gbps", "probe"]);
    match probed["disk_load_tokens_per_s"].as_u64() {
        Some(tokens) => assert!(tokens > 0, "{probed:#}"),
        None => assert!(
            probed["warnings"].to_string().contains("the read test"),
            "neither a figure nor the probe's failure: {probed:#}"
        ),
    }
    let left: Vec<_> = std::fs::read_dir(case.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().contains("read-probe"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // A cache directory not made yet is probed in its nearest existing
    // directory, as its volume is measured there, and is not created.
    let missing = case.path().join("not/yet");
    let out = case.run(&[
        "size",
        "--json",
        "--l1-gb",
        "2",
        "--path",
        &missing.display().to_string(),
        "--kv-bytes-per-token",
        "8192",
        "--disk-read-gbps",
        "probe",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let probed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !probed["warnings"].to_string().contains("statvfs"),
        "{probed:#}"
    );
    assert!(!case.path().join("not").exists());
    let out = case.run(&["size", "--path", &dir, "--disk-read-gbps", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--disk-read-gbps"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_backend_other_than_lmcache_has_nothing_to_launch_and_exits_0() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_KV_CACHE_BACKEND", "native");
    let out = case.run(&["launch"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to launch"),
        "{}",
        stderr(&out)
    );
    assert!(!case.path().join("cache").exists());
    let mut unset = Case::new();
    unset
        .vars
        .remove(std::ffi::OsStr::new("EREBINE_AGENT_KV_CACHE_BACKEND"));
    let out = unset.run(&["launch"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("EREBINE_AGENT_KV_CACHE_BACKEND is unset (default native)"),
        "{}",
        stderr(&out)
    );
    let plan = dry_run_plan(&case, &["--kv-cache-backend", "none"]);
    assert_eq!(plan["backend"], "none");
    assert!(plan["argv"].is_null());
    let plan = dry_run_plan(&case, &["--kv-cache-backend", "lmcache"]);
    assert_eq!(plan["backend"], "lmcache");
    assert_eq!(
        plan["connector_config"]["kv_connector"],
        "LMCacheMPConnector"
    );
}

#[test]
fn a_bad_backend_names_the_variable_or_the_flag() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache2");
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        2,
        &["EREBINE_AGENT_KV_CACHE_BACKEND", "native, lmcache or none"],
    );
    let out = case.run(&["launch", "--kv-cache-backend", "vllm"]);
    assert_fails(&out, 2, &["--kv-cache-backend", "native, lmcache or none"]);
}

#[test]
fn bad_extra_args_and_config_are_refused_before_anything_starts() {
    for (var, value, needle) in [
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
            "--l2-adapter {oops}",
            "not valid JSON",
        ),
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_CONFIG",
            "[]",
            "one JSON object",
        ),
        (
            "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR",
            "maybe",
            "an absolute path",
        ),
    ] {
        let mut case = Case::new();
        case.set(var, value);
        let out = case.run(&["launch"]);
        assert_fails(&out, 2, &[var, needle]);
        assert!(!case.path().join("cache").exists());
    }
}

#[test]
fn hybrid_attention_flag_raises_the_chunk_size() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0");
    let plan = dry_run_plan(
        &case,
        &[
            "--hybrid-attention",
            "--block-size",
            "528",
            "--max-num-batched-tokens",
            "512",
        ],
    );
    assert_eq!(plan["decisions"]["chunk_size"]["value"], 528);
    assert_eq!(
        plan["decisions"]["chunk_size"]["rule"],
        "derived-raised-hybrid-block"
    );
}

#[test]
fn inspect_refuses_a_url_that_is_not_http() {
    let case = Case::new();
    for url in [
        "garbage",
        "",
        "ftp://127.0.0.1/status",
        "file:///etc/passwd",
    ] {
        let out = case.run(&["inspect", "--url", url]);
        assert_fails(&out, 2, &["--url"]);
    }
}

#[test]
fn an_s3_bucket_tier_that_cannot_work_stops_the_launch_naming_tier_and_key() {
    let free = || {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let closed = free();
    // A missing region and a bucket bound's bad numbers are refused by the
    // plan (nothing started, as under --dry-run); an endpoint that does not
    // answer, by the gateway's start-up check in erebine-lmcache.
    for (s3_keys, key, when) in [
        (
            r#""s3_endpoint":"127.0.0.1:9""#.to_string(),
            "s3_region",
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER: ",
        ),
        (
            format!(r#""s3_endpoint":"127.0.0.1:{closed}","s3_region":"r""#),
            "s3_endpoint",
            "the server was not started",
        ),
        (
            r#""s3_endpoint":"127.0.0.1:9","s3_region":"r","max_capacity_gb":1,"eviction":{"eviction_ratio":2}"#.to_string(),
            "eviction.eviction_ratio",
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER: ",
        ),
    ] {
        let mut case = Case::new();
        let cascade = format!(
            r#"[{{"type":"fs","base_path":"/tmp/x"}},{{"type":"s3","s3_bucket":"kv-cache","disable_tls":true,{s3_keys},"aws_access_key_id":"AK","aws_secret_access_key":"REAL-SECRET-VALUE"}}]"#
        );
        case.set("EREBINE_AGENT_LMCACHE_L2_ADAPTER", &cascade)
            .set("EREBINE_AGENT_LMCACHE_MP_PORT", free().to_string())
            .set("EREBINE_AGENT_LMCACHE_HTTP_PORT", free().to_string());
        let out = case.run(&["launch"]);
        assert_fails(&out, 2, &[&format!("L2 tier 1 (s3): {key}:"), when]);
        assert!(
            !stderr(&out).contains("REAL-SECRET-VALUE"),
            "{}",
            stderr(&out)
        );
    }
}

/// S3 key prefixes that are not stable key prefixes: empty or dot segments,
/// a leading `/`, characters outside S3's safe set.
const BAD_KEY_PREFIXES: &[&str] = &["./", "a/./b/", "../", "a/..", "a//b/", "/lead/", "a b/"];

fn bucket_tier(prefix: &str) -> String {
    serde_json::json!({"type": "s3", "s3_endpoint": "127.0.0.1:9", "s3_bucket": "kv-cache",
        "s3_key_prefix": prefix, "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": "AK", "aws_secret_access_key": "REAL-SECRET-VALUE"})
    .to_string()
}

#[test]
fn a_dry_run_refuses_an_s3_key_prefix_with_path_syntax() {
    for prefix in BAD_KEY_PREFIXES {
        let mut case = Case::new();
        let cascade = format!(
            r#"[{{"type":"fs","base_path":"/tmp/x"}},{}]"#,
            bucket_tier(prefix)
        );
        case.set("EREBINE_AGENT_LMCACHE_L2_ADAPTER", &cascade);
        let out = case.run(&["launch", "--dry-run"]);
        assert_fails(
            &out,
            2,
            &[
                "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
                &format!("L2 tier 1 (s3): s3_key_prefix: {prefix:?}"),
            ],
        );
        assert!(
            !stderr(&out).contains("REAL-SECRET-VALUE"),
            "{}",
            stderr(&out)
        );
    }
}

/// `resp` tiers LMCache would refuse, or whose credentials the server
/// could not get one pair of, each with what the error names.
const BAD_RESP_TIERS: [(&str, &str); 6] = [
    (
        r#"{"type":"resp","host":"redis://10.0.0.5","port":6379}"#,
        "L2 tier 1 (resp): host: is a URL",
    ),
    (
        r#"{"type":"resp","host":"10.0.0.5:6379","port":6379}"#,
        "L2 tier 1 (resp): host: \"10.0.0.5:6379\" holds a port",
    ),
    (
        r#"{"type":"resp","port":6379}"#,
        "L2 tier 1 (resp): host: is missing",
    ),
    (
        r#"{"type":"resp","host":"h","port":"6379"}"#,
        "L2 tier 1 (resp): port: \"6379\" is not a port",
    ),
    (
        r#"{"type":"resp","host":"h","port":70000}"#,
        "L2 tier 1 (resp): port: 70000 is not a port",
    ),
    (
        r#"{"type":"resp","host":"h","port":1,"password":"OTHER-SECRET-VALUE"}"#,
        "L2 tier 1 (resp): its username and password differ from those of L2 tier 0",
    ),
];

#[test]
fn a_dry_run_and_erebine_lmcache_refuse_a_resp_tier_lmcache_would_refuse() {
    let first = r#"{"type":"resp","host":"h","port":1,"password":"REAL-SECRET-VALUE"}"#;
    for (tier, said) in BAD_RESP_TIERS {
        let mut case = Case::new();
        case.set(
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
            format!("[{first},{tier}]"),
        );
        let out = case.run(&["launch", "--dry-run"]);
        assert_fails(&out, 2, &["EREBINE_AGENT_LMCACHE_L2_ADAPTER", said]);
        let server = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
            .env_clear()
            .envs(&case.vars)
            .args(["server", "--l1-size-gb", "1", "--eviction-policy", "LRU"])
            .args(["--l2-adapter", first, "--l2-adapter", tier])
            .output()
            .unwrap();
        assert!(
            !case.path().join("stand-in-ran").exists(),
            "{tier}: LMCache was started"
        );
        assert_fails(&server, 2, &[said]);
        for out in [&out, &server] {
            let text = stderr(out);
            assert!(!text.contains("SECRET-VALUE"), "{text}");
        }
    }
}

#[test]
fn erebine_lmcache_server_refuses_an_s3_key_prefix_with_path_syntax_before_lmcache_starts() {
    for prefix in BAD_KEY_PREFIXES {
        let case = Case::new();
        let out = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
            .env_clear()
            .envs(&case.vars)
            .args(["server", "--l1-size-gb", "1", "--eviction-policy", "LRU"])
            .args(["--l2-adapter", &bucket_tier(prefix)])
            .output()
            .unwrap();
        assert!(
            !case.path().join("stand-in-ran").exists(),
            "{prefix}: LMCache was started"
        );
        assert_fails(
            &out,
            2,
            &[&format!("L2 tier 0 (s3): s3_key_prefix: {prefix:?}")],
        );
    }
}

#[test]
fn two_listeners_on_one_port_are_refused_whatever_sets_them_before_anything_is_created() {
    type Vars<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Vars, [&str; 2])] = &[
        (
            &[
                ("EREBINE_AGENT_LMCACHE_MP_PORT", "19700"),
                ("EREBINE_AGENT_LMCACHE_HTTP_PORT", "19700"),
            ],
            [
                "EREBINE_AGENT_LMCACHE_MP_PORT=19700",
                "EREBINE_AGENT_LMCACHE_HTTP_PORT=19700",
            ],
        ),
        (
            &[("EREBINE_AGENT_LMCACHE_HTTP_PORT", "6555")],
            [
                "EREBINE_AGENT_LMCACHE_MP_PORT=6555",
                "EREBINE_AGENT_LMCACHE_HTTP_PORT=6555",
            ],
        ),
        (
            &[
                ("EREBINE_AGENT_LMCACHE_HTTP_PORT", "19701"),
                ("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", "--port=19701"),
            ],
            [
                "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --port 19701",
                "EREBINE_AGENT_LMCACHE_HTTP_PORT=19701",
            ],
        ),
        (
            &[(
                "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
                "--port 19702 --http-port 19702",
            )],
            [
                "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --port 19702",
                "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --http-port 19702",
            ],
        ),
    ];
    for (vars, both) in cases {
        let mut case = Case::new();
        for (k, v) in *vars {
            case.set(k, *v);
        }
        for args in [&["launch", "--dry-run"][..], &["launch"]] {
            let out = case.run(args);
            assert_fails(&out, 2, &[both[0], both[1], "Give each its own port"]);
            assert!(
                !case.path().join("cache").exists(),
                "{args:?} created the cache directory"
            );
        }
    }
}

#[test]
fn a_port_in_use_stops_a_launch_before_the_cache_directory_is_made() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", format!("--port {port}"));
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        4,
        &[
            &format!("EREBINE_AGENT_LMCACHE_EXTRA_ARGS --port {port}"),
            "choose another port with --port in EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
        ],
    );
    assert!(!case.path().join("cache").exists());
}

/// A cache directory under /dev/shm (tmpfs on every Linux host), unique to
/// the test; a dry run and `size` create nothing there.
fn dev_shm_dir() -> String {
    format!(
        "/dev/shm/erebine-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

#[test]
fn a_tier_on_dev_shm_is_memory_backed_and_l1_plus_the_tier_stay_within_memory() {
    let shm = dev_shm_dir();
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_DISK_PATH", &shm)
        .set("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "2");
    let out = case.run(&["launch", "--dry-run", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let decisions = &plan["decisions"];
    assert_eq!(decisions["disk"]["volume_kind"]["value"], "memory");
    assert!(decisions["disk"]["volume_kind"]["reason"]
        .as_str()
        .unwrap()
        .starts_with("tmpfs is memory-backed"));
    let memory = decisions["host"]["memory"]["value"].as_u64().unwrap();
    let budget = memory - (memory / 4).max(8 << 30);
    let capacity = decisions["disk"]["capacity"]["value"].as_u64().unwrap();
    assert!(
        (2u64 << 30) + capacity <= budget,
        "L1 2 GiB + tier {capacity} > {budget} of {memory}"
    );
    let warned = decisions["warnings"].to_string();
    if capacity > 0 {
        assert!(warned.contains("is RAM beside the 2.00 GiB L1"), "{warned}");
        assert!(stderr(&out).contains("is RAM beside the 2.00 GiB L1"));
    }
    let text = case.run(&["size"]);
    assert!(text.status.success(), "{}", stderr(&text));
    let shown = String::from_utf8_lossy(&text.stdout);
    assert!(shown.contains("memory-backed"), "{shown}");
    let json = case.run(&["size", "--json"]);
    let sized: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(sized["volume_kind"], "memory");
    assert_eq!(sized["fs_type"], "tmpfs");
    assert_eq!(sized["capacity_bytes"].as_u64(), Some(capacity));
    assert!(!Path::new(&shm).exists(), "a dry run created {shm}");
}

#[test]
fn an_explicit_tier_on_dev_shm_beyond_the_memory_budget_is_refused_with_the_numbers() {
    let shm = dev_shm_dir();
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_DISK_PATH", &shm)
        .set("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "2")
        .set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "100000");
    for args in [&["launch", "--dry-run"][..], &["launch"], &["size"]] {
        let out = case.run(args);
        assert_fails(
            &out,
            2,
            &[
                &format!("EREBINE_AGENT_LMCACHE_DISK_PATH={shm}"),
                "EREBINE_AGENT_LMCACHE_DISK_SIZE_GB asks",
                "on a memory-backed volume (tmpfs",
                "with the 2.00 GiB L1",
                "Set it to at most",
            ],
        );
    }
    assert!(!Path::new(&shm).exists() || fs::read_dir(&shm).unwrap().next().is_none());
    let _ = fs::remove_dir_all(&shm);
}

#[test]
fn a_positive_disk_size_below_a_byte_is_below_the_minimum_not_off() {
    for tiny in ["1e-300", "0.0000000001", "5e-324"] {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", tiny);
        let plan = dry_run_plan(&case, &[]);
        let capacity = &plan["decisions"]["disk"]["capacity"];
        assert_eq!(capacity["rule"], "below-1gib", "{tiny}: {capacity}");
        let reason = capacity["reason"].as_str().unwrap();
        assert!(
            reason.contains("below the 1 GiB minimum") && !reason.contains("disables"),
            "{tiny}: {reason}"
        );
    }
}

#[test]
fn an_l1_below_1_gib_is_kept_with_a_warning() {
    for tiny in ["1e-300", "0.5"] {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", tiny);
        let out = case.run(&["launch", "--dry-run"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(stderr(&out).contains("below 1 GiB: LMCache stages every chunk in L1"));
    }
}

#[test]
fn a_disk_tier_smaller_than_l1_is_kept_and_the_launch_warns_with_both_sizes() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "3")
        .set("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "1.5");
    let out = case.run(&["launch", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let warning = "the 1.50 GiB disk tier is smaller than the 3.00 GiB L1";
    assert!(stderr(&out).contains(warning), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("capacity=1.50 GiB"));
    let plan = dry_run_plan(&case, &[]);
    assert_eq!(plan["decisions"]["disk"]["capacity"]["value"], 3u64 << 29);
    assert!(plan["decisions"]["warnings"][0]
        .as_str()
        .unwrap()
        .contains(warning));
}

#[test]
fn erebine_lmcache_server_refuses_a_metrics_port_its_server_listens_on() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--http-port", "18090"],
            "--http-port 18090 (the server's HTTP port)",
        ),
        (&["--port=18090"], "--port 18090 (the server's ZMQ port)"),
    ];
    for (flags, named) in cases {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_LMCACHE_METRICS_PORT", "18090");
        let out = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
            .env_clear()
            .envs(&case.vars)
            .args(["server", "--l1-size-gb", "1", "--eviction-policy", "LRU"])
            .args(*flags)
            .output()
            .unwrap();
        assert!(
            !case.path().join("stand-in-ran").exists(),
            "LMCache was started"
        );
        assert_fails(
            &out,
            2,
            &[
                "EREBINE_AGENT_LMCACHE_METRICS_PORT=18090 (the metrics endpoint)",
                named,
            ],
        );
    }
}

/// A bind error that is not a taken port is reported as the kernel gave
/// it, never as "already in use": a link-local address without its scope
/// (EINVAL).
#[test]
fn a_listener_that_cannot_be_opened_says_what_the_kernel_said() {
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_METRICS_PORT", "18093")
        .set("EREBINE_AGENT_LMCACHE_METRICS_HOST", "fe80::1");
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        2,
        &[
            "EREBINE_AGENT_LMCACHE_METRICS_PORT=18093",
            "cannot listen on [fe80::1]:18093: ",
        ],
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("already in use"));
}

#[test]
fn a_metrics_host_that_is_no_listening_address_is_refused_by_name() {
    for host in [
        "224.0.0.1",
        "255.255.255.255",
        "ff02::1",
        "localhost",
        "[::1]",
    ] {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_LMCACHE_METRICS_PORT", "18091")
            .set("EREBINE_AGENT_LMCACHE_METRICS_HOST", host);
        let out = case.run(&["launch", "--dry-run"]);
        assert_fails(&out, 2, &["EREBINE_AGENT_LMCACHE_METRICS_HOST", host]);
    }
    let mut case = Case::new();
    case.set("EREBINE_AGENT_LMCACHE_METRICS_PORT", "18092")
        .set("EREBINE_AGENT_LMCACHE_METRICS_HOST", "10.255.255.1");
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        2,
        &["EREBINE_AGENT_LMCACHE_METRICS_HOST=10.255.255.1: not an address of this host"],
    );
    assert!(!case.path().join("cache").exists());
}

/// A relative `--path` is refused naming the flag the operator wrote, not
/// the variable it stands for.
#[test]
fn a_relative_path_flag_is_refused_naming_the_flag() {
    let case = Case::new();
    for args in [
        &["size", "--path", "cache"][..],
        &["housekeep", "--path", "./cache", "--dry-run"],
    ] {
        let out = case.run(args);
        assert_fails(&out, 2, &["--path=", "give an absolute path"]);
        assert!(
            !stderr(&out).contains("EREBINE_AGENT_LMCACHE_DISK_PATH"),
            "{args:?}"
        );
    }
}

/// An `fs` tier whose capacity its volume cannot hold is refused before
/// anything starts, naming the tier, the key and the volume (exit 2), not
/// left to a server that exits at once.
#[test]
fn a_capacity_larger_than_its_volume_stops_the_launch_before_the_server() {
    let mut case = Case::new();
    let tier = case.path().join("fs-tier");
    case.own_ports().set(
        "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        format!(
            r#"{{"type":"fs","base_path":"{}","max_capacity_gb":1000000}}"#,
            tier.display()
        ),
    );
    let out = case.run(&["launch"]);
    assert_fails(
        &out,
        2,
        &[
            "L2 tier 0",
            "max_capacity_gb = 1000000 is larger than the volume",
            "the server was not started",
        ],
    );
    assert!(!case.path().join("stand-in-ran").exists());
}

#[test]
fn a_tier_kind_whose_module_the_server_python_lacks_stops_the_plan_naming_the_fix() {
    const L2: &str = "EREBINE_AGENT_LMCACHE_L2_ADAPTER";
    const EXTRA: &str = "EREBINE_AGENT_LMCACHE_EXTRA_ARGS";
    let raw_block = r#"{"type":"raw_block","device_path":"/dev/null","slot_bytes":4194304}"#;
    let bucket = bucket_tier("node-a/");
    for (variable, value, module, needles) in [
        (
            L2,
            format!("[{bucket}]"),
            "boto3",
            vec![
                "EREBINE_AGENT_LMCACHE_L2_ADAPTER: the s3_bucket tiers need boto3 in the LMCache server's Python",
                "`{python} -m pip install boto3`",
            ],
        ),
        (
            L2,
            format!("[{raw_block}]"),
            "lmcache_rust_raw_block_io",
            vec![
                "EREBINE_AGENT_LMCACHE_L2_ADAPTER: the raw_block tiers need lmcache_rust_raw_block_io (LMCache's Rust raw-block extension",
                "install it where {python} imports from, or take the raw_block tier out of the cascade",
            ],
        ),
        // Each module is asked in the order of the tiers that need it; the
        // tiers of EXTRA_ARGS are named by that variable.
        (
            EXTRA,
            format!("--l2-adapter {raw_block}"),
            "lmcache_rust_raw_block_io",
            vec!["EREBINE_AGENT_LMCACHE_EXTRA_ARGS: the raw_block tiers need"],
        ),
        (
            L2,
            format!("[{raw_block},{bucket}]"),
            "lmcache_rust_raw_block_io",
            vec!["EREBINE_AGENT_LMCACHE_L2_ADAPTER: the raw_block tiers need"],
        ),
    ] {
        let mut case = Case::new();
        // A real Python without either module: isolated, without
        // site-packages (LMCache's wheel does not ship the raw-block one).
        let python = case.path().join("venv/bin/python3");
        fs::write(&python, "#!/bin/sh\nexec python3 -I -S \"$@\"\n").unwrap();
        case.set(variable, &value).own_ports();
        let missing = format!("No module named '{module}'");
        let mut expected: Vec<String> = needles
            .iter()
            .map(|n| n.replace("{python}", &python.display().to_string()))
            .collect();
        expected.push(missing);
        let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
        for args in [&["launch", "--dry-run"][..], &["launch"]] {
            let out = case.run(args);
            assert_fails(&out, 2, &expected);
            assert!(
                !stderr(&out).contains("REAL-SECRET-VALUE"),
                "{}",
                stderr(&out)
            );
            assert!(!case.path().join("stand-in-ran").exists());
        }
    }
}

#[test]
fn an_s3_tier_that_would_sign_with_the_gateways_key_is_refused_naming_it() {
    let mut case = Case::new();
    let chained = r#"{"type":"s3","s3_endpoint":"b.example.net","s3_region":"r"}"#;
    let cascade = format!("[{},{chained}]", bucket_tier("node-a/"));
    case.set("EREBINE_AGENT_LMCACHE_L2_ADAPTER", &cascade);
    let out = case.run(&["launch", "--dry-run"]);
    assert_fails(
        &out,
        2,
        &[
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
            "L2 tier 1 (s3): aws_access_key_id: is not in the tier, and the server's AWS_ACCESS_KEY_ID holds the per-launch key",
        ],
    );
}

#[test]
fn a_dry_run_shows_the_gateways_key_variables_redacted() {
    let mut case = Case::new();
    let cascade = format!("[{}]", bucket_tier("node-a/"));
    case.set("EREBINE_AGENT_LMCACHE_L2_ADAPTER", &cascade);
    let text = case.run(&["launch", "--dry-run"]);
    let json = case.run(&["launch", "--dry-run", "--json"]);
    for out in [&text, &json] {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        assert!(!String::from_utf8_lossy(&out.stdout).contains("REAL-SECRET-VALUE"));
    }
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("AWS_ACCESS_KEY_ID='<redacted>' AWS_SECRET_ACCESS_KEY='<redacted>' "),
        "{text}"
    );
    let plan: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        plan["env"]["AWS_SECRET_ACCESS_KEY"], "<redacted>",
        "{plan:#}"
    );
}

/// A number too large for its type, as a variable, an extra argument or a
/// flag, is refused as too large with the largest value accepted; the
/// error quotes at most the first 80 characters of a value.
#[test]
fn values_too_large_are_named_so_with_the_largest_accepted() {
    let vars = [
        (
            "EREBINE_AGENT_LMCACHE_CHUNK_SIZE",
            "4294967296",
            "4294967295",
        ),
        ("EREBINE_AGENT_HOST_AGENT_COUNT", "4294967296", "4294967295"),
        (
            "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB",
            "99999999999",
            "17179869183",
        ),
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
            "--chunk-size 99999999999",
            "4294967295",
        ),
    ];
    for (var, val, largest) in vars {
        let mut case = Case::new();
        case.set(var, val);
        let out = case.run(&["launch", "--dry-run"]);
        assert_fails(&out, 2, &[var, "too large", largest]);
    }
    let case = Case::new();
    for args in [
        &["size", "--l1-gb", "99999999999"][..],
        &["size", "--disk-size-gb", "1e30"],
        &["launch", "--dry-run", "--lmcache-disk-size-gb", "1e30"],
        &["housekeep", "--dry-run", "--capacity-gb", "99999999999"],
    ] {
        assert_fails(
            &case.run(args),
            2,
            &[args[args.len() - 2], "too large", "17179869183"],
        );
    }
    let mut case = Case::new();
    let config = format!("{{\"a\":\"{}\"", "x".repeat(100_000));
    case.set("EREBINE_AGENT_LMCACHE_EXTRA_CONFIG", config.as_str());
    let out = case.run(&["launch", "--dry-run"]);
    assert_fails(
        &out,
        2,
        &["EREBINE_AGENT_LMCACHE_EXTRA_CONFIG", "(100007 bytes)"],
    );
    assert!(stderr(&out).len() < 1000, "{}", stderr(&out));
}

/// Operator JSON that writes a key twice is refused at plan time, naming
/// the tier's position and the key: JSON parsers keep the last one.
#[test]
fn json_with_a_repeated_key_is_refused_naming_the_tier_and_the_key() {
    let tier = r#"{"type":"fs","base_path":"/tmp/t","type":"s3"}"#;
    let cases = [
        (
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
            tier.to_string(),
            "L2 tier 0",
        ),
        (
            "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
            format!(r#"[{{"type":"fs","base_path":"/tmp/a"}},{tier}]"#),
            "L2 tier 1",
        ),
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
            format!(r#"--l2-adapter {{"type":"fs","base_path":"/tmp/a"}} --l2-adapter {tier}"#),
            "L2 tier 1",
        ),
        (
            "EREBINE_AGENT_LMCACHE_EXTRA_CONFIG",
            r#"{"lmcache.mp.timeout":30,"x":{"k":1,"k":2}}"#.to_string(),
            "\"k\"",
        ),
    ];
    for (var, val, needle) in cases {
        let mut case = Case::new();
        case.set(var, val.as_str());
        for args in [
            &["launch", "--dry-run"][..],
            &["launch", "--dry-run", "--json"],
        ] {
            let key = if var.ends_with("EXTRA_CONFIG") {
                "\"k\""
            } else {
                "\"type\""
            };
            assert_fails(
                &case.run(args),
                2,
                &[var, needle, key, "written twice", "write each key once"],
            );
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["server", "--l2-adapter", tier])
        .output()
        .unwrap();
    assert_fails(
        &out,
        2,
        &["--l2-adapter #1", "L2 tier 0", "\"type\"", "written twice"],
    );
}

/// Every directory the plan takes is judged at plan time, dry runs
/// included: a regular file, a symlink to one or a path under one is
/// refused (exit 2) naming the variable (and the tier), and so is a path
/// holding a control character; a directory still to be made is accepted.
#[test]
fn paths_the_plan_takes_are_judged_at_plan_time() {
    let case = Case::new();
    let file = case.path().join("file");
    fs::write(&file, "x").unwrap();
    let link = case.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let bad = [file.clone(), link, file.join("under")];
    let tier = |path: &str| serde_json::json!({"type": "fs", "base_path": path}).to_string();
    for path in &bad {
        let text = path.to_str().unwrap();
        let settings = [
            ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", tier(text)),
            (
                "EREBINE_AGENT_LMCACHE_EXTRA_ARGS",
                format!("--l2-adapter {}", tier(text)),
            ),
            (
                "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR",
                text.to_string(),
            ),
            ("EREBINE_AGENT_LMCACHE_DISK_PATH", text.to_string()),
        ];
        for (var, val) in settings {
            let mut case = Case::new();
            case.set(var, val.as_str()).own_ports();
            for args in [&["launch", "--dry-run"][..], &["launch"]] {
                assert_fails(&case.run(args), 2, &[var, "not a directory"]);
            }
        }
    }
    for control in ["\n", "\r", "\t", "\u{1b}[31m", "\u{7f}"] {
        let path = format!("{}/a{control}b", case.path().display());
        let settings = [
            ("EREBINE_AGENT_LMCACHE_L2_ADAPTER", tier(&path)),
            ("EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR", path.clone()),
            ("EREBINE_AGENT_LMCACHE_DISK_PATH", path.clone()),
        ];
        for (var, val) in settings {
            let mut case = Case::new();
            case.set(var, val.as_str());
            for args in [
                &["launch", "--dry-run"][..],
                &["launch"],
                &["size"],
                &["housekeep", "--dry-run"],
            ] {
                if args[0] != "launch" && !var.ends_with("DISK_PATH") {
                    continue;
                }
                let out = case.run(args);
                assert_fails(&out, 2, &[var, "control characters"]);
                assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
            }
        }
    }
    let missing = case.path().join("not/yet");
    let mut fine = Case::new();
    fine.set(
        "EREBINE_AGENT_LMCACHE_L2_ADAPTER",
        tier(missing.to_str().unwrap()).as_str(),
    )
    .set(
        "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR",
        missing.to_str().unwrap(),
    );
    let out = fine.run(&["launch", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `cache_identity` values that are not a tag (16 lowercase hex digits):
/// one that could leave the tier's prefix, too short, too long, upper
/// case, not a string.
const BAD_CACHE_IDENTITIES: &[&str] = &[
    r#""../../other""#,
    r#""0123""#,
    r#""0123456789abcdef0""#,
    r#""0123456789ABCDEF""#,
    "17",
];

#[test]
fn a_cache_identity_that_is_not_a_tag_is_refused_by_the_plan_and_by_erebine_lmcache() {
    for value in BAD_CACHE_IDENTITIES {
        let mut tier: serde_json::Value = serde_json::from_str(&bucket_tier("node/")).unwrap();
        tier["cache_identity"] = serde_json::from_str(value).unwrap();
        let mut case = Case::new();
        case.set("EREBINE_AGENT_LMCACHE_L2_ADAPTER", format!("[{tier}]"));
        let out = case.run(&["launch", "--dry-run"]);
        assert_fails(&out, 2, &["L2 tier 0 (s3): cache_identity:"]);
        let out = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
            .env_clear()
            .envs(&case.vars)
            .args(["server", "--l1-size-gb", "1", "--eviction-policy", "LRU"])
            .args(["--l2-adapter", &tier.to_string()])
            .output()
            .unwrap();
        assert!(!case.path().join("stand-in-ran").exists(), "{value}");
        assert_fails(&out, 2, &["L2 tier 0 (s3): cache_identity:"]);
    }
}

/// The plan sets the launch's tag on each `s3_bucket` tier that names none,
/// keeps the one a tier names, and the tag moves with the KV dtype and the
/// weights but not with the served name.
#[test]
fn the_dry_run_puts_each_bucket_tier_under_the_launchs_cache_identity() {
    let tag_of = |extra: &[&str], tiers: &str| {
        let mut case = Case::new();
        case.set("EREBINE_AGENT_LMCACHE_L2_ADAPTER", tiers);
        let plan = dry_run_plan(&case, extra);
        let tag = plan["cache_identity"]["tag"].as_str().unwrap().to_string();
        (tag, plan["cascade"].clone())
    };
    let tiers = format!("[{}]", bucket_tier("node/"));
    let (auto, cascade) = tag_of(&[], &tiers);
    assert_eq!(cascade[0]["cache_identity"], auto.as_str());
    let (fp8, _) = tag_of(&["--kv-cache-dtype", "fp8"], &tiers);
    let (served, _) = tag_of(&["--served-model-name", "chat"], &tiers);
    let (given, _) = tag_of(&["--weights-fingerprint", "release 7"], &tiers);
    let (quantized, _) = tag_of(&["--quantization", "fp8"], &tiers);
    assert_eq!(served, auto);
    let tags: BTreeSet<&String> = [&auto, &fp8, &given, &quantized].into_iter().collect();
    assert_eq!(tags.len(), 4, "{tags:?}");
    let mut own: serde_json::Value = serde_json::from_str(&bucket_tier("node/")).unwrap();
    own["cache_identity"] = "0123456789abcdef".into();
    let (_, cascade) = tag_of(&[], &format!("[{own}]"));
    assert_eq!(cascade[0]["cache_identity"], "0123456789abcdef");
}

#[test]
fn a_weights_fingerprint_that_cannot_be_one_is_refused() {
    for bad in ["", "  ", "a\nb", &"x".repeat(257)] {
        let case = Case::new();
        let out = case.run(&["launch", "--dry-run", "--weights-fingerprint", bad]);
        assert_fails(&out, 2, &["--weights-fingerprint"]);
        let out = case.run(&["housekeep", "--dry-run", "--weights-fingerprint", bad]);
        assert_fails(&out, 2, &["--weights-fingerprint"]);
    }
    let long = format!(r#"{{"a":"{}"}}"#, "x".repeat(5000));
    let out = Case::new().run(&["launch", "--dry-run", "--hf-overrides", &long]);
    assert_fails(&out, 2, &["--hf-overrides", "4096 bytes"]);
}

/// A SIGTERM while a gateway's start-up check waits on a store that does
/// not answer (it takes connections and says nothing) stops
/// `erebine-lmcache` with 128 + 15, as if the server had ended on it; the
/// server is never started.
#[test]
fn a_sigterm_during_the_gateways_start_starts_no_server() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let tier = serde_json::json!({"type": "s3", "s3_endpoint": format!("127.0.0.1:{port}"),
        "s3_bucket": "kv-cache", "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": "AK", "aws_secret_access_key": "REAL-SECRET-VALUE"});
    let case = Case::new();
    let child = Command::new(env!("CARGO_BIN_EXE_erebine-lmcache"))
        .env_clear()
        .envs(&case.vars)
        .args(["server", "--l1-size-gb", "1", "--eviction-policy", "LRU"])
        .args(["--l2-adapter", &tier.to_string()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let started = std::time::Instant::now();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("SIGTERM came while the tiers' adapters started"),
        "{}",
        stderr(&out)
    );
    assert!(
        !case.path().join("stand-in-ran").exists(),
        "LMCache was started"
    );
    drop(silent);
}

#[test]
fn a_dry_run_redacts_every_added_l2_adapter_whatever_its_shape() {
    let secret = r#"{"type":"resp","host":"h","port":1,"password":"ADDED-SECRET-VALUE"}"#;
    let shapes = [
        vec![
            "--server-arg=--l2-adapter".to_string(),
            format!("--server-arg={secret}"),
        ],
        vec![format!("--server-arg=--l2-adapter={secret}")],
        vec![
            "--server-arg=--l2-adapter".to_string(),
            "--server-arg=not json ADDED-SECRET-VALUE".to_string(),
        ],
    ];
    for shape in shapes {
        let mut case = Case::new();
        case.own_ports();
        let mut args = vec!["launch", "--dry-run", "--json"];
        args.extend(shape.iter().map(String::as_str));
        let out = case.run(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shape:?}: {}", stderr(&out));
        assert!(!text.contains("ADDED-SECRET-VALUE"), "{shape:?}: {text}");
        assert!(text.contains("redacted"), "{shape:?}: {text}");
    }
}

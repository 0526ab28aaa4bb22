//! The launch identity against LMCache's own code: for engine flags of every
//! kind (a hub id, a path, odd characters, DCP, MLA, TP x PP, cache salts),
//! the names LMCache 0.5.6's vLLM connector and fs adapter give the objects
//! (`scripts/lmcache-object-names.py`, run in the LMCache environment) must
//! decode with our codec, and carry the model name and world size of the
//! identity the same flags give; housekeeping keeps them. Then a launch
//! whose `--model` differs from what the tier holds: the warning, in the
//! dry runs, the launch log, the metrics and `inspect`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lmcache_housekeeping::codec::{parse_object_name, MODEL_SEPARATOR};
use lmcache_housekeeping::{
    housekeep, write_manifest, Access, LaunchIdentity, Mode, TierDir, TierPolicy,
};
use lmcache_launcher::EngineFacts;
use lmcache_tier_e2e::{
    binaries, data_objects, free_port, get_text, lmcache_venv, stop_launch, wait_for_status,
    Binaries, Proc,
};
use serde_json::{json, Value};

const BINS: Binaries = binaries!();

/// One engine configuration: (model, TP, PP, DCP, interleave, MLA, hybrid).
type Case = (&'static str, u32, u32, u32, u32, bool, bool);

const CASES: [Case; 14] = [
    ("meta-llama/Llama-3.1-8B-Instruct", 1, 1, 1, 1, false, false),
    ("/models/Qwen3-8B", 2, 1, 1, 1, false, false),
    ("/models/Qwen3-8B/", 1, 1, 1, 1, false, false),
    ("./tiny", 1, 1, 1, 1, false, false),
    ("../models/../tiny.v2", 1, 1, 1, 1, false, false),
    ("//srv//models", 1, 1, 1, 1, false, false),
    ("Org/Modèle-日本語", 1, 1, 1, 1, false, false),
    ("Org/M+v2%20 x", 1, 1, 1, 1, false, false),
    ("a-SEP-b/c", 1, 1, 1, 1, false, false),
    ("Org/M", 4, 2, 1, 1, false, false),
    ("Org/M", 4, 1, 2, 1, false, false),
    ("Org/M", 4, 1, 2, 16, false, false),
    ("deepseek-ai/DeepSeek-V3", 8, 2, 2, 1, true, false),
    ("Org/Hybrid-MLA", 4, 1, 1, 1, true, true),
];

fn facts(case: &Case) -> EngineFacts {
    let &(model, tp, pp, dcp, interleave, mla, hybrid) = case;
    EngineFacts {
        model: model.into(),
        served_model_name: Some("what-clients-send".into()),
        tensor_parallel_size: tp,
        pipeline_parallel_size: pp,
        decode_context_parallel_size: dcp,
        cp_kv_cache_interleave_size: interleave,
        mla,
        hybrid_attention: hybrid,
        ..EngineFacts::default()
    }
}

/// The names LMCache's code gives each case's objects, chunk size 256.
fn lmcache_names() -> Vec<Vec<String>> {
    let cases: Vec<Value> = CASES
        .iter()
        .map(|c| {
            let f = facts(c);
            json!({
                "model": f.model,
                "tensor_parallel_size": f.tensor_parallel_size,
                "pipeline_parallel_size": f.pipeline_parallel_size,
                "decode_context_parallel_size": f.decode_context_parallel_size,
                "cp_kv_cache_interleave_size": f.cp_kv_cache_interleave_size,
                "mla": f.mla,
                "hybrid": f.hybrid_attention,
                "chunk_size": 256,
                "cache_salts": ["", "user-7"],
            })
        })
        .collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lmcache-object-names.py");
    let mut child = Command::new(lmcache_venv().join("bin/python"))
        .arg(script)
        .env("LMCACHE_LOG_LEVEL", "ERROR")
        .env("LMCACHE_TRACK_USAGE", "false")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    serde_json::to_writer(child.stdin.take().unwrap(), &cases).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), CASES.len(), "{stdout}");
    lines
        .iter()
        .map(|l| {
            let names: Vec<String> = serde_json::from_value(l["names"].clone()).unwrap();
            assert!(!names.is_empty(), "{l}");
            names
        })
        .collect()
}

#[test]
fn our_identity_and_decoder_agree_with_every_name_lmcache_writes() {
    lmcache_tier_e2e::require_lmcache!();
    for (case, names) in CASES.iter().zip(lmcache_names()) {
        let identity = facts(case).launch_identity(256, None);
        identity.validate().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        for name in &names {
            let parsed = parse_object_name(name)
                .unwrap_or_else(|e| panic!("{case:?}: {name} does not decode: {e}"));
            assert_eq!(&parsed.to_string(), name, "{case:?}");
            // Compared as written: LMCache writes `/` as `-SEP-` and so
            // cannot tell a `-SEP-` of the model itself from a `/`.
            assert_eq!(
                parsed.model_written(),
                identity.lmcache_model_name().replace('/', MODEL_SEPARATOR),
                "{name}"
            );
            assert_eq!(
                u64::from(parsed.kv_rank.world_size()),
                identity.kv_world_size(),
                "{case:?}: {name}"
            );
            std::fs::write(tmp.path().join(name), b"kv").unwrap();
        }
        let unsalted = names.iter().filter(|n| !n.ends_with("@user-7.data"));
        assert_eq!(
            unsalted.map(String::len).max(),
            Some(identity.object_name_len()),
            "{case:?}"
        );
        record(tmp.path(), &identity);
        let plan = |identity: &LaunchIdentity| {
            housekeep(tmp.path(), identity, TierPolicy::default(), Mode::DryRun)
                .unwrap()
                .report
        };
        let kept = plan(&identity);
        assert_eq!(
            kept.kept_objects.count,
            names.len() as u64,
            "{case:?}: {kept}"
        );
        assert_eq!(kept.identity_purge, None);
        // The name clients send is not what LMCache writes under.
        let served = LaunchIdentity {
            model: "what-clients-send".into(),
            ..identity.clone()
        };
        let purged = plan(&served);
        assert_eq!(purged.kept_objects.count, 0, "{case:?}: {purged}");
        let change = &purged.identity_purge.expect("all purged").changes[0];
        let written = |model: &str| model.replace('/', MODEL_SEPARATOR);
        assert_eq!(
            (change.field, written(&change.stored)),
            ("model", written(&identity.lmcache_model_name()))
        );
    }
}

/// Records `identity` in the manifest of `dir`, as the launch that wrote the
/// objects did.
fn record(dir: &Path, identity: &LaunchIdentity) {
    let tier = TierDir::open(dir, Access::ReadWrite).unwrap();
    write_manifest(&tier, identity).unwrap();
}

/// A tier written by an engine whose `--model` was `/models/tiny`, with its
/// manifest: the names LMCache gives four chunks of that engine.
fn tier_of_model_path(cache: &Path) -> usize {
    std::fs::create_dir_all(cache).unwrap();
    let identity = EngineFacts {
        model: "/models/tiny".into(),
        max_num_batched_tokens: Some(512),
        ..EngineFacts::default()
    }
    .launch_identity(256, None);
    let names = [1u8, 2, 3, 4].map(|n| {
        format!(
            "-SEP-models-SEP-tiny@0x01000100@0@{}.data",
            format!("{n:02x}").repeat(32)
        )
    });
    for name in &names {
        std::fs::write(cache.join(name), vec![7u8; 64 << 10]).unwrap();
    }
    record(cache, &identity);
    names.len()
}

#[test]
fn a_launch_under_another_model_name_warns_before_it_purges_the_tier() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cache = dir.join("cache");
    let objects = tier_of_model_path(&cache);
    let (mp_port, http_port) = (free_port(), free_port());
    // `launch_command` gives `--model test-model`: what a node started
    // with its served model name instead of vLLM's --model gets.
    let flags = ["--max-num-batched-tokens", "512"];
    let change = r#"model "/models/tiny" -> "test-model""#;

    let mut dry = BINS.launch_command(dir, mp_port, http_port, &flags);
    let out = dry.args(["--dry-run", "--json"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("WARN")
            && stderr.contains("a launch would purge 100% of the tier (4 of 4 objects")
            && stderr.contains(change),
        "{stderr}"
    );
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = &plan["housekeeping_report"];
    assert_eq!(report["deleted"][0]["reason"], "other_model", "{report:#}");
    assert_eq!(report["deleted"][0]["count"], objects);
    assert_eq!(report["kept_objects"]["count"], 0);
    assert_eq!(
        report["identity_purge"]["changes"][0],
        json!({"field": "model", "stored": "/models/tiny", "current": "test-model"})
    );
    let mut text = BINS.launch_command(dir, mp_port, http_port, &flags);
    let out = text.arg("--dry-run").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("would delete {objects} entries"))
            && stdout.contains("other_model 4"),
        "{stdout}"
    );
    let out = Command::new(BINS.lmcache_tier())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .args([
            "housekeep",
            "--dry-run",
            "--model",
            "test-model",
            "--max-num-batched-tokens",
            "512",
            "--path",
        ])
        .arg(&cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.contains(change), "{stderr}");
    assert_eq!(
        data_objects(&cache).len(),
        objects,
        "a dry run deleted something"
    );

    let metrics_port = free_port();
    let mut command = BINS.launch_command(dir, mp_port, http_port, &flags);
    command.env(
        "EREBINE_AGENT_LMCACHE_METRICS_PORT",
        metrics_port.to_string(),
    );
    let mut launch = Proc::spawn(command, &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let log = launch.output();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains("purged 100% of the tier")
            && l.contains(change)),
        "{log}"
    );
    let scrape = get_text(&format!("http://127.0.0.1:{metrics_port}/metrics")).unwrap();
    assert!(
        scrape.contains("lmcache_tier_housekeeping_identity_purge 1")
            && scrape.contains(r#"lmcache_tier_housekeeping_identity_change{field="model",stored="/models/tiny",current="test-model"} 1"#),
        "{scrape}"
    );
    let inspect = Command::new(BINS.lmcache_tier())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", &cache)
        .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string())
        .env(
            "EREBINE_AGENT_LMCACHE_METRICS_PORT",
            metrics_port.to_string(),
        )
        .arg("inspect")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        shown.contains("WARNING: it purged most of the tier because the launch identity differed")
            && shown.contains(change),
        "{shown}"
    );
    stop_launch(&mut launch);
}

#[test]
fn a_model_whose_object_names_cannot_be_files_is_warned_about() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dry_run = |model: &str| {
        let out = Command::new(BINS.lmcache_tier())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", tmp.path())
            .env("VIRTUAL_ENV", lmcache_venv())
            .env("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache")
            .args(["launch", "--dry-run", "--model", model])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let long = format!("/models/{}/snapshots/{}", "org-".repeat(30), "a".repeat(40));
    let expected = long.replace('/', MODEL_SEPARATOR).len() + 83;
    let stderr = dry_run(&long);
    assert!(
        stderr.contains(&format!(
            "object names for --model {long:?} are {expected} bytes, over the 255"
        )),
        "{stderr}"
    );
    assert!(!dry_run("Org/Model").contains("over the 255"));
}

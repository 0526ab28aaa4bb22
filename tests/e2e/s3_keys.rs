//! End to end: LMCache's own S3 adapter (`erebine-lmcache bench l2`, data
//! verified) stores and loads objects whose model names carry path syntax
//! (`.`, `..`, a leading `/`, `//`, `+` and a space) through the gateway, to
//! moto (keys checked exactly in a listing) and to s3s-fs, which checks
//! every SigV4 signature strictly (`docs/s3-gateway.md`, "Object keys").

use std::path::Path;
use std::process::Command;

use lmcache_tier_e2e::{binaries, free_port, venv_with_bench_model, Binaries, S3Server, S3sFs};

const BINS: Binaries = binaries!();

/// Model names as users pass them to vLLM (relative and absolute paths,
/// repeated slashes, LoRA names).
const MODELS: &[&str] = &["./m", "../models/m", "/abs/m", "a//b/m", "org/m+lora v2"];
const KEY_ID: &str = "AKIAE2EOPERATORKEY01";
const SECRET: &str = "e2e-operator-secret-0123456789abcdefghij";
const PREFIX: &str = "node-a/";

/// Runs `bench l2` on `spec` once for each of [`MODELS`], keys named after
/// the model, in one process: 2 objects of 64 KiB stored, looked up,
/// loaded and compared a model. Panics unless every run succeeds.
fn bench_l2_with_models(dir: &Path, spec: &serde_json::Value) {
    let out = Command::new(BINS.erebine_lmcache())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", dir)
        .env("VIRTUAL_ENV", venv_with_bench_model(dir))
        .env("LMCACHE_TRACK_USAGE", "false")
        .env("BENCH_MODEL", MODELS.join("\n"))
        .args(["bench", "l2", "--l2-adapter", &spec.to_string()])
        .args(["--num-keys", "2", "--rounds", "1", "--warmup-rounds", "0"])
        .args(["--data-size-kb", "64", "--no-skip-verify"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let runs: Vec<&str> = text.split("bench model: ").skip(1).collect();
    assert_eq!(runs.len(), MODELS.len(), "{text}");
    for (model, run) in MODELS.iter().zip(runs) {
        assert!(run.starts_with(model), "{model}: {run}");
        for needle in [
            "success_keys=2/2",
            "loaded=2/2",
            "All 2 keys data verified OK",
        ] {
            assert!(run.contains(needle), "{model}: no {needle:?} in:\n{run}");
        }
    }
}

/// The keys `bench l2 --num-keys 2` writes for `model` under [`PREFIX`].
fn expected_keys(model: &str) -> Vec<String> {
    (0..2)
        .map(|i| format!("{PREFIX}{model}@{i:08x}@0@{i:032x}"))
        .collect()
}

#[test]
fn every_model_shape_is_stored_and_loaded_under_its_exact_key_in_moto() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3Server::with_bucket(dir, "kv-cache");
    let spec = serde_json::json!({
        "type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port), "s3_bucket": "kv-cache",
        "s3_key_prefix": PREFIX, "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
    });
    bench_l2_with_models(dir, &spec);
    let mut expected: Vec<String> = MODELS.iter().flat_map(|m| expected_keys(m)).collect();
    let mut keys = s3.list_keys("kv-cache");
    keys.sort();
    expected.sort();
    assert_eq!(keys, expected);
}

#[test]
fn every_model_shape_is_stored_and_loaded_through_s3s_fs_which_checks_signatures_strictly() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s3 = S3sFs::start(dir, free_port(), (KEY_ID, SECRET), &["kv-cache"]);
    let spec = serde_json::json!({
        "type": "s3", "s3_endpoint": format!("127.0.0.1:{}", s3.port), "s3_bucket": "kv-cache",
        "s3_key_prefix": PREFIX, "s3_region": "us-east-1", "disable_tls": true,
        "aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
    });
    bench_l2_with_models(dir, &spec);
}

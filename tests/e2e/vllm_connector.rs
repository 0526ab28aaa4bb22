//! The engine's `--kv-transfer-config`, as `launch --dry-run --json` prints
//! it, parsed by the KV-transfer configuration of each vLLM version that
//! `EREBINE_TEST_VLLM_SOURCES` holds (`scripts/setup-vllm-sources.sh`:
//! 0.26.0, the GPU trial's, and 0.33.0 and 0.34.0) with
//! `scripts/vllm-connector-check.py`: accepted as it stands, the connector
//! still registered and reading the server's address from the keys the plan
//! writes, its KV named after the engine's model (`docs/configuration.md`,
//! "The vLLM connector config").

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use lmcache_tier_e2e::{binaries, free_port, lmcache_venv, say_skipped, Binaries};

const BINS: Binaries = binaries!();

/// The vLLM versions `scripts/setup-vllm-sources.sh` unpacks by default.
const VERSIONS: [&str; 3] = ["0.26.0", "0.33.0", "0.34.0"];

fn sources() -> Result<PathBuf, String> {
    let dir = std::env::var_os("EREBINE_TEST_VLLM_SOURCES")
        .map(PathBuf::from)
        .ok_or("EREBINE_TEST_VLLM_SOURCES is not set: scripts/test.sh unpacks vLLM's sources with scripts/setup-vllm-sources.sh and sets it")?;
    match VERSIONS
        .iter()
        .all(|v| dir.join(v).join("vllm/config/kv_transfer.py").is_file())
    {
        true => Ok(dir),
        false => Err(format!("{} lacks one of {VERSIONS:?}", dir.display())),
    }
}

/// The plan's connector config with `extra_config` as
/// `EREBINE_AGENT_LMCACHE_EXTRA_CONFIG` (if any).
fn planned_config(extra_config: Option<&str>) -> (serde_json::Value, u16) {
    let tmp = tempfile::tempdir().unwrap();
    let mp_port = free_port();
    let mut cmd = BINS.launch_command(tmp.path(), mp_port, free_port(), &["--dry-run", "--json"]);
    if let Some(extra) = extra_config {
        cmd.env("EREBINE_AGENT_LMCACHE_EXTRA_CONFIG", extra);
    }
    let out = cmd.output().expect("launch --dry-run runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    (plan["connector_config"].clone(), mp_port)
}

/// The checker's verdict per version, and its exit status.
fn vllm_check(
    sources: &std::path::Path,
    config: &serde_json::Value,
) -> (Vec<serde_json::Value>, bool) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/vllm-connector-check.py");
    let mut child = Command::new(lmcache_venv().join("bin/python"))
        .arg(script)
        .arg(sources)
        .args(VERSIONS)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the checker starts");
    let text = config.to_string();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect::<Vec<serde_json::Value>>();
    assert_eq!(
        lines.len(),
        VERSIONS.len(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (lines, out.status.success())
}

#[test]
fn every_vllm_version_accepts_the_planned_connector_config() {
    lmcache_tier_e2e::require_lmcache!();
    let sources = match sources() {
        Ok(dir) => dir,
        Err(why) => return say_skipped(module_path!(), &why),
    };
    let (config, mp_port) = planned_config(None);
    let (verdicts, passed) = vllm_check(&sources, &config);
    for verdict in &verdicts {
        assert_eq!(verdict["accepted"], true, "{verdict:#}");
        assert_eq!(
            verdict["server_url"],
            format!("tcp://127.0.0.1:{mp_port}"),
            "{verdict:#}"
        );
        assert_eq!(verdict["ok"], true, "{verdict:#}");
    }
    assert!(passed);
    // A key the operator adds to the connector's extra config stays inside
    // it, where vLLM takes any key; the server's address stays the plan's.
    let (config, _) = planned_config(Some(r#"{"lmcache.mp.mq_timeout":30}"#));
    assert_eq!(
        config["kv_connector_extra_config"]["lmcache.mp.mq_timeout"],
        30
    );
    let (verdicts, passed) = vllm_check(&sources, &config);
    assert!(passed, "{verdicts:#?}");
    // The check can fail: vLLM 0.33 dropped kv_ip, which 0.26.0 took.
    let mut legacy = config.clone();
    legacy["kv_ip"] = "127.0.0.1".into();
    let (verdicts, passed) = vllm_check(&sources, &legacy);
    assert!(!passed);
    let accepted: Vec<bool> = verdicts.iter().map(|v| v["accepted"] == true).collect();
    assert_eq!(accepted, [true, false, false], "{verdicts:#?}");
}

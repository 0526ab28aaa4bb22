//! LMCache's compiled extensions on a GPU node, tried on a CPU machine.
//!
//! Two stand-ins, because neither fault can be produced here otherwise:
//! - a GPU: the node's GPUs are counted from `/dev/nvidia<N>` and
//!   `/proc/driver/nvidia/gpus`; the commands run in a mount namespace of
//!   their own where a tmpfs on `/proc/driver` holds one GPU entry (root);
//! - an LMCache whose `lmcache.cuda_ops` does not load: the real LMCache
//!   0.5.6 package, linked file by file into a folder of its own, with its
//!   `cuda_ops` replaced by a file that is not a shared object. The real
//!   server runs from it (on CPU it never imports `cuda_ops`).
//!
//! With the GPU the launch log, `--dry-run --json` and `inspect` warn with
//! the torch version, the extension and Python's error; without it nothing
//! is checked and nothing is said.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lmcache_tier_e2e::{
    binaries, free_port, lmcache_venv, stop_launch, wait_for_status, Binaries, Proc,
};
use serde_json::Value;

const BINS: Binaries = binaries!();

/// Sets up the GPU stand-in and runs the rest of the command line.
const WITH_A_GPU: &str = "mount -t tmpfs gpu /proc/driver && mkdir -p /proc/driver/nvidia/gpus/0000:3b:00.0 && exec \"$@\"";

/// A Python environment whose `lmcache` is the real package with a broken
/// `cuda_ops`: `bin/lmcache` runs the real venv's Python with `site` first
/// on its path. Returns the environment's folder and that `site` folder.
fn broken_cuda_ops(dir: &Path) -> (PathBuf, PathBuf) {
    let real = lmcache_venv();
    let real_package = std::fs::read_dir(real.join("lib"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site-packages/lmcache"))
        .find(|p| p.is_dir())
        .expect("the real lmcache package");
    let venv = dir.join("venv");
    let site = venv.join("site");
    let package = site.join("lmcache");
    std::fs::create_dir_all(&package).unwrap();
    for entry in std::fs::read_dir(&real_package).unwrap().flatten() {
        let name = entry.file_name();
        let target = package.join(&name);
        if name.to_string_lossy().starts_with("cuda_ops.") {
            std::fs::write(&target, b"not a shared object").unwrap();
        } else {
            symlink(entry.path(), &target).unwrap();
        }
    }
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    let stock = venv.join("bin/lmcache");
    let script = format!(
        "#!{}\nimport sys\nfrom lmcache.cli.main import main\nsys.exit(main())\n",
        real.join("bin/python3").display()
    );
    std::fs::write(&stock, script).unwrap();
    std::fs::set_permissions(&stock, std::fs::Permissions::from_mode(0o755)).unwrap();
    (venv, site)
}

/// `cmd` with the stand-in environment of `venv` and `site`.
fn with_venv(mut cmd: Command, venv: &Path, site: &Path) -> Command {
    cmd.env("VIRTUAL_ENV", venv).env("PYTHONPATH", site);
    cmd
}

/// `cmd` run in a mount namespace where the node has one GPU.
fn on_a_gpu_node(cmd: &Command) -> Command {
    let mut wrapped = Command::new("unshare");
    wrapped
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            WITH_A_GPU,
            "sh",
        ])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            wrapped.env(key, value);
        }
    }
    wrapped
}

fn json_of(mut cmd: Command) -> Value {
    let out = cmd.output().expect("runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn dry_run(dir: &Path, venv: &Path, site: &Path) -> Command {
    let cmd = BINS.launch_command(dir, free_port(), free_port(), &["--dry-run", "--json"]);
    with_venv(cmd, venv, site)
}

fn gpu_warnings(plan: &Value) -> Vec<String> {
    plan["decisions"]["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|w| w.contains("on this GPU node"))
        .map(str::to_string)
        .collect()
}

/// The plan's `max_num_batched_tokens` rule and the warnings about it.
fn batched_tokens(plan: &Value) -> (String, Vec<String>) {
    let rule = plan["decisions"]["max_num_batched_tokens"]["rule"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let warnings = plan["decisions"]["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|w| w.contains("max batched tokens"))
        .map(str::to_string)
        .collect();
    (rule, warnings)
}

#[test]
fn without_a_gpu_nothing_is_checked_or_said() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let (venv, site) = broken_cuda_ops(tmp.path());
    let plan = json_of(dry_run(tmp.path(), &venv, &site));
    assert!(plan["facts"].get("gpu").is_none(), "{plan:#}");
    assert_eq!(gpu_warnings(&plan), Vec::<String>::new(), "{plan:#}");
    let (rule, warnings) = batched_tokens(&plan);
    assert_eq!(rule, "vllm-default-no-gpu", "{plan:#}");
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn on_a_gpu_node_a_cuda_ops_that_does_not_load_is_named_in_the_plan_the_log_and_inspect() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (venv, site) = broken_cuda_ops(dir);

    let plan = json_of(on_a_gpu_node(&dry_run(dir, &venv, &site)));
    let gpu = &plan["facts"]["gpu"];
    assert_eq!(gpu["devices"], 1, "{plan:#}");
    assert_eq!(gpu["extensions"]["state"], "failed", "{plan:#}");
    let torch = gpu["extensions"]["torch"].as_str().expect("torch imported");
    let failures = gpu["extensions"]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "only cuda_ops is broken: {plan:#}");
    assert_eq!(failures[0]["extension"], "lmcache.cuda_ops");
    let error = failures[0]["error"].as_str().unwrap();
    assert!(error.starts_with("ImportError"), "{error}");
    let warnings = gpu_warnings(&plan);
    assert_eq!(warnings.len(), 1, "{plan:#}");
    for needle in [&format!("torch {torch}"), "lmcache.cuda_ops", error] {
        assert!(warnings[0].contains(needle), "{needle}: {}", warnings[0]);
    }
    // A GPU seen and no nvidia-smi to read it: the engine's batched tokens
    // are vLLM's smallest default, and the plan says it guessed.
    let (rule, batched) = batched_tokens(&plan);
    assert_eq!(rule, "vllm-default-gpu-unread", "{plan:#}");
    assert!(
        batched.len() == 1 && batched[0].contains("nvidia-smi"),
        "{batched:?}"
    );

    // A real launch from that environment: warned in its log, and the
    // server still comes up (on CPU LMCache never imports cuda_ops).
    let (mp_port, http_port) = (free_port(), free_port());
    let launch_cmd = with_venv(
        BINS.launch_command(dir, mp_port, http_port, &[]),
        &venv,
        &site,
    );
    let mut launch = Proc::spawn(on_a_gpu_node(&launch_cmd), &dir.join("launch.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    let log = launch.output();
    assert!(log.contains("WARN") && log.contains(&warnings[0]), "{log}");

    // inspect in the launch's namespace sees the GPU and warns; outside it
    // there is no GPU and no row.
    let inspect = |json: bool| {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", launch.pid()))
            .arg(BINS.lmcache_tier())
            .args(["inspect", "--url", &url])
            .args(json.then_some("--json"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"));
        with_venv(cmd, &venv, &site)
    };
    let report = json_of(inspect(true));
    assert_eq!(report["gpu"]["extensions"]["state"], "failed", "{report:#}");
    let text = inspect(false).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("gpu")
            && text.contains("WARNING: on this GPU node")
            && text.contains("lmcache.cuda_ops"),
        "{text}"
    );
    let mut outside = Command::new(BINS.lmcache_tier());
    outside
        .args(["inspect", "--json", "--url", &url])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("EREBINE_AGENT_LMCACHE_DISK_PATH", dir.join("cache"));
    let report = json_of(with_venv(outside, &venv, &site));
    assert_eq!(report["gpu"], Value::Null, "{report:#}");

    stop_launch(&mut launch);
}

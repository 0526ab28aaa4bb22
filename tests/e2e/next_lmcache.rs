//! End to end with the next LMCache, 0.5.7rc2 (a pre-release), in the
//! environment `EREBINE_TEST_LMCACHE_NEXT_VENV` names (`scripts/test.sh`
//! installs it with `LMCACHE_VERSION=0.5.7rc2 scripts/setup-lmcache.sh`):
//! the plan renders its command line for it, and the server's API key
//! (`EREBINE_AGENT_LMCACHE_API_KEY_FILE`) is created 0600, passed by file,
//! carried by the launch's `/status` polls and `inspect`, and found in no
//! command line, environment or log; a client without it gets 401; a key
//! changed in the file is the one a restarted server and the launch use.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lmcache_tier_e2e::{binaries, free_port, say_skipped, stop_launch, Binaries, Proc};

const BINS: Binaries = binaries!();

/// The 0.5.7rc2 environment, or why there is none.
fn next_venv() -> Result<PathBuf, String> {
    let venv = std::env::var_os("EREBINE_TEST_LMCACHE_NEXT_VENV")
        .map(PathBuf::from)
        .ok_or("EREBINE_TEST_LMCACHE_NEXT_VENV is not set: scripts/test.sh installs LMCache 0.5.7rc2 and sets it")?;
    match venv.join("bin/lmcache").is_file() {
        true => Ok(venv),
        false => Err(format!("no lmcache in {}", venv.display())),
    }
}

/// The status code of a GET of `url` with `bearer` (if any); `None` when
/// nothing answers.
fn status_code(url: &str, bearer: Option<&str>) -> Option<u16> {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(2))
        .no_proxy()
        .build()
        .ok()?;
    let mut request = client.get(url);
    if let Some(key) = bearer {
        request = request.bearer_auth(key);
    }
    Some(request.send().ok()?.status().as_u16())
}

/// Waits until `launch` logs that the server is ready.
fn wait_ready(launch: &mut Proc, limit: Duration) {
    let start = Instant::now();
    while !launch.output().contains("LMCache server ready") {
        if let Some(status) = launch.try_status() {
            panic!("launch exited ({status}):\n{}", launch.output());
        }
        assert!(
            start.elapsed() < limit,
            "not ready in {limit:?}:\n{}",
            launch.output()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The text of every process's command line and environment that mentions
/// `needle`, as `pid: what`.
fn processes_holding(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let dir = entry.path();
        for file in ["cmdline", "environ"] {
            let Ok(raw) = std::fs::read(dir.join(file)) else {
                continue;
            };
            if String::from_utf8_lossy(&raw).contains(needle) {
                found.push(format!("{}: {file}", dir.display()));
            }
        }
    }
    found
}

fn inspect(
    venv: &Path,
    home: &Path,
    http_port: u16,
    key_file: Option<&Path>,
) -> std::process::Output {
    let mut cmd = std::process::Command::new(BINS.lmcache_tier());
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("VIRTUAL_ENV", venv)
        .env("HOME", home)
        .env("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache")
        .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", http_port.to_string())
        .args(["inspect", "--json"]);
    if let Some(file) = key_file {
        cmd.env("EREBINE_AGENT_LMCACHE_API_KEY_FILE", file);
    }
    cmd.output().expect("inspect runs")
}

#[test]
fn the_api_key_is_made_passed_by_file_and_carried_by_every_request_of_ours() {
    lmcache_tier_e2e::time_test!();
    let venv = match next_venv() {
        Ok(venv) => venv,
        Err(why) => return say_skipped(module_path!(), &why),
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let key_file = dir.join("keys/lmcache-api.key");
    let (mp_port, http_port) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{http_port}/status");
    let mut cmd = BINS.launch_command(dir, mp_port, http_port, &[]);
    cmd.env("VIRTUAL_ENV", &venv)
        .env("EREBINE_AGENT_LMCACHE_API_KEY_FILE", &key_file);
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    wait_ready(&mut launch, Duration::from_secs(180));

    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&key_file), 0o600);
    assert_eq!(mode(key_file.parent().unwrap()), 0o700);
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(key.len(), 64, "32 random bytes in hex");

    let log = launch.output();
    assert!(log.contains("LMCache 0.5.7rc2"), "{log}");
    assert!(!log.contains("is not a tested version"), "{log}");
    assert!(log.contains("created the LMCache API key file"), "{log}");
    let by_file = format!("--api-key-file {}", key_file.display());
    assert!(
        !lmcache_tier_e2e::processes_mentioning(&by_file).is_empty(),
        "the server gets the key by file: {by_file}"
    );
    assert_eq!(status_code(&url, None), Some(401), "no key: refused");
    assert_eq!(status_code(&url, Some("not-the-key")), Some(401));
    assert_eq!(status_code(&url, Some(&key)), Some(200));

    let with_key = inspect(&venv, dir, http_port, Some(&key_file));
    assert!(
        with_key.status.success(),
        "{}",
        String::from_utf8_lossy(&with_key.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&with_key.stdout).unwrap();
    assert_eq!(report["lmcache"]["version"], "0.5.7rc2", "{report:#}");
    let without = inspect(&venv, dir, http_port, None);
    assert_eq!(without.status.code(), Some(9), "answers but not healthy");
    let said = String::from_utf8_lossy(&without.stdout).to_string()
        + &String::from_utf8_lossy(&without.stderr);
    assert!(
        said.contains("HTTP 401") && said.contains("API key"),
        "{said}"
    );

    // The key itself is in no command line, environment or log line.
    assert_eq!(processes_holding(&key), Vec::<String>::new());

    // A key changed in the file is the one a restarted server takes, and
    // the launch's polls after the restart carry it.
    let rotated = "0123456789abcdef0123456789abcdef";
    std::fs::write(&key_file, format!("{rotated}\n")).unwrap();
    let server = format!("bin/lmcache server --host 127.0.0.1 --port {mp_port} ");
    let servers = lmcache_tier_e2e::processes_mentioning(&server);
    assert_eq!(servers.len(), 1, "{servers:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(servers[0].0),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let restarted = lmcache_tier_e2e::wait_until(Duration::from_secs(120), || {
        launch.output().matches("LMCache server ready").count() >= 2
    });
    assert!(restarted, "{}", launch.output());
    assert_eq!(status_code(&url, Some(rotated)), Some(200));
    assert_eq!(
        status_code(&url, Some(&key)),
        Some(401),
        "the old key is gone"
    );
    assert!(inspect(&venv, dir, http_port, Some(&key_file))
        .status
        .success());
    stop_launch(&mut launch);
    let log = launch.output();
    assert!(!log.contains(&key) && !log.contains(rotated));
}

#[test]
fn a_key_the_server_would_refuse_is_refused_before_anything_is_made() {
    lmcache_tier_e2e::time_test!();
    let venv = match next_venv() {
        Ok(venv) => venv,
        Err(why) => return say_skipped(module_path!(), &why),
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let keys = dir.join("keys");
    std::fs::create_dir(&keys).unwrap();
    let missing = dir.join("missing.key");
    let cases: [(&str, &Path, &str); 2] = [
        (
            "EREBINE_AGENT_LMCACHE_API_KEY_FILE",
            &keys,
            "is not a regular file",
        ),
        ("LMCACHE_API_KEY_FILE", &missing, "missing.key"),
    ];
    for (variable, value, said) in cases {
        for dry_run in [true, false] {
            let extra: &[&str] = if dry_run { &["--dry-run"] } else { &[] };
            let mut cmd = BINS.launch_command(dir, free_port(), free_port(), extra);
            cmd.env("VIRTUAL_ENV", &venv).env(variable, value);
            let out = cmd.output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{variable} {dry_run}: {stderr}");
            assert!(stderr.contains(said), "{variable} {dry_run}: {stderr}");
            assert!(
                !dir.join("cache").exists(),
                "{variable}: the cache directory was made"
            );
        }
    }
}

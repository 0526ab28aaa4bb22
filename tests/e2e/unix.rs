//! The launcher as a Unix process: every terminating signal stops the server
//! before the tier's lock is let go, output that cannot be written stops
//! nothing, a command line that never starts a server touches nothing on
//! disk, and bytes are passed on as given.

use std::ffi::OsString;
use std::fs;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lmcache_launcher::run::supervise::{signal_name, terminating_signals};
use lmcache_tier_e2e::{
    binaries, free_port, get_json, lmcache_venv, processes_mentioning, wait_for_status, Binaries,
    Proc,
};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

const BINS: Binaries = binaries!();

/// A stand-in for the server, used where the question is what the launcher
/// does around it, which the real server cannot report: it records its pid
/// and one forwarded variable's bytes, and on SIGTERM whether the tier's
/// lock is still held at that moment. The trap is set before the pid is written: the test signals once the
/// pid is there, and a SIGTERM before the trap would end the shell unseen.
/// Each file is written whole under another name and renamed into place,
/// so that a file the test finds is complete.
const STAND_IN: &str = r#"#!/bin/sh
put() { cat > "$EREBINE_TEST_STATE/$1.part" && mv "$EREBINE_TEST_STATE/$1.part" "$EREBINE_TEST_STATE/$1"; }
trap 'if flock -n "$EREBINE_TEST_LOCK" true; then echo released; else echo held; fi | put at-stop; exit 0' TERM
printf '%s' "$EREBINE_TEST_BYTES" | put bytes
echo $$ | put pid
while :; do sleep 0.1; done
"#;

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

/// Whether nobody holds the `flock` on `lock`.
fn lock_free(lock: &Path) -> bool {
    Command::new("flock")
        .arg("-n")
        .arg(lock)
        .arg("true")
        .status()
        .unwrap()
        .success()
}

struct StandInLaunch {
    _tmp: tempfile::TempDir,
    state: PathBuf,
    lock: PathBuf,
    launch: Proc,
}

fn stand_in_launch(bytes: &[u8]) -> StandInLaunch {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let server = dir.join("stand-in-server");
    fs::write(&server, STAND_IN).unwrap();
    fs::set_permissions(&server, fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.join("state");
    fs::create_dir(&state).unwrap();
    let lock = dir.join("cache/.lmcache-tier.lock");
    let mut cmd = BINS.launch_command(dir, free_port(), free_port(), &[]);
    // Dozens of these run at once: no metrics port to find for each.
    cmd.env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
        .env("EREBINE_AGENT_LMCACHE_PATH", &server)
        .env("EREBINE_TEST_STATE", &state)
        .env("EREBINE_TEST_LOCK", &lock)
        .env("EREBINE_TEST_BYTES", OsString::from_vec(bytes.to_vec()));
    let launch = Proc::spawn(cmd, &dir.join("launch.log"));
    StandInLaunch {
        _tmp: tmp,
        state,
        lock,
        launch,
    }
}

#[test]
fn every_terminating_signal_stops_the_server_before_the_lock_is_released() {
    lmcache_tier_e2e::require_lmcache!();
    let signals = terminating_signals();
    let mut launches: Vec<(i32, StandInLaunch)> = signals
        .iter()
        .map(|&number| (number, stand_in_launch(b"as given: \xff\xfe+%2e")))
        .collect();
    for (number, l) in &mut launches {
        let pid_file = l.state.join("pid");
        let name = signal_name(*number);
        let launch = &mut l.launch;
        wait_for(
            &format!("{name}: the server start"),
            Duration::from_secs(60),
            || {
                if let Some(status) = launch.try_status() {
                    panic!("{name}: the launch ended ({status}):\n{}", launch.output());
                }
                pid_file.exists()
            },
        );
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(l.launch.pid(), *number) };
    }
    for (number, l) in &mut launches {
        let name = signal_name(*number);
        let status = l
            .launch
            .wait_timeout(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{name}: the launch did not stop:\n{}", l.launch.output()));
        let log = l.launch.output();
        assert!(status.success(), "{name}: {status}\n{log}");
        assert!(
            log.contains(&format!("{name} received: stopping the LMCache server")),
            "{name}:\n{log}"
        );
        let at_stop = fs::read_to_string(l.state.join("at-stop")).unwrap_or_default();
        assert_eq!(
            at_stop.trim(),
            "held",
            "{name}: the lock at the server's stop"
        );
        let server: i32 = fs::read_to_string(l.state.join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!alive(server), "{name}: the server outlived its launcher");
        assert!(lock_free(&l.lock), "{name}: the lock is still held");
        assert_eq!(
            fs::read(l.state.join("bytes")).unwrap(),
            b"as given: \xff\xfe+%2e",
            "{name}: a forwarded variable's bytes"
        );
    }
}

/// Whether process `pid` catches signal `number` (its `SigCgt` mask).
fn catches(pid: i32, number: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (number - 1)) != 0)
}

#[test]
fn a_signal_while_the_launch_plans_and_housekeeps_stops_it_before_any_start() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Enough objects that planning and housekeeping take a while.
    let cache = dir.join("cache");
    fs::create_dir_all(&cache).unwrap();
    for i in 0..20_000u32 {
        fs::write(cache.join(object_name(i)), b"").unwrap();
    }
    for number in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR2] {
        let name = signal_name(number);
        let mut launch = Proc::spawn(
            BINS.launch_command(dir, free_port(), free_port(), &[]),
            &dir.join("launch.log"),
        );
        wait_for(&format!("{name} caught"), Duration::from_secs(10), || {
            catches(launch.pid(), number)
        });
        // SAFETY: kill has no memory effects.
        unsafe { libc::kill(launch.pid(), number) };
        let status = launch
            .wait_timeout(Duration::from_secs(60))
            .expect("the launch ends");
        let log = launch.output();
        assert!(status.success(), "{name}: {status}\n{log}");
        assert!(
            log.contains(&format!(
                "{name} received before the LMCache server started: not starting it"
            )),
            "{name}:\n{log}"
        );
        assert!(!log.contains("LMCache server started;"), "{name}:\n{log}");
        assert!(lock_free(&cache.join(".lmcache-tier.lock")));
        let probes = fs::read_dir(&cache)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("odirect-probe"))
            .count();
        assert_eq!(probes, 0, "{name}: a probe file was left");
    }
}

/// A real `lmcache-tier launch` in `dir`, once its server answers `/status`.
fn ready_launch(dir: &Path) -> Proc {
    let http_port = free_port();
    let mut launch = Proc::spawn(
        BINS.launch_command(dir, free_port(), http_port, &[]),
        &dir.join("launch.log"),
    );
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut launch, Duration::from_secs(180));
    launch
}

#[test]
fn the_lock_is_held_until_the_servers_processes_are_gone_when_the_wrapper_dies_first() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut launch = ready_launch(dir);
    let wrapper = lmcache_tier_e2e::children_of(launch.pid());
    assert_eq!(wrapper.len(), 1, "{wrapper:?}");
    launch.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    // The wrapper dies at once, as an OOM kill would take it; the Python
    // server it started is still stopping.
    nix::sys::signal::kill(Pid::from_raw(wrapper[0]), Signal::SIGKILL).unwrap();
    let status = launch
        .wait_timeout(Duration::from_secs(60))
        .expect("the launch ends");
    let left = processes_mentioning(&dir.display().to_string());
    let lock = lock_free(&dir.join("cache/.lmcache-tier.lock"));
    assert!(status.success(), "{status}\n{}", launch.output());
    assert!(left.is_empty(), "running when the launch ended: {left:?}");
    assert!(lock);
}

/// A stand-in for the stock `lmcache` that ignores SIGTERM, as a server
/// stuck in a system call or a handler would: only SIGKILL ends it. Its pid
/// file is renamed into place once written, as [`STAND_IN`]'s.
const DEAF_SERVER: &str = r#"#!/bin/sh
trap '' TERM
echo $$ > "$EREBINE_TEST_STATE/pid.part" && mv "$EREBINE_TEST_STATE/pid.part" "$EREBINE_TEST_STATE/pid"
while :; do sleep 0.1; done
"#;

#[test]
fn a_server_deaf_to_sigterm_is_gone_within_the_grace_when_the_launch_is_killed() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let venv = dir.join("venv");
    fs::create_dir_all(venv.join("bin")).unwrap();
    let stock = venv.join("bin/lmcache");
    fs::write(&stock, DEAF_SERVER).unwrap();
    fs::set_permissions(&stock, fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.join("state");
    fs::create_dir(&state).unwrap();
    let grace = 3;
    let mut cmd = BINS.launch_command(
        dir,
        free_port(),
        free_port(),
        &["--stop-grace", &grace.to_string()],
    );
    cmd.env("EREBINE_AGENT_LMCACHE_METRICS_PORT", "0")
        .env("EREBINE_AGENT_LMCACHE_PATH", BINS.erebine_lmcache())
        .env("VIRTUAL_ENV", &venv)
        .env("EREBINE_TEST_STATE", &state);
    let mut launch = Proc::spawn(cmd, &dir.join("launch.log"));
    let pid_file = state.join("pid");
    wait_for("the server start", Duration::from_secs(60), || {
        if let Some(status) = launch.try_status() {
            panic!("the launch ended ({status}):\n{}", launch.output());
        }
        pid_file.exists()
    });
    let server: i32 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let wrapper = lmcache_tier_e2e::children_of(launch.pid());
    assert_eq!(wrapper.len(), 1, "{wrapper:?}");
    launch.signal(Signal::SIGKILL);
    let killed = Instant::now();
    // The drop-in gets its parent-death signal, forwards it to the deaf
    // server, and kills it once the launch's grace has passed.
    wait_for(
        "the server and its wrapper gone",
        Duration::from_secs(grace + 10),
        || !alive(server) && !alive(wrapper[0]),
    );
    assert!(
        killed.elapsed() >= Duration::from_secs(grace) - Duration::from_millis(500),
        "killed after {:?}, before the grace of {grace} s",
        killed.elapsed()
    );
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "still running: {left:?}");
}

#[test]
fn a_hangup_stops_the_real_server_and_leaves_nothing_running() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut launch = ready_launch(dir);
    launch.signal(Signal::SIGHUP);
    let status = launch
        .wait_timeout(Duration::from_secs(60))
        .expect("the launch stops on SIGHUP");
    let log = launch.output();
    assert!(status.success(), "{status}\n{log}");
    assert!(
        log.contains("SIGHUP received: stopping the LMCache server"),
        "{log}"
    );
    assert!(log.contains("LMCache server stopped cleanly"), "{log}");
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
    assert!(lock_free(&dir.join("cache/.lmcache-tier.lock")));
}

#[test]
fn a_launch_whose_output_pipe_is_closed_starts_and_stops_cleanly() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let http_port = free_port();
    let mut cmd = BINS.launch_command(dir, free_port(), http_port, &[]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut launch = cmd.spawn().unwrap();
    // The reader goes away at once, as `| head -c 100` does after 100 bytes.
    drop(launch.stdout.take());
    drop(launch.stderr.take());
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for("the server's /status", Duration::from_secs(180), || {
        assert!(launch.try_wait().unwrap().is_none(), "the launch ended");
        get_json(&url).is_some()
    });
    let pid = Pid::from_raw(launch.id() as i32);
    nix::sys::signal::kill(pid, Signal::SIGTERM).unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = launch.try_wait().unwrap() {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "{status}: a panic is 101, a SIGKILLed stop not 0"
    );
    let left = processes_mentioning(&dir.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
}

fn object_name(i: u32) -> String {
    format!("test-model@0x01000100@0@{i:064x}.data")
}

fn fill(dir: &Path, objects: u32) {
    fs::create_dir_all(dir).unwrap();
    for i in 0..objects {
        fs::write(dir.join(object_name(i)), vec![7u8; 1 << 20]).unwrap();
    }
}

fn objects_in(dir: &Path) -> usize {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().as_bytes().ends_with(b".data"))
                .count()
        })
        .unwrap_or(0)
}

fn guarded_spec(dir: &Path) -> String {
    format!(
        r#"{{"type":"fs","base_path":"{}","max_capacity_gb":0.01}}"#,
        dir.display()
    )
}

/// `erebine-lmcache <args>` through `sh`, with the venv active and the
/// shell redirections `redirect` (e.g. `>&- 2>&-`) applied to it.
fn erebine(args: &[OsString], redirect: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("exec \"$0\" \"$@\" {redirect}"))
        .arg(BINS.erebine_lmcache())
        .args(args)
        .env("VIRTUAL_ENV", lmcache_venv());
    cmd
}

#[test]
fn a_guard_whose_stderr_is_closed_still_bounds_its_tier() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let tier = tmp.path().join("tier");
    fill(&tier, 30);
    let http_port = free_port();
    let args: Vec<OsString> = [
        "server".to_string(),
        "--l1-size-gb".into(),
        "1".into(),
        "--eviction-policy".into(),
        "LRU".into(),
        "--port".into(),
        free_port().to_string(),
        "--http-port".into(),
        http_port.to_string(),
        "--l2-adapter".into(),
        guarded_spec(&tier),
    ]
    .into_iter()
    .map(OsString::from)
    .collect();
    let mut server = Proc::spawn(erebine(&args, ">&- 2>&-"), &tmp.path().join("out.log"));
    let url = format!("http://127.0.0.1:{http_port}/status");
    wait_for_status(&url, &mut server, Duration::from_secs(180));
    // 0.01 GiB is 10.7 MB: the guard trims to its watermark below that,
    // and writes its status file (after the trim: wait for both).
    let status_file = tier.join(".lmcache-tier-guard.json");
    wait_for(
        "the guard's trim and status",
        Duration::from_secs(60),
        || objects_in(&tier) <= 10 && status_file.is_file(),
    );
    let state: serde_json::Value =
        serde_json::from_slice(&fs::read(&status_file).unwrap()).expect("the status is JSON");
    assert!(state.is_object(), "{state}");
    server.signal(Signal::SIGTERM);
    server
        .wait_timeout(Duration::from_secs(60))
        .expect("the server stops on SIGTERM");
    let left = processes_mentioning(&tier.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
}

#[test]
fn help_and_rejected_command_lines_touch_nothing_on_disk() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let tier = tmp.path().join("tier");
    fill(&tier, 30);
    let missing = tmp.path().join("missing");
    for (extra, code) in [
        (&["--help"][..], 0),
        (&["-h"], 0),
        (&["--eviction-policy", "-x"], 2),
        (&["--no-such-flag"], 2),
        (&["--l1-size-gb", "lots"], 2),
    ] {
        for dir in [&tier, &missing] {
            let mut args: Vec<OsString> = vec!["server".into(), "--l2-adapter".into()];
            args.push(guarded_spec(dir).into());
            args.extend(extra.iter().map(OsString::from));
            let out = erebine(&args, "").output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(code), "{extra:?}: {err}");
        }
        assert_eq!(objects_in(&tier), 30, "{extra:?}: objects were deleted");
        assert!(!tier.join(".lmcache-tier-guard.json").exists(), "{extra:?}");
        assert!(!missing.exists(), "{extra:?}: a missing tier was created");
    }
}

#[test]
fn server_arguments_reach_lmcache_byte_for_byte_and_signals_are_forwarded() {
    lmcache_tier_e2e::require_lmcache!();
    let tmp = tempfile::tempdir().unwrap();
    let mut logs = tmp.path().join("lookup").into_os_string().into_vec();
    logs.extend_from_slice(b"-nu\xff");
    let logs = OsString::from_vec(logs);
    let args: Vec<OsString> = vec![
        "server".into(),
        "--l1-size-gb".into(),
        "1".into(),
        "--eviction-policy".into(),
        "LRU".into(),
        "--port".into(),
        free_port().to_string().into(),
        "--http-port".into(),
        free_port().to_string().into(),
        "--lookup-hash-log-dir".into(),
        logs.clone(),
    ];
    let mut server = Proc::spawn(erebine(&args, ""), &tmp.path().join("out.log"));
    let mut cmdline = Vec::new();
    wait_for("the server's process", Duration::from_secs(30), || {
        let children = lmcache_tier_e2e::children_of(server.pid());
        cmdline = children
            .iter()
            .filter_map(|pid| fs::read(format!("/proc/{pid}/cmdline")).ok())
            .find(|c| !c.is_empty())
            .unwrap_or_default();
        !cmdline.is_empty()
    });
    // As a drop-in, it forwards what the stock command would have received:
    // Python's default action for SIGUSR1 ends the server, and the wrapper
    // reports it the shell's way.
    let child = lmcache_tier_e2e::children_of(server.pid());
    server.signal(Signal::SIGUSR1);
    let status = server
        .wait_timeout(Duration::from_secs(60))
        .expect("the server ends on SIGUSR1");
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGUSR1),
        "{}",
        server.output()
    );
    assert!(
        child.iter().all(|pid| !alive(*pid)),
        "{child:?} outlived it"
    );
    let argv: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    assert!(
        argv.windows(2)
            .any(|w| w[0] == b"--lookup-hash-log-dir" && w[1] == logs.as_bytes()),
        "{:?}",
        String::from_utf8_lossy(&cmdline)
    );
}

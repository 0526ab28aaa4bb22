//! End to end: the node's image under podman (`docs/image.md`), built once
//! by `scripts/build-image.sh` from `deploy/image/Containerfile` with the
//! binaries Cargo built and the real LMCache 0.5.6, run as the node runs
//! it: catatonit as PID 1 and `lmcache-tier launch` under it, the host's
//! network (every server on 127.0.0.1), the cache directory on the
//! container's writable layer, a named volume, or a disk of its own.
//!
//! Covered: stops by `podman stop` and by SIGINT and SIGHUP end the server
//! cleanly (exit 0, before podman's 10 s SIGKILL), an orphan is reaped,
//! `podman kill -s KILL` leaves no process on the host, and the health
//! check follows `inspect`; the plan reads the container's memory limit
//! and sizes the tier from where it lives; the cache survives a restart
//! and a new image, and another model purges it; a read-only root, a
//! volume owned by another uid and `--user` behave as the docs say; the
//! compose file brings the node up and down.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lmcache_tier_e2e::podman::{unique_name, Container, Podman, Ports, Volume};
use lmcache_tier_e2e::{get_json, require_lmcache, require_podman};

/// The cache directory in the image.
const CACHE_DIR: &str = "/var/lib/inference/.cache/erebine/lmcache";
/// How long a container's server may take to answer on a loaded 2-core
/// machine (a start takes about 5 s alone).
const READY: Duration = Duration::from_secs(300);
/// How long a stop may take before the test gives up (podman's own
/// SIGKILL comes after 10 s, and shows as exit code 137).
const STOPPED: Duration = Duration::from_secs(60);

/// The launch's flags of every container here.
const MODEL: [&str; 2] = ["--model", "test-model"];

/// The command lines of this host's processes that contain `needle`.
fn host_processes_with(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.contains(needle) {
            found.push(line);
        }
    }
    found
}

/// `needle`'s lines in `text`, for counting what a log said.
fn count(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn as_pid_1_every_stop_is_clean_an_orphan_is_reaped_and_a_kill_leaves_nothing() {
    require_lmcache!();
    require_podman!();
    let podman = Podman::from_env();
    let volume = Volume::new(&podman);
    let c = Container::run(&podman, &podman.image, &volume.mount(CACHE_DIR), &MODEL);
    c.wait_ready(READY);

    // catatonit is PID 1 and the launch its child; an orphan it adopts is
    // reaped when it exits.
    let ps = || {
        String::from_utf8_lossy(&c.exec(&["ps", "-eo", "pid,ppid,stat,comm"]).stdout).into_owned()
    };
    let table = ps();
    // The state without its priority marks (`N`: a nice value above 0, as
    // scripts/test.sh gives most test jobs; `<`: below 0), which podman
    // passes on from the host.
    let unprioritised = |stat: &str| stat.replace(['N', '<'], "");
    assert!(
        table.lines().any(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.len() == 4
                && [fields[0], fields[1], fields[3]] == ["1", "0", "catatonit"]
                && unprioritised(fields[2]) == "Ss"
        }),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("lmcache-tier") && l.split_whitespace().nth(1) == Some("1")),
        "{table}"
    );
    let orphan = c.exec(&["sh", "-c", "(sleep 1 &); exit 0"]);
    assert!(orphan.status.success(), "{orphan:?}");
    std::thread::sleep(Duration::from_secs(3));
    let table = ps();
    assert!(
        !table.lines().any(|l| l
            .split_whitespace()
            .nth(2)
            .is_some_and(|s| s.starts_with('Z'))),
        "a zombie was left:\n{table}"
    );

    // The image's health check runs `lmcache-tier inspect`.
    let health = podman.run(&["healthcheck", "run", &c.name]);
    assert!(health.status.success(), "{health:?}");

    podman.ok(&["stop", &c.name]);
    assert_eq!(c.wait_exited(STOPPED), 0, "{}", c.logs());
    let log = c.logs();
    assert_eq!(
        count(&log, "SIGTERM received: stopping the LMCache server"),
        1,
        "{log}"
    );
    assert_eq!(count(&log, "LMCache server stopped cleanly"), 1, "{log}");

    for (n, signal) in ["INT", "HUP"].iter().enumerate() {
        podman.ok(&["start", &c.name]);
        c.wait_ready(READY);
        podman.ok(&["kill", "--signal", signal, &c.name]);
        assert_eq!(c.wait_exited(STOPPED), 0, "SIG{signal}:\n{}", c.logs());
        let log = c.logs();
        assert_eq!(
            count(&log, &format!("SIG{signal} received: stopping")),
            1,
            "{log}"
        );
        assert_eq!(
            count(&log, "LMCache server stopped cleanly"),
            n + 2,
            "{log}"
        );
    }

    // SIGKILL ends the container's PID 1, and with it every process of
    // its PID namespace: nothing of the server is left on the host, and
    // the next start finds the tier's lock free.
    podman.ok(&["start", &c.name]);
    c.wait_ready(READY);
    let server = format!("--port {} ", c.ports.mp);
    assert!(
        !host_processes_with(&server).is_empty(),
        "no server seen on the host"
    );
    podman.ok(&["kill", "--signal", "KILL", &c.name]);
    assert_eq!(c.wait_exited(STOPPED), 137);
    let started = Instant::now();
    while !host_processes_with(&server).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "left on the host after SIGKILL: {:?}",
            host_processes_with(&server)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    podman.ok(&["start", &c.name]);
    c.wait_ready(READY);
    podman.ok(&["stop", &c.name]);
    assert_eq!(c.wait_exited(STOPPED), 0, "{}", c.logs());
}

/// `lmcache-tier launch --dry-run --json` in a container of the image with
/// `options`: the plan as JSON.
fn dry_run(podman: &Podman, options: &[String]) -> serde_json::Value {
    let ports = Ports::free();
    let out = podman
        .command()
        .args(["run", "--rm", "--network", "host"])
        .args(ports.env_args())
        .args(options)
        .arg(&podman.image)
        .args(MODEL)
        .args(["--dry-run", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// A loop-mounted ext4 of `bytes` at `dir/disk`, owned by the image's user
/// (uid 1000): a disk of its own. Unmounted when dropped.
struct Disk {
    dir: std::path::PathBuf,
}

impl Disk {
    fn new(dir: &Path, bytes: u64) -> Disk {
        let image = dir.join("disk.img");
        let mount = dir.join("disk");
        std::fs::create_dir_all(&mount).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        let run = |cmd: &mut Command| {
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{cmd:?}: {out:?} (needs root)");
        };
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0"])
            .arg(&image));
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount));
        run(Command::new("chown").arg("1000:1000").arg(&mount));
        Disk { dir: mount }
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn the_plan_reads_the_containers_memory_limit_and_sizes_the_tier_where_it_lives() {
    require_lmcache!();
    require_podman!();
    let podman = Podman::from_env();
    let tmp = tempfile::tempdir().unwrap();

    // The writable layer (overlay), in a container limited to 8 GiB and
    // 2 CPUs: L1 from the limit, whose file the plan names; the tier from
    // the filesystem under the layer, with the warning.
    let limited: Vec<String> = ["--memory", "8g", "--cpus", "2"].map(String::from).to_vec();
    let plan = dry_run(&podman, &limited);
    let decisions = &plan["decisions"];
    let said = decisions.to_string();
    assert!(
        said.contains("cgroup memory limit 8.00 GiB in /sys/fs/cgroup/"),
        "{decisions:#}"
    );
    assert_eq!(decisions["l1_budget"]["value"], 4u64 << 30, "{decisions:#}");
    assert_eq!(
        decisions["disk"]["volume_kind"]["rule"], "overlay",
        "{decisions:#}"
    );
    let warnings = decisions["warnings"].to_string();
    assert!(
        warnings.contains("its objects are lost with the container"),
        "{warnings}"
    );

    // A named volume: a directory of the host's filesystem, shared.
    let volume = Volume::new(&podman);
    let plan = dry_run(&podman, &volume.mount(CACHE_DIR));
    let disk = &plan["decisions"]["disk"];
    assert_eq!(disk["volume_kind"]["rule"], "local", "{disk:#}");
    assert_ne!(
        disk["capacity"]["rule"], "derived-75pct-own-volume",
        "{disk:#}"
    );
    assert!(!plan["decisions"]["warnings"]
        .to_string()
        .contains("lost with the container"));

    // A disk of its own, bind-mounted from where the host mounted it.
    let disk = Disk::new(tmp.path(), 4 << 30);
    let bind = [
        "-v".to_string(),
        format!("{}:{CACHE_DIR}", disk.dir.display()),
    ];
    let plan = dry_run(&podman, &bind);
    let capacity = &plan["decisions"]["disk"]["capacity"];
    assert_eq!(capacity["rule"], "derived-75pct-own-volume", "{capacity:#}");
    let total = plan["decisions"]["disk"]["volume"]["total_bytes"]
        .as_u64()
        .unwrap();
    let bytes = capacity["value"].as_u64().unwrap();
    assert_eq!(bytes, (total * 3 / 4) >> 20 << 20, "{capacity:#}");
}

#[test]
fn restarts_and_a_new_image_keep_the_cache_and_another_model_purges_it() {
    require_lmcache!();
    require_podman!();
    let podman = Podman::from_env();
    let volume = Volume::new(&podman);
    let mut options = volume.mount(CACHE_DIR).to_vec();
    options.extend(["--shm-size".to_string(), "256m".to_string()]);

    let first = Container::run(&podman, &podman.image, &options, &MODEL);
    first.wait_ready(READY);
    let stored = first.bench(0, 4);
    assert!(stored.status.success(), "bench: {}", stored.output);
    assert_eq!(stored.full_cold_hits(), 0, "{}", stored.output);

    // A restart empties L1: every prefix comes back from the disk tier.
    podman.ok(&["restart", &first.name]);
    first.wait_ready(READY);
    let again = first.bench(0, 4);
    assert!(again.status.success(), "bench: {}", again.output);
    assert_eq!(again.full_cold_hits(), 4, "{}", again.output);
    drop(first);

    // A new container from a rebuilt image (a new version label) on the
    // same volume, built in docker format as the image is: podman's OCI
    // format drops the HEALTHCHECK.
    let next = format!("localhost/lmcache-tier:{}", unique_name("next"));
    let mut build = podman
        .command()
        .args([
            "build", "--format", "docker", "--tag", &next, "-f", "-", ".",
        ])
        .current_dir(std::env::temp_dir())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let containerfile = format!(
            "FROM {}\nLABEL org.opencontainers.image.version=\"{next}\"\n",
            podman.image
        );
        build
            .stdin
            .take()
            .unwrap()
            .write_all(containerfile.as_bytes())
            .unwrap();
    }
    assert!(build.wait().unwrap().success(), "podman build of {next}");
    let upgraded = Container::run(&podman, &next, &options, &MODEL);
    upgraded.wait_ready(READY);
    let health = podman.run(&["healthcheck", "run", &upgraded.name]);
    assert!(
        health.status.success(),
        "the rebuilt image's health check: {health:?}"
    );
    assert_eq!(
        upgraded.inspect("{{index .Config.Labels \"org.opencontainers.image.version\"}}"),
        next
    );
    let after = upgraded.bench(0, 4);
    assert!(after.status.success(), "bench: {}", after.output);
    assert_eq!(after.full_cold_hits(), 4, "{}", after.output);
    drop(upgraded);

    // Another model: its launch purges the tier, loudly.
    let other = Container::run(&podman, &next, &options, &["--model", "other-model"]);
    other.wait_ready(READY);
    let log = other.logs();
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("purged 100% of the tier")),
        "{log}"
    );
    drop(other);
    let _ = podman.run(&["rmi", "--force", &next]);
}

#[test]
fn a_read_only_root_another_owner_and_another_user() {
    require_lmcache!();
    require_podman!();
    let podman = Podman::from_env();
    let tmp = tempfile::tempdir().unwrap();

    // A read-only root with a volume: podman's tmpfs on /tmp holds what
    // numba compiles; the rest is on the volume.
    let volume = Volume::new(&podman);
    let mut options = volume.mount(CACHE_DIR).to_vec();
    options.push("--read-only".into());
    let c = Container::run(&podman, &podman.image, &options, &MODEL);
    c.wait_ready(READY);
    podman.ok(&["stop", &c.name]);
    assert_eq!(c.wait_exited(STOPPED), 0, "{}", c.logs());
    drop(c);

    // A volume owned by another uid, mode 0700: exit 2 naming the owner
    // and this uid; nothing created there.
    use std::os::unix::fs::PermissionsExt;
    let foreign = tmp.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o700)).unwrap();
    nix::unistd::chown(&foreign, Some(4242.into()), Some(4242.into())).unwrap();
    let bind = [
        "-v".to_string(),
        format!("{}:{CACHE_DIR}", foreign.display()),
    ];
    let c = Container::run(&podman, &podman.image, &bind, &MODEL);
    assert_eq!(c.wait_exited(STOPPED), 2, "{}", c.logs());
    let log = c.logs();
    assert!(
        log.contains(
            "is owned by uid 4242 gid 4242 with mode 0700; this process runs as uid 1000 gid 1000"
        ),
        "{log}"
    );
    assert_eq!(std::fs::read_dir(&foreign).unwrap().count(), 0);
    drop(c);

    // Another user than the image's, with a volume of its own: it runs,
    // and what it writes is that user's.
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    nix::unistd::chown(&mine, Some(2000.into()), Some(2000.into())).unwrap();
    let options = [
        "-v".to_string(),
        format!("{}:{CACHE_DIR}", mine.display()),
        "--user".into(),
        "2000:2000".into(),
    ];
    let c = Container::run(&podman, &podman.image, &options, &MODEL);
    c.wait_ready(READY);
    podman.ok(&["stop", &c.name]);
    assert_eq!(c.wait_exited(STOPPED), 0, "{}", c.logs());
    use std::os::unix::fs::MetadataExt;
    let lock = std::fs::metadata(mine.join(".lmcache-tier.lock")).unwrap();
    assert_eq!((lock.uid(), lock.gid()), (2000, 2000));
}

#[test]
fn the_compose_file_brings_the_node_up_and_down() {
    require_lmcache!();
    require_podman!();
    let podman = Podman::from_env();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/image/compose.yaml");
    let project = unique_name("compose");
    let ports = Ports::free();
    let compose = |args: &[&str]| {
        let out = podman
            .compose()
            .args(["--project-name", &project, "--file"])
            .arg(&file)
            .args(args)
            .env("LMCACHE_TIER_IMAGE", &podman.image)
            .env("VLLM_MODEL", "test-model")
            .env("EREBINE_AGENT_LMCACHE_MP_PORT", ports.mp.to_string())
            .env("EREBINE_AGENT_LMCACHE_HTTP_PORT", ports.http.to_string())
            .env(
                "EREBINE_AGENT_LMCACHE_METRICS_PORT",
                ports.metrics.to_string(),
            )
            .env("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "podman-compose {args:?}: {out:?}");
    };
    compose(&["up", "--detach"]);
    let name = format!("{project}_lmcache_1");
    let started = Instant::now();
    while get_json(&ports.status_url()).is_none() {
        assert!(
            started.elapsed() < READY,
            "{}",
            String::from_utf8_lossy(&podman.run(&["logs", &name]).stderr)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let mounts = podman.ok(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Name}} {{.Destination}}{{end}}",
        &name,
    ]);
    assert_eq!(mounts.trim(), format!("{project}_lmcache {CACHE_DIR}"));
    compose(&["stop"]);
    let code = podman.ok(&["inspect", "--format", "{{.State.ExitCode}}", &name]);
    assert_eq!(code.trim(), "0");
    compose(&["down", "--volumes"]);
    assert!(!podman.run(&["container", "exists", &name]).status.success());
}

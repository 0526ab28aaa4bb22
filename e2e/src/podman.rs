//! The node's image under a real container engine: the image
//! `scripts/build-image.sh` built (`$EREBINE_TEST_IMAGE`), run by podman
//! with the configuration `scripts/setup-podman.sh` wrote
//! (`$EREBINE_TEST_PODMAN`: `containers.conf` and `bin/podman-compose`).
//! Containers use the host's network only (their servers bind 127.0.0.1),
//! get free loopback ports, and are removed when their handle drops, as
//! are the volumes a test names.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::{bench_args, free_port, get_json, BenchOptions, BenchRun, REGISTER_TIMED_OUT};

/// Why the image's tests cannot run here, naming what to run; `None` when
/// they can.
pub fn podman_missing() -> Option<String> {
    let Some(dir) = std::env::var_os("EREBINE_TEST_PODMAN") else {
        return Some(
            "EREBINE_TEST_PODMAN is not set: run scripts/test.sh, or set it to what scripts/setup-podman.sh prints".into(),
        );
    };
    let conf = Path::new(&dir).join("containers.conf");
    if !conf.is_file() {
        return Some(format!(
            "no {}: run scripts/setup-podman.sh",
            conf.display()
        ));
    }
    if std::env::var_os("EREBINE_TEST_IMAGE").is_none() {
        return Some(
            "EREBINE_TEST_IMAGE is not set: run scripts/test.sh, or set it to what scripts/build-image.sh prints".into(),
        );
    }
    None
}

/// The first statement of a test of the image, after
/// [`crate::require_lmcache!`]: without podman or the image
/// ([`podman_missing`]) the test writes `skipped (<module>): <why>` and
/// returns.
#[macro_export]
macro_rules! require_podman {
    () => {
        if let Some(why) = $crate::podman::podman_missing() {
            $crate::say_skipped(::core::module_path!(), &why);
            return;
        }
    };
}

/// podman as the tests run it, and the image under test.
pub struct Podman {
    dir: PathBuf,
    /// The image's name (`localhost/lmcache-tier:<version>`).
    pub image: String,
}

impl Podman {
    /// From `$EREBINE_TEST_PODMAN` and `$EREBINE_TEST_IMAGE`; panics
    /// without them ([`podman_missing`] first).
    pub fn from_env() -> Podman {
        if let Some(why) = podman_missing() {
            panic!("{why}");
        }
        Podman {
            dir: std::env::var_os("EREBINE_TEST_PODMAN").unwrap().into(),
            image: std::env::var("EREBINE_TEST_IMAGE").unwrap(),
        }
    }

    /// `podman` with the tests' `CONTAINERS_CONF`.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", self.dir.join("containers.conf"));
        cmd
    }

    /// `podman-compose` (1.2.0) with the tests' `CONTAINERS_CONF`.
    pub fn compose(&self) -> Command {
        let mut cmd = Command::new(self.dir.join("bin/podman-compose"));
        cmd.env("CONTAINERS_CONF", self.dir.join("containers.conf"));
        cmd
    }

    /// Runs `podman <args>` and returns what it did.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
    }

    /// Runs `podman <args>`, panics unless it succeeds, and returns its
    /// stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// A name no other container or volume of this run has.
pub fn unique_name(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    format!("e2e-{what}-{}-{n}", std::process::id())
}

/// The loopback ports of one container's launch.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    /// ZMQ (`EREBINE_AGENT_LMCACHE_MP_PORT`).
    pub mp: u16,
    /// HTTP (`EREBINE_AGENT_LMCACHE_HTTP_PORT`).
    pub http: u16,
    /// The launch's metrics (`EREBINE_AGENT_LMCACHE_METRICS_PORT`).
    pub metrics: u16,
}

impl Ports {
    /// Three free loopback ports.
    pub fn free() -> Ports {
        Ports {
            mp: free_port(),
            http: free_port(),
            metrics: free_port(),
        }
    }

    /// The `-e` options that give them to the launch.
    pub fn env_args(&self) -> Vec<String> {
        [
            ("EREBINE_AGENT_LMCACHE_MP_PORT", self.mp),
            ("EREBINE_AGENT_LMCACHE_HTTP_PORT", self.http),
            ("EREBINE_AGENT_LMCACHE_METRICS_PORT", self.metrics),
        ]
        .iter()
        .flat_map(|(k, v)| ["-e".to_string(), format!("{k}={v}")])
        .collect()
    }

    /// The server's `/status` URL.
    pub fn status_url(&self) -> String {
        format!("http://127.0.0.1:{}/status", self.http)
    }
}

/// A container of the image, removed (with SIGKILL) when dropped.
pub struct Container<'a> {
    podman: &'a Podman,
    /// Its name.
    pub name: String,
    /// Its launch's ports.
    pub ports: Ports,
}

impl<'a> Container<'a> {
    /// `podman run -d --network host` of `image` with `options` before the
    /// image and `args` after it (the launch's flags), a 1 GiB L1 and free
    /// ports; panics when podman refuses.
    pub fn run(
        podman: &'a Podman,
        image: &str,
        options: &[String],
        args: &[&str],
    ) -> Container<'a> {
        let name = unique_name("c");
        let ports = Ports::free();
        let mut cmd = podman.command();
        cmd.args(["run", "-d", "--name", &name, "--network", "host"])
            .args(["-e", "EREBINE_AGENT_KV_OFFLOAD_SIZE_GB=1"])
            .args(ports.env_args())
            .args(options)
            .arg(image)
            .args(args);
        let out = cmd.output().expect("podman run");
        let container = Container {
            podman,
            name,
            ports,
        };
        assert!(
            out.status.success(),
            "podman run: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        container
    }

    /// Its log: the launch's stdout and stderr.
    pub fn logs(&self) -> String {
        let out = self.podman.run(&["logs", &self.name]);
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// `podman inspect` of one field (a Go template such as
    /// `{{.State.ExitCode}}`).
    pub fn inspect(&self, template: &str) -> String {
        self.podman
            .ok(&["inspect", "--format", template, &self.name])
            .trim()
            .to_string()
    }

    /// Whether it is running.
    pub fn running(&self) -> bool {
        self.inspect("{{.State.Running}}") == "true"
    }

    /// Waits until its server answers `/status` (at most `limit`); panics
    /// with its log when it exits first or the time runs out.
    pub fn wait_ready(&self, limit: Duration) {
        let started = Instant::now();
        loop {
            if get_json(&self.ports.status_url()).is_some() {
                return;
            }
            assert!(
                self.running(),
                "{} exited before its server answered:\n{}",
                self.name,
                self.logs()
            );
            assert!(
                started.elapsed() < limit,
                "{}: no answer on {} within {limit:?}:\n{}",
                self.name,
                self.ports.status_url(),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Waits until it has exited (at most `limit`) and returns its exit
    /// code; panics with its log when it is still running.
    pub fn wait_exited(&self, limit: Duration) -> i64 {
        let started = Instant::now();
        while self.running() {
            assert!(
                started.elapsed() < limit,
                "{} still running after {limit:?}:\n{}",
                self.name,
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.inspect("{{.State.ExitCode}}")
            .parse()
            .expect("an exit code")
    }

    /// `podman exec` of `args` in it.
    pub fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["exec", self.name.as_str()];
        full.extend_from_slice(args);
        self.podman.run(&full)
    }

    /// LMCache's CPU bench inside the container, against its server, for
    /// sequences `start..end` of 1024 tokens with a one-layer KV shape (a
    /// 4 MiB object each): the bench's KV cache lives in `/dev/shm`, so the
    /// container needs `--shm-size` of at least 128 MiB. Started again, up
    /// to twice, when its fixed 10 s registration timed out on a loaded
    /// machine, as on the host.
    pub fn bench(&self, start: u32, end: u32) -> BenchRun {
        let options = BenchOptions {
            interval: "0.1",
            kvcache_shape_spec: Some("(2,1024,16,8,128):float16:1"),
            model: None,
        };
        let bench = bench_args(self.ports.mp, self.ports.http, start, end, &options);
        let mut args = vec![
            "exec",
            "-e",
            "LMCACHE_DISABLE_BANNER=1",
            &self.name,
            "lmcache",
        ];
        args.extend(bench.iter().map(String::as_str));
        let mut tries = 1;
        loop {
            let out = self.podman.run(&args);
            let output = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            let timed_out = output.contains(REGISTER_TIMED_OUT);
            if out.status.success() || !timed_out || tries == 3 {
                return BenchRun {
                    status: out.status,
                    output,
                    most_tracked: 0,
                };
            }
            tries += 1;
        }
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .podman
            .run(&["rm", "--force", "--time", "0", &self.name]);
    }
}

/// A named podman volume, removed when dropped.
pub struct Volume<'a> {
    podman: &'a Podman,
    /// Its name.
    pub name: String,
}

impl<'a> Volume<'a> {
    /// A new name for a volume podman makes at its first mount.
    pub fn new(podman: &'a Podman) -> Volume<'a> {
        Volume {
            podman,
            name: unique_name("v"),
        }
    }

    /// The `-v` option that mounts it at `target`.
    pub fn mount(&self, target: &str) -> [String; 2] {
        ["-v".into(), format!("{}:{target}", self.name)]
    }
}

impl Drop for Volume<'_> {
    fn drop(&mut self) {
        let _ = self.podman.run(&["volume", "rm", "--force", &self.name]);
    }
}

//! A Redis of the test's own: Debian's `redis-server` on 127.0.0.1 with a
//! configuration file the test writes (so its password is on no command
//! line), no persistence, killed when dropped; and `redis-cli` to look at
//! it from outside the node.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Proc;

/// The `redis-server` the tests run: `EREBINE_TEST_REDIS` (set by
/// `scripts/test.sh` from `scripts/setup-redis.sh`), else Debian's.
pub fn redis_server_path() -> PathBuf {
    std::env::var_os("EREBINE_TEST_REDIS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"))
}

/// Why the Redis tests cannot run here, in one line naming where it was
/// looked for and what to run; `None` when they can.
pub fn redis_missing() -> Option<String> {
    let bin = redis_server_path();
    (!bin.is_file()).then(|| {
        format!(
            "no redis-server at {}: run scripts/test.sh (scripts/setup-redis.sh installs Debian's redis-server), or set EREBINE_TEST_REDIS",
            bin.display()
        )
    })
}

/// The first statement of a test that may skip without Redis
/// ([`redis_missing`]): it writes `skipped (<module>): <why>` and returns.
#[macro_export]
macro_rules! require_redis {
    () => {
        if let Some(why) = $crate::redis::redis_missing() {
            $crate::say_skipped(::core::module_path!(), &why);
            return;
        }
    };
}

/// How a test's Redis is configured.
#[derive(Debug, Clone, Copy)]
pub struct RedisOptions<'a> {
    /// `requirepass`; `None` for none.
    pub password: Option<&'a str>,
    /// `maxmemory`, as Redis reads it (`0`, `64mb`).
    pub maxmemory: &'a str,
    /// `maxmemory-policy`.
    pub policy: &'a str,
    /// More lines of `redis.conf`, e.g. `rename-command INFO ""`.
    pub extra: &'a str,
}

impl Default for RedisOptions<'_> {
    fn default() -> Self {
        RedisOptions {
            password: None,
            maxmemory: "256mb",
            policy: "allkeys-lru",
            extra: "",
        }
    }
}

/// A running `redis-server`.
pub struct Redis {
    proc: Proc,
    /// Its port on 127.0.0.1.
    pub port: u16,
    password: Option<String>,
    config: PathBuf,
    log: PathBuf,
}

impl Redis {
    /// Starts Redis on 127.0.0.1:`port` with `options`, its files under
    /// `dir`, and waits until it answers `PING` (at most 30 s).
    pub fn start(dir: &Path, port: u16, options: RedisOptions<'_>) -> Redis {
        let config = dir.join(format!("redis-{port}.conf"));
        let mut text = format!(
            "bind 127.0.0.1\nport {port}\nsave \"\"\nappendonly no\ndir {}\nmaxmemory {}\nmaxmemory-policy {}\n",
            dir.display(),
            options.maxmemory,
            options.policy
        );
        if let Some(password) = options.password {
            text.push_str(&format!("requirepass {password}\n"));
        }
        text.push_str(options.extra);
        std::fs::write(&config, text).expect("redis config");
        let log = dir.join(format!("redis-{port}.log"));
        let redis = Redis {
            proc: Self::spawn(&config, &log),
            port,
            password: options.password.map(String::from),
            config,
            log,
        };
        redis.wait_for_pong();
        redis
    }

    fn spawn(config: &Path, log: &Path) -> Proc {
        let mut cmd = Command::new(redis_server_path());
        cmd.arg(config);
        Proc::spawn(cmd, log)
    }

    fn wait_for_pong(&self) {
        let start = Instant::now();
        while self.try_cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "redis-server did not answer PING within 30 s:\n{}",
                self.proc.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis-cli` with `args` against this Redis (its password given by
    /// `REDISCLI_AUTH`, never on the command line): what it printed, trimmed.
    /// Panics when it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed against port {}", self.port))
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let mut cmd = Command::new(redis_server_path().with_file_name("redis-cli"));
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args);
        if let Some(password) = &self.password {
            cmd.env("REDISCLI_AUTH", password);
        }
        let out = cmd.output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.starts_with("ERR") && !text.starts_with("NOAUTH"))
            .then_some(text)
    }

    /// `INFO`'s value of `field`, e.g. `used_memory`.
    pub fn info_field(&self, field: &str) -> Option<String> {
        let info = self.cli(&["INFO"]);
        info.lines()
            .find_map(|line| line.trim_end().strip_prefix(&format!("{field}:")))
            .map(String::from)
    }

    /// Keys matching `pattern`, by `SCAN`.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        let out = self.cli(&["--scan", "--pattern", pattern]);
        out.lines()
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect()
    }

    /// Kills it (its data is gone: no persistence) and starts it again
    /// on the same port and configuration.
    pub fn restart(&mut self) {
        self.proc.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.proc.wait_timeout(Duration::from_secs(10));
        let log = self.log.with_extension("restarted.log");
        self.proc = Self::spawn(&self.config, &log);
        self.wait_for_pong();
    }

    /// What it logged.
    pub fn output(&self) -> String {
        self.proc.output()
    }
}

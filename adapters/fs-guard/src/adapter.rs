//! The capacity guards behind the tier seam
//! ([`lmcache_tier_spec::adapter`]): the guarded tiers of one cascade
//! ([`crate::capacity::guard_specs`]) checked against their volumes, and
//! started either by a launch, from the scan it made of its disk tier, or
//! by `erebine-lmcache` once its server listens.
//!
//! A launch runs `erebine-lmcache server` as its server, so both take part:
//! the launch guards the tier it scanned and tells the server which, in
//! [`GUARDED_BY_LAUNCH`]; `erebine-lmcache` guards the rest, writing their
//! statuses for the launch's metrics ([`GUARD_OWNER`]).

use std::path::PathBuf;

use lmcache_tier_spec::adapter::{RunningTiers, StartContext, TierAdapter};

use crate::capacity::GuardSpec;
use crate::{Guard, GuardError, GuardOptions, PriorScan};

/// The variable a launch sets for the server's process with the tier
/// directories whose capacity guard the launch itself runs (a JSON array
/// of paths), so that `erebine-lmcache server` does not start a second one.
pub const GUARDED_BY_LAUNCH: &str = "EREBINE_LMCACHE_GUARDED_BY_LAUNCH";

/// The variable a launch sets for the server's process with the owner its
/// capacity guards write into their status files
/// ([`GuardOptions::owner`]), so that the guards `erebine-lmcache server`
/// runs for the launch are served as the launch's own.
pub const GUARD_OWNER: &str = "EREBINE_LMCACHE_GUARD_OWNER";

/// The value of [`GUARDED_BY_LAUNCH`] for the tier directories `dirs`: a
/// JSON array of their paths (as text: tier paths come from JSON specs);
/// `None` for no directory, which the variable's absence says.
pub fn guarded_by_launch_value(dirs: &[PathBuf]) -> Option<String> {
    let paths: Vec<String> = dirs
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    (!paths.is_empty()).then(|| serde_json::Value::from(paths).to_string())
}

/// The tier directories a [`GUARDED_BY_LAUNCH`] `value` lists; a value that
/// is not a JSON array of paths lists none (the server then guards every
/// tier itself, as without the variable).
pub fn guarded_by_launch(value: &str) -> Vec<PathBuf> {
    serde_json::from_str(value).unwrap_or_default()
}

/// A launch's scan of one tier, with the tier's `base_path`.
pub type ScannedTier = (PathBuf, PriorScan);

/// Who starts the guards.
#[derive(Debug)]
enum Starter {
    /// A launch: the tiers it scanned, by directory, start from that scan
    /// before the server; the others are left to the server's
    /// `erebine-lmcache`.
    Launch(Vec<ScannedTier>),
    /// `erebine-lmcache`: every tier but those the launch that started it
    /// guards itself ([`GUARDED_BY_LAUNCH`] in its environment), each
    /// counted by its guard, once the server listens.
    Server,
}

/// The capacity guards of one cascade's guarded tiers.
#[derive(Debug)]
pub struct GuardTiers {
    specs: Vec<GuardSpec>,
    starter: Starter,
}

impl GuardTiers {
    /// A launch's guards: every tier of `specs` is checked and its status
    /// served; those of `scans` (the launch's scans of its tiers, by
    /// `base_path`) are started from the scan before the server, and the
    /// others by the server's `erebine-lmcache`.
    pub fn of_launch(specs: Vec<GuardSpec>, scans: Vec<ScannedTier>) -> Self {
        Self {
            specs,
            starter: Starter::Launch(scans),
        }
    }

    /// `erebine-lmcache`'s guards: every tier of `specs` but those the
    /// launch that started it guards itself ([`GUARDED_BY_LAUNCH`] in its
    /// environment `env`; neither checked nor started here), started once
    /// the server listens (a command LMCache refuses touches nothing).
    pub fn of_server(specs: Vec<GuardSpec>, env: &dyn Fn(&str) -> Option<String>) -> Self {
        Self {
            specs: without_launch_guarded(specs, env),
            starter: Starter::Server,
        }
    }
}

impl TierAdapter for GuardTiers {
    type Error = GuardError;
    type Running = RunningGuards;

    /// Each tier's capacity against its volume ([`GuardSpec::check_volume`]).
    fn check(&self) -> Result<(), GuardError> {
        for spec in &self.specs {
            spec.check_volume()?;
        }
        Ok(())
    }

    /// A launch's guards start here from its scans; `erebine-lmcache`'s
    /// wait for [`RunningTiers::server_listens`].
    async fn start(self, context: &StartContext<'_>) -> Result<RunningGuards, GuardError> {
        let options = GuardOptions {
            owner: Some(context.owner.to_string()),
            ..GuardOptions::default()
        };
        let mut running = RunningGuards {
            specs: self.specs.clone(),
            options,
            guards: Vec::new(),
            by_launch: None,
            waiting: Vec::new(),
        };
        match self.starter {
            Starter::Launch(scans) => running.start_from_scans(scans)?,
            Starter::Server => running.waiting = self.specs,
        }
        Ok(running)
    }
}

/// `specs` without the tiers whose guard the launch that started this
/// server runs itself (from the launch's scan, so that a launch reads its
/// tier once): the directories [`GUARDED_BY_LAUNCH`] lists in `env`, each
/// said in a log line. A value that is not a JSON array of paths leaves
/// every tier here, as without the variable.
fn without_launch_guarded(
    specs: Vec<GuardSpec>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<GuardSpec> {
    let listed = env(GUARDED_BY_LAUNCH)
        .map(|v| guarded_by_launch(&v))
        .unwrap_or_default();
    let (launch, own): (Vec<GuardSpec>, Vec<GuardSpec>) = specs
        .into_iter()
        .partition(|spec| listed.contains(&spec.base_path));
    for spec in launch {
        tracing::info!(
            "capacity guard, L2 tier {} ({}): run by the launch that started this server",
            spec.position,
            spec.base_path.display()
        );
    }
    own
}

/// The guards of one cascade, started ([`GuardTiers`]).
#[derive(Debug)]
pub struct RunningGuards {
    /// Every guarded tier, for the metrics.
    specs: Vec<GuardSpec>,
    options: GuardOptions,
    /// Stopped (status written a last time) when dropped.
    guards: Vec<Guard>,
    /// A launch's: the directories it guards itself.
    by_launch: Option<Vec<PathBuf>>,
    /// The tiers that start once the server listens.
    waiting: Vec<GuardSpec>,
}

impl RunningGuards {
    /// Starts the guard of every tier a scan of `scans` is of.
    fn start_from_scans(&mut self, scans: Vec<ScannedTier>) -> Result<(), GuardError> {
        let mut started = Vec::new();
        for (path, prior) in scans {
            let Some(spec) = self.specs.iter().find(|s| s.base_path == path) else {
                continue;
            };
            let guard = Guard::start_from_scan(spec.clone(), self.options.clone(), prior)?;
            self.guards.push(guard);
            started.push(path);
        }
        self.by_launch = Some(started);
        Ok(())
    }
}

impl RunningTiers for RunningGuards {
    type View = Vec<GuardSpec>;
    type Error = GuardError;

    /// A launch's server learns which tiers the launch guards
    /// ([`GUARDED_BY_LAUNCH`]; one inherited would leave a tier unguarded)
    /// and whose metrics serve the rest ([`GUARD_OWNER`]); the server of
    /// `erebine-lmcache` gets neither.
    fn server_env(&self) -> Vec<(&'static str, Option<String>)> {
        let Some(by_launch) = &self.by_launch else {
            return vec![(GUARDED_BY_LAUNCH, None), (GUARD_OWNER, None)];
        };
        vec![
            (GUARDED_BY_LAUNCH, guarded_by_launch_value(by_launch)),
            (GUARD_OWNER, self.options.owner.clone()),
        ]
    }

    /// Starts the guards that waited for the server: each counts its
    /// directory and trims it to its watermark.
    ///
    /// # Errors
    /// The first tier whose directory cannot be opened for deleting or
    /// whose guard's thread cannot start.
    fn server_listens(&mut self) -> Result<(), GuardError> {
        for spec in std::mem::take(&mut self.waiting) {
            self.guards.push(Guard::start(spec, self.options.clone())?);
        }
        Ok(())
    }

    /// Every guarded tier's spec: the metrics read their status files.
    fn view(&self) -> Vec<GuardSpec> {
        self.specs.clone()
    }

    fn stop(self) {
        for guard in self.guards {
            guard.stop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lmcache_tier_spec::Cascade;

    fn guarded(dirs: &[&std::path::Path], gb: &str) -> Vec<GuardSpec> {
        let tiers: Vec<String> = dirs
            .iter()
            .map(|dir| format!(r#"{{"type":"fs","base_path":{dir:?},"max_capacity_gb":{gb}}}"#))
            .collect();
        let cascade = Cascade::parse(&format!("[{}]", tiers.join(",")), "test").unwrap();
        crate::capacity::guard_specs(&cascade).unwrap()
    }

    fn context() -> StartContext<'static> {
        StartContext {
            env: &|_| None,
            owner: "owner-1",
            node_dir: None,
        }
    }

    #[test]
    fn a_servers_guards_start_once_it_listens_and_clear_the_launchs_variables() {
        let root = tempfile::tempdir().unwrap();
        let dirs = [root.path().join("a"), root.path().join("b")];
        let status = |d: &PathBuf| d.join(crate::status::GUARD_STATUS_FILE_NAME);
        for dir in &dirs {
            std::fs::create_dir(dir).unwrap();
        }
        let tiers = GuardTiers::of_server(guarded(&[&dirs[0], &dirs[1]], "0.001"), &|_| None);
        tiers.check().unwrap();
        let mut running = block_on(tiers.start(&context())).unwrap();
        assert!(
            !dirs.iter().any(|d| status(d).exists()),
            "nothing written before the server listens"
        );
        assert_eq!(
            running.server_env(),
            [(GUARDED_BY_LAUNCH, None), (GUARD_OWNER, None)]
        );
        running.server_listens().unwrap();
        assert_eq!(running.view().len(), 2);
        running.stop();
        assert!(dirs.iter().all(|d| status(d).is_file()), "each guard ran");
    }

    #[test]
    fn a_server_leaves_the_tiers_its_launch_guards_to_it() {
        let root = tempfile::tempdir().unwrap();
        let dirs = [root.path().join("a"), root.path().join("b")];
        let specs = || guarded(&[&dirs[0], &dirs[1]], "0.001");
        let listed = guarded_by_launch_value(&dirs[1..]).unwrap();
        let env = move |name: &str| (name == GUARDED_BY_LAUNCH).then(|| listed.clone());
        let server = GuardTiers::of_server(specs(), &env);
        let running = block_on(server.start(&context())).unwrap();
        let left: Vec<PathBuf> = running.view().into_iter().map(|s| s.base_path).collect();
        assert_eq!(left, [dirs[0].clone()]);
        let garbled = |name: &str| (name == GUARDED_BY_LAUNCH).then(|| "/b".to_string());
        let server = GuardTiers::of_server(specs(), &garbled);
        let running = block_on(server.start(&context())).unwrap();
        assert_eq!(
            running.view().len(),
            2,
            "a garbled list guards every tier here"
        );
    }

    #[test]
    fn a_launch_without_a_scan_guards_no_tier_itself_and_names_its_owner() {
        let root = tempfile::tempdir().unwrap();
        let tiers = GuardTiers::of_launch(guarded(&[root.path()], "0.001"), Vec::new());
        let running = block_on(tiers.start(&context())).unwrap();
        assert_eq!(
            running.server_env(),
            [
                (GUARDED_BY_LAUNCH, None),
                (GUARD_OWNER, Some("owner-1".to_string()))
            ]
        );
    }

    #[test]
    fn the_launchs_list_reads_back_for_paths_of_every_shape() {
        let dirs: Vec<PathBuf> = ["/a", "/b c/\"q\"", "/d\\e", "/ünï/cödé", "/x/../y//z"]
            .map(PathBuf::from)
            .to_vec();
        let value = guarded_by_launch_value(&dirs).unwrap();
        assert_eq!(guarded_by_launch(&value), dirs);
        assert_eq!(guarded_by_launch_value(&[]), None);
        for garbled in ["/a", "", "[1]", "{\"a\":1}", "[\"/a\""] {
            assert!(guarded_by_launch(garbled).is_empty(), "{garbled}");
        }
    }

    #[test]
    fn a_capacity_larger_than_the_volume_is_refused_by_the_check() {
        let root = tempfile::tempdir().unwrap();
        let specs = guarded(&[root.path()], "1e9");
        let e = GuardTiers::of_server(specs, &|_| None).check().unwrap_err();
        assert!(e.to_string().contains("L2 tier 0"), "{e}");
    }

    /// The output of the guards' start, which never waits: one poll ends
    /// it (a start that waited would fail here, not hang).
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match std::pin::pin!(future).poll(&mut cx) {
            std::task::Poll::Ready(out) => out,
            std::task::Poll::Pending => panic!("the guards' start waited"),
        }
    }
}

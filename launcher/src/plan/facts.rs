//! The facts a launch is planned from, measured once: the host's memory
//! (with the cgroup limit) and physical cores, the server executable, and
//! for the node's built-in disk tier the cache directory's volume
//! (statvfs, filesystem type, read-only flag), the O_DIRECT test write and
//! one scan of the tier. Planning ([`crate::plan()`]) then reads only these
//! and the environment (`docs/design.md`, "One launch").
//!
//! [`Facts`] serialises both ways, so a recorded snapshot drives the golden
//! plans. The scan itself, and the tier's lock and watch taken before it,
//! travel beside the figures in a [`MeasuredTier`]: housekeeping plans from
//! that scan, and the capacity guard starts from it, so a launch reads the
//! tier directory once.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lmcache_housekeeping::{HousekeepingError, Mode};
use lmcache_sizing::disk_load::{probe_read, ReadProbe};
use lmcache_sizing::probe;
use lmcache_sizing::rules::{self, MemoryFacts, OdirectProbe, VolumeStats};
use lmcache_sizing::volume::{self, Filesystem, SizingError, VolumeKind};
use serde::{Deserialize, Serialize};

use crate::node::env::{self, KvCacheBackend, NodeEnv};
use crate::node::ports;
use crate::output::{self, ShowProgress};
use crate::plan::gpu::{self, GpuFacts};
use crate::plan::inputs::{
    DiskFacts, EngineFacts, HostFacts, MeasuredTier, PlanError, TierOdirect, TierScan,
};
use crate::plan::launch_plan::{self, check_engine, effective_chunk_size};
use crate::plan::lmcache_versions::{self, LmcacheRelease};
use crate::plan::weights::{self, Weights};
use crate::plan::{api_key, locate, raw_block, server_python};
use crate::Vars;

/// Whether measuring may create the cache directory and lock the tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskAccess {
    /// A real launch: create the cache and lookup-hash directories (mode
    /// 0700) if missing, lock the tier, watch it, then scan it.
    Create,
    /// Touch nothing but a probe file: `size` and `--dry-run`. A missing
    /// directory is measured on its nearest existing ancestor.
    Inspect,
}

/// Everything a plan is made from besides the environment and the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Facts {
    /// The host's RAM and the container's memory limit, in bytes.
    pub memory: MemoryFacts,
    /// Physical cores (hyper-threads counted once).
    pub physical_cores: u32,
    /// What starts the server (`EREBINE_AGENT_LMCACHE_PATH`, else
    /// `erebine-lmcache` beside this program, else on `PATH`); `None` when
    /// the backend is not `lmcache`.
    pub executable: Option<PathBuf>,
    /// The cache directory's volume; `None` when the node runs no built-in
    /// disk tier (another backend, or a custom cascade).
    pub disk: Option<DiskFacts>,
    /// The GPUs the server would see and whether LMCache's compiled
    /// extensions load in its environment ([`gpu::measure`]); `None` on a
    /// node without one, or when the stock `lmcache` cannot be found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuFacts>,
    /// What the engine's batched-token default is read from
    /// ([`gpu::engine_gpu`]); `None` on a node without a GPU, or when the
    /// engine's value is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_gpu: Option<lmcache_sizing::engine::EngineGpu>,
    /// The O_DIRECT test write in each `fs` or `fs_native` tier of a custom
    /// cascade whose spec sets `"use_odirect": true`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub odirect_tiers: Vec<TierOdirect>,
    /// The device of each `raw_block` tier of a custom cascade
    /// ([`raw_block::measure`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_block_devices: Vec<raw_block::TierDevice>,
    /// The version of the LMCache the server runs, as its wheel states it
    /// ([`locate::lmcache_version`]); `None` when it cannot be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lmcache_version: Option<String>,
    /// The weights behind the engine's `--model` ([`weights::measure`]);
    /// `None` when the backend is not `lmcache`, and in recorded facts
    /// made before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<Weights>,
    /// The node's variables as [`Facts::measure`] read them from the map
    /// it was given, once: the plan reads them from here
    /// ([`HostFacts::node`]). `None` for [`Facts::host`] and recorded
    /// facts.
    #[serde(skip)]
    pub node: Option<NodeEnv>,
    /// The stock `lmcache` the server will run ([`locate::stock_of`]), or
    /// where it was looked for in vain; `None` when the backend is not
    /// `lmcache`, for [`Facts::host`] and recorded facts.
    #[serde(skip)]
    pub stock_lmcache: Option<Result<PathBuf, locate::NotFound>>,
}

/// The O_DIRECT test write of every `fs` or `fs_native` tier of `cascade`
/// that sets `"use_odirect": true`: LMCache then opens every object with
/// O_DIRECT, and on a filesystem that refuses it every store fails while
/// `/status` says healthy (a public LMCache report; seen on ramfs here).
fn probe_odirect_tiers(cascade: &lmcache_tier_spec::Cascade) -> Vec<TierOdirect> {
    cascade
        .tiers()
        .iter()
        .enumerate()
        .filter(|(_, tier)| tier.is_disk_tier())
        .filter(|(_, tier)| {
            tier.as_object().get("use_odirect") == Some(&serde_json::Value::Bool(true))
        })
        .filter_map(|(position, tier)| {
            let base_path = PathBuf::from(tier.base_path()?);
            let probed = base_path
                .ancestors()
                .find(|dir| dir.is_dir())?
                .to_path_buf();
            Some(TierOdirect {
                position,
                adapter: tier.adapter_type().to_string(),
                odirect: probe::probe_odirect(&probed),
                base_path,
            })
        })
        .collect()
}

impl Facts {
    /// Measures the facts a launch of `engine` with the environment `vars`
    /// is planned from. The command line and the environment are checked
    /// first, so a bad value touches nothing. The disk is measured only
    /// when the node runs its built-in disk tier.
    ///
    /// Errors: a bad variable or engine fact, two listeners on one port,
    /// the host's memory unreadable,
    /// the server executable missing, `s3_bucket` tiers with a server
    /// Python that cannot import boto3, an unusable cache or lookup-hash
    /// directory, another launch holding the tier ([`PlanError`]).
    pub fn measure(
        engine: &EngineFacts,
        vars: &Vars,
        access: DiskAccess,
    ) -> Result<Self, PlanError> {
        Self::measure_showing(engine, vars, access, output::unseen)
    }

    /// [`Facts::measure`], the scan of the disk tier shown by `progress`
    /// (the binaries' spinner: [`output::spinner`]).
    ///
    /// Errors: those of [`Facts::measure`].
    pub(crate) fn measure_showing(
        engine: &EngineFacts,
        vars: &Vars,
        access: DiskAccess,
        progress: ShowProgress,
    ) -> Result<Self, PlanError> {
        let node = NodeEnv::from_vars(vars)?;
        node.check_tiers(vars)?;
        let mut facts = Facts::host()?;
        if node.kv_cache_backend != KvCacheBackend::Lmcache {
            facts.node = Some(node);
            return Ok(facts);
        }
        check_engine(engine)?;
        facts.weights = Some(weights::measure(engine.weights_source(), vars));
        effective_chunk_size(
            engine,
            &node,
            &launch_plan::engine_batched_tokens(engine, None),
        )?;
        check_plan_dirs(&node)?;
        let listeners = ports::listeners(&node);
        ports::check_distinct(&listeners)?;
        let executable = server_executable(&node, vars)?;
        let stock = locate::stock_of(&executable, vars);
        if access == DiskAccess::Create {
            // Refused before the cache directory is created or locked.
            ports::check_free(&listeners)?;
            if node.lmcache_path.is_none() {
                // `erebine-lmcache` would not find it either.
                stock.clone()?;
            }
        }
        check_server_modules(&node, vars, &stock)?;
        facts.gpu = stock
            .as_ref()
            .ok()
            .and_then(|stock| gpu::measure(stock, vars));
        if engine.max_num_batched_tokens.is_none() {
            facts.engine_gpu = gpu::engine_gpu(vars);
        }
        facts.lmcache_version = stock.as_deref().ok().and_then(locate::lmcache_version);
        check_api_keys(&node, vars, facts.lmcache_version.as_deref())?;
        facts.executable = Some(executable);
        facts.stock_lmcache = Some(stock);
        if access == DiskAccess::Create {
            check_before_creating(engine, &node, &facts)?;
            if let Some(log) = node.lookup_hash_log_dir() {
                create_private_dir(log, env::LOOKUP_HASH_LOG_DIR)?;
            }
        }
        if node.builtin_tier() {
            let message = format!("measuring the cache in {}", node.disk_path.display());
            let mut disk = None;
            progress(&message, &mut || {
                disk = Some(measure_node_disk(&node, access))
            });
            // A display that did not run the work leaves it to be done here.
            let mut disk = disk.unwrap_or_else(|| measure_node_disk(&node, access))?;
            if access == DiskAccess::Create {
                disk.read_probe =
                    probe_disk_read(&node, &disk.measured_at, facts.physical_cores, progress);
            }
            facts.disk = Some(disk);
        } else if let Some(cascade) = node.custom_cascade() {
            facts.odirect_tiers = probe_odirect_tiers(cascade);
            facts.raw_block_devices = raw_block::measure(cascade);
        }
        facts.node = Some(node);
        Ok(facts)
    }

    /// The stock `lmcache` the server will run, described with the version
    /// [`Facts::measure`] read ([`locate::LmcacheInstall`]); `None` when it
    /// was not looked for or not found.
    pub(crate) fn lmcache_install(&self) -> Option<locate::LmcacheInstall> {
        let stock = self.stock_lmcache.as_ref()?.as_ref().ok()?;
        Some(locate::LmcacheInstall::with_version(
            stock,
            self.lmcache_version.clone(),
        ))
    }
}

impl Facts {
    /// The host's figures only (memory and cores), without an executable
    /// or a disk: for tools that size one part, and for other backends.
    ///
    /// Errors: [`PlanError::Memory`] when the memory size cannot be read.
    pub fn host() -> Result<Self, PlanError> {
        Ok(Facts {
            memory: probe::memory().map_err(PlanError::Memory)?,
            physical_cores: probe::physical_cores(),
            executable: None,
            disk: None,
            gpu: None,
            engine_gpu: None,
            odirect_tiers: Vec::new(),
            raw_block_devices: Vec::new(),
            lmcache_version: None,
            weights: None,
            node: None,
            stock_lmcache: None,
        })
    }
}

impl From<&Facts> for HostFacts {
    /// The facts as the sizing rules read them: the memory decision
    /// ([`rules::memory`]) instead of the raw figures.
    fn from(facts: &Facts) -> Self {
        HostFacts {
            memory: rules::memory(&facts.memory),
            physical_cores: facts.physical_cores,
            executable: facts.executable.clone(),
            disk: facts.disk.clone(),
            gpu: facts.gpu.clone(),
            engine_gpu: facts.engine_gpu.clone(),
            odirect_tiers: facts.odirect_tiers.clone(),
            raw_block_devices: facts.raw_block_devices.clone(),
            lmcache_version: facts.lmcache_version.clone(),
            weights: facts.weights.clone(),
            node: facts.node.clone(),
        }
    }
}

/// When the node's cascade has tiers whose kind needs a module in the
/// server's Python ([`server_python::needed_module`]: boto3 for
/// `s3_bucket` tiers, LMCache's Rust raw-block extension for `raw_block`
/// ones): checks that the Python of the `stock` `lmcache`
/// ([`locate::stock_of`]) imports each ([`server_python::check_module`]).
///
/// Errors: the stock `lmcache` was not found ([`PlanError::Executable`]),
/// or its Python cannot import a module ([`PlanError::ServerModule`]).
fn check_server_modules(
    node: &NodeEnv,
    vars: &Vars,
    stock: &Result<PathBuf, locate::NotFound>,
) -> Result<(), PlanError> {
    let Some((variable, cascade)) = node.custom_tiers() else {
        return Ok(());
    };
    let needed = server_python::needed_modules(cascade.tiers());
    if needed.is_empty() {
        return Ok(());
    }
    let python = server_python::python_of(stock.as_ref().map_err(Clone::clone)?);
    for need in needed {
        server_python::check_module(&python, vars, need)
            .map_err(|source| PlanError::ServerModule { variable, source })?;
    }
    Ok(())
}

/// The server executable as [`locate::server_executable`] finds it, from
/// this program's own path.
pub(crate) fn server_executable(node: &NodeEnv, vars: &Vars) -> Result<PathBuf, PlanError> {
    let own = std::env::current_exe().unwrap_or_default();
    Ok(locate::server_executable(
        node.lmcache_path.as_deref(),
        vars,
        &own,
    )?)
}

/// For an LMCache that takes an API key (`version`), the keys its server
/// would read at start, checked before anything is created
/// ([`api_key::check_sources`]): the node's key file and LMCache's own
/// variables in `vars`.
///
/// Errors: [`PlanError::ApiKey`], naming the file or the variable.
fn check_api_keys(node: &NodeEnv, vars: &Vars, version: Option<&str>) -> Result<(), PlanError> {
    let release = version.and_then(LmcacheRelease::parse);
    if !lmcache_versions::rendering(release.as_ref()).api_key_file {
        return Ok(());
    }
    let lookup = |name: &str| env::text_var(vars, name);
    Ok(api_key::check_sources(
        node.api_key_file.as_deref(),
        node.extra_args.args(),
        &lookup,
    )?)
}

/// Refuses the directories the plan names beside the cache directory
/// (which [`measure_disk`] checks) where the server could never make or
/// use one: the lookup-hash log directory and the `base_path` of each
/// `fs` or `fs_native` tier of a custom cascade, when it, or the nearest
/// existing path above it, is not a directory (a regular file, a symlink
/// to one). A directory that does not exist yet is accepted: the launch or
/// LMCache creates it (`docs/configuration.md`, "Variables").
///
/// Errors: [`PlanError::DiskPath`] naming the variable, the tier and the
/// path in the way.
fn check_plan_dirs(node: &NodeEnv) -> Result<(), PlanError> {
    if let Some(dir) = node.lookup_hash_log_dir() {
        check_dir(env::LOOKUP_HASH_LOG_DIR, "", dir)?;
    }
    let variable = match node.extra_args.l2_adapters() {
        Some(_) => env::LMCACHE_EXTRA_ARGS,
        None => env::L2_ADAPTER,
    };
    let Some(cascade) = node.custom_cascade() else {
        return Ok(());
    };
    for (position, tier) in cascade.tiers().iter().enumerate() {
        let Some(base_path) = tier.base_path().filter(|_| tier.is_disk_tier()) else {
            continue;
        };
        let what = format!("L2 tier {position} ({}) base_path: ", tier.adapter_type());
        check_dir(variable, &what, Path::new(base_path))?;
    }
    Ok(())
}

/// Refuses `path` when it, or the nearest existing path above it, is not
/// a directory; `what` leads the problem (the tier and key).
fn check_dir(variable: &'static str, what: &str, path: &Path) -> Result<(), PlanError> {
    for existing in path.ancestors() {
        match fs::metadata(existing) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(_) => return Err(dir_error(
                variable,
                path,
                format!(
                    "{what}{} exists and is not a directory, so no directory can be made there",
                    existing.display()
                ),
                "Point it at a directory, or at a path below one (a missing directory is created)",
            )),
            Err(_) => continue,
        }
    }
    Ok(())
}

/// The built-in tier's volume as `node` asks for it: a tier the operator
/// disabled (`EREBINE_AGENT_LMCACHE_DISK_SIZE_GB=0`) is never created or
/// housekept, and its volume is measured for the record only; any other is
/// [`measure_disk`].
///
/// Errors: those of [`measure_disk`].
pub(crate) fn measure_node_disk(
    node: &NodeEnv,
    access: DiskAccess,
) -> Result<DiskFacts, PlanError> {
    match node.disk_size_bytes {
        Some(0) => measure_disk_as(&node.disk_path, DiskAccess::Inspect, Tier::Disabled),
        _ => measure_disk(&node.disk_path, access),
    }
}

/// The read test `EREBINE_AGENT_LMCACHE_DISK_READ_GBPS=probe` asks for, in
/// `measured_at` (the cache directory, or its nearest existing ancestor
/// while `size` or a dry run has not created it: [`DiskFacts::measured_at`])
/// with the tier's I/O workers as readers (`docs/sizing.md`, "What the disk
/// tier delivers"); `None` when not asked for or when the node runs no disk
/// tier.
pub(crate) fn probe_disk_read(
    node: &NodeEnv,
    measured_at: &Path,
    physical_cores: u32,
    progress: ShowProgress,
) -> Option<ReadProbe> {
    if node.disk_read != Some(env::DiskRead::Probe) || node.disk_size_bytes == Some(0) {
        return None;
    }
    let streams = rules::io_workers(physical_cores).value;
    let message = format!(
        "measuring how fast {} reads (a test file of at most {})",
        measured_at.display(),
        lmcache_sizing::fmt_gib(lmcache_sizing::disk_load::READ_PROBE_BYTES)
    );
    let mut probe = None;
    progress(&message, &mut || {
        probe = Some(probe_read(measured_at, streams))
    });
    Some(probe.unwrap_or_else(|| probe_read(measured_at, streams)))
}

/// What a launch refuses, found before it creates anything (the cache and
/// lookup-hash directories, the lock file): with a cache directory still
/// to be made, the whole plan from its nearest existing ancestor's volume
/// (there is nothing to scan, so the plan is the one the launch will
/// make); with one that exists, the refusals of the sizing rules, which do
/// not need its scan ([`launch_plan::check_volume`]).
fn check_before_creating(
    engine: &EngineFacts,
    node: &NodeEnv,
    facts: &Facts,
) -> Result<(), PlanError> {
    let disk = match (node.builtin_tier(), node.disk_size_bytes) {
        (false, _) => None,
        (true, Some(0)) => Some(measure_node_disk(node, DiskAccess::Inspect)?),
        (true, _) if node.disk_path.is_dir() => {
            let (volume, filesystem) = volume_facts(&node.disk_path, &node.disk_path)?;
            let memory = rules::memory(&facts.memory).value;
            return launch_plan::check_volume(node, memory, &volume, &filesystem);
        }
        (true, _) => Some(measure_disk(&node.disk_path, DiskAccess::Inspect)?),
    };
    let preview = Facts {
        disk,
        ..facts.clone()
    };
    let executable = facts.executable.clone().unwrap_or_default();
    launch_plan::plan_launch(engine, node, &HostFacts::from(&preview), executable).map(drop)
}

/// Measures the volume of the cache directory `path` and scans it:
/// statvfs, filesystem type, the O_DIRECT test write, and the tier's scan
/// (under its lock, with the guard's watch added first, for
/// [`DiskAccess::Create`]).
///
/// Errors: an unusable cache directory ([`PlanError::DiskPath`]), or
/// another launch holding it ([`PlanError::Tier`]).
pub fn measure_disk(path: &Path, access: DiskAccess) -> Result<DiskFacts, PlanError> {
    measure_disk_as(path, access, Tier::Enabled)
}

/// [`measure_disk`] read-only, for housekeeping: a directory this process
/// cannot write to (a read-only volume, say) is measured and scanned, not
/// refused, since a dry run of housekeeping writes nothing there.
///
/// Errors: an unusable cache directory ([`PlanError::DiskPath`]).
pub(crate) fn measure_disk_to_housekeep(path: &Path) -> Result<DiskFacts, PlanError> {
    measure_disk_as(path, DiskAccess::Inspect, Tier::Housekept)
}

/// What the disk tier is measured for: a launch's tier, one disabled
/// (measured for the record only, so a directory it could not write to is
/// no error), or housekeeping (scanned, and no error either).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Enabled,
    Disabled,
    Housekept,
}

fn measure_disk_as(path: &Path, access: DiskAccess, purpose: Tier) -> Result<DiskFacts, PlanError> {
    let measured_at = prepare_disk_path(path, access)?;
    let (volume, filesystem) = volume_facts(path, &measured_at)?;
    let kind = volume::volume_kind(&filesystem, &volume);
    if kind.value == VolumeKind::NotStorage && purpose == Tier::Enabled {
        return Err(PlanError::Sizing {
            variable: env::DISK_PATH,
            path: path.display().to_string(),
            source: SizingError::NotStorage { why: kind.reason },
        });
    }
    let odirect = probe::probe_odirect(&measured_at);
    if let (OdirectProbe::NotWritable(why), Tier::Enabled) = (&odirect, purpose) {
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let note = match why.contains("Permission denied") {
            true => ownership_note(&measured_at, &denied),
            false => String::new(),
        };
        return Err(disk_error(
            path,
            format!("cannot create a file in {}: {why}{note}", measured_at.display()),
            "Make the directory writable by this user, or point the variable at a writable directory",
        ));
    }
    let (reclaimable_bytes, tier) = if measured_at == path && purpose != Tier::Disabled {
        let scan = scan_tier(path, access)?;
        let reclaimable = scan.scanned.inventory.reclaimable_bytes();
        (reclaimable, MeasuredTier::new(scan))
    } else {
        (0, MeasuredTier::default())
    };
    Ok(DiskFacts {
        measured_at,
        volume,
        filesystem,
        reclaimable_bytes,
        odirect,
        read_probe: None,
        tier,
    })
}

/// The statistics and the filesystem of the volume of `measured_at`, for
/// the cache directory `path` (named in errors).
fn volume_facts(path: &Path, measured_at: &Path) -> Result<(VolumeStats, Filesystem), PlanError> {
    let volume = probe::volume_stats(measured_at).map_err(|e| {
        disk_error(
            path,
            format!("cannot read the volume statistics: {e}"),
            "Check that the path is on a mounted filesystem",
        )
    })?;
    let mut filesystem = probe::filesystem(measured_at).map_err(|e| {
        disk_error(
            path,
            format!("cannot read the filesystem type: {e}"),
            "Check that the path is on a mounted filesystem",
        )
    })?;
    // A directory still to be made is measured at an existing parent: the
    // parent's mount says nothing of the directory's own.
    filesystem.own_volume &= measured_at == path;
    Ok((volume, filesystem))
}

/// The tier's one scan: for [`DiskAccess::Create`] the directory is
/// opened for writing and locked, and the capacity guard's watch is added
/// before the scan, so nothing written meanwhile is missed.
fn scan_tier(path: &Path, access: DiskAccess) -> Result<TierScan, PlanError> {
    let mode = match access {
        DiskAccess::Create => Mode::Apply,
        DiskAccess::Inspect => Mode::DryRun,
    };
    TierScan::take(path, mode).map_err(|e| match e {
        HousekeepingError::Lock(_) => PlanError::Tier(e),
        other => disk_error(
            path,
            format!("cannot scan the cache directory: {other}"),
            "Check its permissions",
        ),
    })
}

fn disk_error(path: &Path, problem: String, fix: &'static str) -> PlanError {
    dir_error(env::DISK_PATH, path, problem, fix)
}

fn dir_error(variable: &'static str, path: &Path, problem: String, fix: &'static str) -> PlanError {
    PlanError::DiskPath {
        variable,
        path: path.display().to_string(),
        problem,
        fix,
    }
}

/// Creates `path` (and missing parents) at mode 0700: the cache and the
/// lookup-hash records are the node's private data
/// (`docs/configuration.md`). An existing directory is used as it is (its
/// mode is the owner's choice); anything else in the way is an error.
/// `variable` names the setting in errors.
fn create_private_dir(path: &Path, variable: &'static str) -> Result<(), PlanError> {
    if path.is_dir() {
        return Ok(());
    }
    if path.exists() {
        return Err(dir_error(
            variable,
            path,
            "it exists and is not a directory".into(),
            "Point the variable at a directory (it is created, mode 0700, if missing)",
        ));
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| {
            dir_error(
                variable,
                path,
                format!("cannot create it: {e}{}", ownership_note(path, &e)),
                "Create it yourself or point the variable at a writable place",
            )
        })?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|e| {
        dir_error(
            variable,
            path,
            format!("cannot set mode 0700: {e}"),
            "Check who owns it",
        )
    })
}

/// Checks the cache directory and returns the directory to measure: the
/// path itself, or (with [`DiskAccess::Inspect`] and a missing path) its
/// nearest existing ancestor.
fn prepare_disk_path(path: &Path, access: DiskAccess) -> Result<PathBuf, PlanError> {
    if !path.is_absolute() {
        return Err(disk_error(
            path,
            "the path is relative".into(),
            "Give an absolute path",
        ));
    }
    check_dir(env::DISK_PATH, "", path)?;
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(path.to_path_buf()),
        Ok(meta) if meta.file_type().is_symlink() && path.is_dir() => Ok(path.to_path_buf()),
        Ok(_) => Err(disk_error(
            path,
            "it exists and is not a directory".into(),
            "Point it at a directory (it is created, mode 0700, if missing)",
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => match access {
            DiskAccess::Create => {
                create_private_dir(path, env::DISK_PATH)?;
                Ok(path.to_path_buf())
            }
            DiskAccess::Inspect => nearest_existing_ancestor(path),
        },
        Err(e) => Err(disk_error(
            path,
            format!("cannot read it: {e}{}", ownership_note(path, &e)),
            "Check its permissions",
        )),
    }
}

/// For a refused permission: the owner and mode of the nearest directory at
/// or above `path` this process can stat (the one refusing it), and the
/// uid and gid this process runs as, which a container's `--user` or a
/// volume made by another user makes differ (`docs/image.md`); empty for
/// any other error.
fn ownership_note(path: &Path, error: &io::Error) -> String {
    use std::os::unix::fs::MetadataExt;
    if error.kind() != io::ErrorKind::PermissionDenied {
        return String::new();
    }
    let me = format!(
        "this process runs as uid {} gid {}",
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    match path
        .ancestors()
        .find_map(|dir| fs::metadata(dir).ok().map(|meta| (dir, meta)))
    {
        Some((dir, meta)) => format!(
            " ({} is owned by uid {} gid {} with mode {:04o}; {me})",
            dir.display(),
            meta.uid(),
            meta.gid(),
            meta.mode() & 0o7777
        ),
        None => format!(" ({me})"),
    }
}

fn nearest_existing_ancestor(path: &Path) -> Result<PathBuf, PlanError> {
    let mut ancestor = path.parent();
    while let Some(a) = ancestor {
        if a.is_dir() {
            return Ok(a.to_path_buf());
        }
        if a.exists() {
            return Err(disk_error(
                path,
                format!("{} is not a directory", a.display()),
                "Point the variable below a directory",
            ));
        }
        ancestor = a.parent();
    }
    Ok(PathBuf::from("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::env::text_vars;

    /// A refused permission names the nearest directory's owner and mode
    /// and this process's uid; other errors add nothing.
    #[test]
    fn a_refused_permission_names_owner_mode_and_uid() {
        let t = tempfile::tempdir().unwrap();
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o700)).unwrap();
        let below = t.path().join("a/b");
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let note = ownership_note(&below, &denied);
        let uid = nix::unistd::getuid();
        assert!(
            note.contains(&format!(
                "{} is owned by uid {uid} gid {} with mode 0700; this process runs as uid {uid}",
                t.path().display(),
                nix::unistd::getgid()
            )),
            "{note}"
        );
        assert_eq!(
            ownership_note(&below, &io::Error::from(io::ErrorKind::NotFound)),
            ""
        );
    }

    fn engine() -> EngineFacts {
        EngineFacts {
            model: "org/model".into(),
            tensor_parallel_size: 1,
            pipeline_parallel_size: 1,
            data_parallel_size: 1,
            kv_cache_dtype: "auto".into(),
            block_size: 16,
            max_num_batched_tokens: Some(2048),
            hybrid_attention: false,
            ..EngineFacts::default()
        }
    }

    /// The variables of a node with the lmcache backend, its cache at
    /// `cache`, and `/bin/sh` standing in for the server executable.
    fn node(cache: &Path, extra: &[(&str, &str)]) -> Vars {
        let cache = cache.to_str().unwrap();
        let mut pairs = vec![
            ("EREBINE_AGENT_KV_CACHE_BACKEND", "lmcache"),
            ("EREBINE_AGENT_LMCACHE_DISK_PATH", cache),
            ("EREBINE_AGENT_LMCACHE_PATH", "/bin/sh"),
        ];
        pairs.extend_from_slice(extra);
        text_vars(pairs)
    }

    #[test]
    fn a_dry_run_of_a_missing_directory_measures_its_ancestor_and_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("a/b/cache");
        let facts = Facts::measure(&engine(), &node(&cache, &[]), DiskAccess::Inspect).unwrap();
        let disk = facts.disk.unwrap();
        assert_eq!(disk.measured_at, tmp.path());
        assert_eq!(disk.reclaimable_bytes, 0);
        assert!(disk.tier.take().is_none());
        assert!(!tmp.path().join("a").exists());
    }

    #[test]
    fn a_launch_locks_the_tier_and_hands_its_one_scan_on_once() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let vars = node(&cache, &[]);
        let facts = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap();
        let disk = facts.disk.as_ref().unwrap();
        assert_eq!(disk.measured_at, cache);
        let second = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap_err();
        assert!(matches!(second, PlanError::Tier(_)), "{second}");
        let scan = disk.tier.take().expect("the scan is handed on once");
        assert!(scan.scanned.lock.is_some() && scan.watch.is_some());
        assert!(disk.tier.take().is_none());
        drop(scan);
        Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap();
    }

    #[test]
    fn a_lock_file_that_cannot_be_a_lock_is_bad_input_and_a_held_one_is_locked() {
        use crate::exit::{ExitStatus, HasExitStatus};
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let vars = node(&cache, &[]);
        let held = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap();
        let second = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap_err();
        assert_eq!(second.exit_status(), ExitStatus::TierLocked, "{second}");
        drop(held);
        let lock = cache.join(".lmcache-tier.lock");
        fs::remove_file(&lock).unwrap();
        fs::create_dir(&lock).unwrap();
        let broken = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap_err();
        assert_eq!(broken.exit_status(), ExitStatus::BadInput, "{broken}");
    }

    #[test]
    fn a_disabled_tier_is_measured_but_neither_created_nor_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache");
        let vars = node(&cache, &[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0")]);
        let facts = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap();
        assert!(facts.disk.unwrap().tier.take().is_none());
        assert!(!cache.exists());
    }

    #[test]
    fn a_directory_that_cannot_be_created_is_named_with_the_os_error() {
        let err = create_private_dir(Path::new("/proc/self/erebine-cache"), env::DISK_PATH)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "EREBINE_AGENT_LMCACHE_DISK_PATH=/proc/self/erebine-cache: cannot create it:"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_launch_refused_by_its_plan_creates_and_locks_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let cases: [(PathBuf, &[(&str, &str)]); 5] = [
            (
                shm.path().join("cache"),
                &[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "1000000")],
            ),
            (
                tmp.path().join("cache"),
                &[("EREBINE_AGENT_LMCACHE_MP_PORT", "8090")],
            ),
            (
                tmp.path().join("a/cache"),
                &[
                    ("EREBINE_AGENT_KV_OFFLOAD_SIZE_GB", "0"),
                    ("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "0.5"),
                ],
            ),
            (
                tmp.path().join("b/cache"),
                &[(
                    "EREBINE_AGENT_LMCACHE_LOOKUP_HASH_LOG_DIR",
                    "/proc/erebine-log",
                )],
            ),
            (
                PathBuf::from("/proc/self/erebine-cache"),
                &[("EREBINE_AGENT_LMCACHE_DISK_SIZE_GB", "10")],
            ),
        ];
        for (cache, extra) in cases {
            let err =
                Facts::measure(&engine(), &node(&cache, extra), DiskAccess::Create).unwrap_err();
            assert_eq!(
                crate::exit::HasExitStatus::exit_status(&err),
                crate::exit::ExitStatus::BadInput,
                "{err}"
            );
            assert!(!cache.exists(), "{err}");
        }
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
        assert_eq!(fs::read_dir(shm.path()).unwrap().count(), 0);
    }

    #[test]
    fn another_backend_measures_no_disk_and_needs_no_executable() {
        let tmp = tempfile::tempdir().unwrap();
        let vars = text_vars([
            ("EREBINE_AGENT_KV_CACHE_BACKEND", "native"),
            ("EREBINE_AGENT_LMCACHE_PATH", "/nonexistent/erebine-lmcache"),
            ("HOME", tmp.path().to_str().unwrap()),
        ]);
        let facts = Facts::measure(&engine(), &vars, DiskAccess::Create).unwrap();
        assert!(facts.disk.is_none() && facts.executable.is_none());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}

//! `lmcache-tier launch`: the node measured once, planned, and either shown
//! (`--dry-run`: a [`DryRun`] report, text or JSON) or handed to
//! [`crate::run::launch`] to run. The binary parses its flags into the engine
//! facts, the variables and the [`crate::run::launch::RunOptions`], and prints
//! what this module returns.

use std::fmt;

use lmcache_housekeeping::identity::NAME_MAX;
use lmcache_housekeeping::{HousekeepingError, Mode, Report};
use serde::{Serialize, Serializer};

use crate::node::env::Vars;
use crate::plan::facts::{DiskAccess, Facts};
use crate::plan::inputs::{EngineFacts, HostFacts, PlanError};
use crate::plan::launch_plan::LaunchPlan;
use crate::plan::locate::LmcacheInstall;
use crate::plan::Planned;

/// A node's launch as planned from facts measured once
/// ([`Facts::measure`]): what [`plan_node`] returns.
#[derive(Debug)]
pub struct NodeLaunch {
    /// The plan: a server, or nothing to launch for another backend.
    pub planned: Planned,
    /// The facts it was made from (the tier's scan and lock travel with
    /// the plan's housekeeping).
    pub facts: Facts,
}

/// Measures the node `vars` describe for `engine` (creating and locking the
/// cache directory with [`DiskAccess::Create`]; a spinner on a terminal
/// while the tier is scanned), plans it
/// ([`crate::plan::plan()`]), and appends `server_args` to the server's command
/// line verbatim (a test hook: no gateway or guard reads them).
///
/// Errors: those of [`Facts::measure`] and [`crate::plan::plan()`] ([`PlanError`]).
pub fn plan_node(
    engine: &EngineFacts,
    vars: &Vars,
    access: DiskAccess,
    server_args: Vec<String>,
) -> Result<NodeLaunch, PlanError> {
    let facts = Facts::measure_showing(engine, vars, access, crate::output::spinner)?;
    let mut planned = crate::plan::plan(engine, vars, &HostFacts::from(&facts))?;
    if let Planned::Server(plan) = &mut planned {
        plan.args.extend(server_args);
    }
    Ok(NodeLaunch { planned, facts })
}

impl NodeLaunch {
    /// The stock `lmcache` the server runs, with its version; `None` when
    /// it was not found (a dry run, or `EREBINE_AGENT_LMCACHE_PATH` naming
    /// the server: [`Facts::measure`] refuses a real launch without it
    /// otherwise).
    pub fn lmcache(&self) -> Option<LmcacheInstall> {
        self.facts.lmcache_install()
    }

    /// What the launch says before it starts anything, in order: why the stock `lmcache` is missing (a dry
    /// run without `EREBINE_AGENT_LMCACHE_PATH`), the plan's warnings, the
    /// launch identity LMCache will write under, and a `--model` whose
    /// object names pass `NAME_MAX` (`docs/configuration.md`, "The launch
    /// identity").
    pub fn notes(&self, engine: &EngineFacts) -> Vec<Note> {
        let Planned::Server(plan) = &self.planned else {
            return Vec::new();
        };
        let configured = self
            .facts
            .node
            .as_ref()
            .and_then(|n| n.lmcache_path.as_ref());
        let mut notes = match (&self.facts.stock_lmcache, configured) {
            (Some(Err(missing)), None) => vec![Note::Warning(missing.to_string())],
            _ => Vec::new(),
        };
        notes.extend(plan.decisions.warnings.iter().cloned().map(Note::Warning));
        notes.extend(identity_notes(engine, plan));
        notes
    }
}

/// A line the launch logs before it starts anything ([`NodeLaunch::notes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Logged at INFO.
    Info(String),
    /// Logged at WARN.
    Warning(String),
}

/// The launch identity's lines ([`NodeLaunch::notes`]).
fn identity_notes(engine: &EngineFacts, plan: &LaunchPlan) -> Vec<Note> {
    let identity = &plan.identity;
    let served = match &engine.served_model_name {
        Some(name) if *name != engine.model => {
            format!("; --served-model-name {name:?} is what clients send and is not part of it")
        }
        _ => String::new(),
    };
    let weights = identity.weights.as_deref().unwrap_or("not seen");
    let pin = match &plan.engine_revision {
        Some(commit) => format!("; give the engine --revision {commit}"),
        None => String::new(),
    };
    let mut notes = vec![Note::Info(format!(
        "launch identity: LMCache writes objects under model {:?} with world size {} (vLLM's --model and parallel flags){served}; cache identity {} (weights {weights}{pin})",
        identity.lmcache_model_name(),
        identity.kv_world_size(),
        identity.tag(),
    ))];
    let Some(hk) = &plan.housekeeping else {
        return notes;
    };
    let name_len = identity.object_name_len();
    if name_len > NAME_MAX {
        notes.push(Note::Warning(format!(
            "LMCache's object names for --model {:?} are {name_len} bytes, over the {NAME_MAX} a file name may have: every store to the disk tier {} will fail. Give the engine (and the launch) a shorter --model, e.g. a symlink to the model directory",
            engine.model,
            hk.path.display()
        )));
    }
    notes
}

/// What `launch --dry-run` shows: the plan, the stock `lmcache`, the
/// facts, and what the launch's housekeeping would do to the disk tier.
/// Text ([`fmt::Display`]): the plan's log line, the housekeeping report,
/// the LMCache install, the server's command line quoted for a shell
/// (secrets redacted) and the engine's `--kv-transfer-config`. JSON
/// ([`Serialize`]): [`Planned::to_json`] with `lmcache`, `facts` and
/// `housekeeping_report` added.
#[derive(Debug)]
pub struct DryRun<'a> {
    launch: &'a NodeLaunch,
    housekeeping: Option<Report>,
}

impl<'a> DryRun<'a> {
    /// The dry run of `launch`: its housekeeping planned read-only from
    /// its own scan; `None` without a disk tier, or before its directory
    /// exists (there is nothing to clean then).
    ///
    /// Errors: the tier cannot be scanned ([`HousekeepingError`]).
    pub fn of(launch: &'a NodeLaunch) -> Result<Self, HousekeepingError> {
        let housekeeping = match &launch.planned {
            Planned::Server(plan) => dry_run_housekeeping(plan)?,
            Planned::NothingToLaunch(_) => None,
        };
        Ok(DryRun {
            launch,
            housekeeping,
        })
    }

    /// The warning of a housekeeping that would purge most of the tier
    /// (`docs/operations.md`), for the log.
    pub fn purge_warning(&self) -> Option<String> {
        self.housekeeping.as_ref()?.purge_warning()
    }

    /// The JSON document ([`Serialize`]).
    pub fn to_json(&self) -> serde_json::Value {
        let mut json = self.launch.planned.to_json();
        if let Planned::Server(_) = &self.launch.planned {
            json["lmcache"] = serde_json::to_value(self.launch.lmcache()).unwrap_or_default();
            json["facts"] = serde_json::to_value(&self.launch.facts).unwrap_or_default();
            json["housekeeping_report"] =
                serde_json::to_value(&self.housekeeping).unwrap_or_default();
        }
        json
    }
}

impl Serialize for DryRun<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(serializer)
    }
}

impl fmt::Display for DryRun<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = match &self.launch.planned {
            Planned::Server(plan) => plan,
            Planned::NothingToLaunch(why) => {
                return writeln!(f, "nothing to launch: {}", why.reason)
            }
        };
        writeln!(f, "{}", plan.log_line())?;
        if let Some(report) = &self.housekeeping {
            writeln!(f, "{report}")?;
        }
        if let Some(install) = self.launch.lmcache() {
            writeln!(f, "{}", install.describe())?;
        }
        writeln!(f, "{}", shell_command(plan))?;
        writeln!(f, "vLLM --kv-transfer-config {}", plan.kv_transfer_config())
    }
}

/// The server's command quoted for a shell, so the line can be pasted
/// (secrets stay redacted), after the server's own variables as
/// assignments.
fn shell_command(plan: &LaunchPlan) -> String {
    let command: Vec<String> = std::iter::once(plan.executable.display().to_string())
        .chain(plan.redacted_args())
        .collect();
    let assignments = plan.shown_env().into_iter().map(|(k, v)| {
        let value = shlex::try_quote(&v).map_or_else(|_| v.clone(), |q| q.into_owned());
        format!("{k}={value} ")
    });
    format!(
        "{}{}",
        assignments.collect::<String>(),
        shlex::try_join(command.iter().map(String::as_str)).unwrap_or_else(|_| command.join(" "))
    )
}

/// What the launch's housekeeping would do to the disk tier, from the dry
/// run's own read-only scan ([`DryRun::of`]).
fn dry_run_housekeeping(plan: &LaunchPlan) -> Result<Option<Report>, HousekeepingError> {
    let Some(hk) = plan.housekeeping.as_ref() else {
        return Ok(None);
    };
    if std::fs::symlink_metadata(&hk.path).is_err() {
        return Ok(None);
    }
    Ok(Some(hk.run(Mode::DryRun)?.housekeeping.report))
}

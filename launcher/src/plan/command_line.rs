//! The server's command line and environment, and the engine's connector
//! config, as the plan writes them (`docs/configuration.md`, "The server
//! command line"): the node's flags in their documented order, less those
//! `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` repeats, then its arguments.

use std::collections::BTreeMap;

use lmcache_sizing::GIB;
use lmcache_tier_spec::Cascade;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::node::env::NodeEnv;
use crate::node::extra_args::{self, ExtraArgs};
use crate::plan::inputs::EngineFacts;
use crate::plan::verdict::L1Mode;

/// A node flag that `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` repeats: the node's
/// occurrence is dropped so that the extra one is what the server gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replaced {
    /// The flag, e.g. `--chunk-size`.
    pub flag: String,
    /// What the node would have passed (adapter secrets redacted).
    pub node: String,
    /// What the extra arguments pass (adapter secrets redacted).
    pub extra: String,
}

/// The variables the server gets on top of its environment
/// (`docs/configuration.md`): no usage reports, unbuffered output, and
/// the log level when the node sets one.
pub(super) fn server_env(node: &NodeEnv) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("LMCACHE_TRACK_USAGE".to_string(), "false".to_string());
    env.insert("PYTHONUNBUFFERED".to_string(), "1".to_string());
    if let Some(level) = &node.lmcache_log_level {
        env.insert("LMCACHE_LOG_LEVEL".to_string(), level.clone());
    }
    env
}

/// The engine's `--kv-transfer-config` for a server on 127.0.0.1:`mp_port`,
/// with `extra` (`EREBINE_AGENT_LMCACHE_EXTRA_CONFIG`) merged into
/// `kv_connector_extra_config`, its keys winning.
pub fn connector_config(mp_port: u16, extra: &Map<String, Value>) -> Value {
    let mut config = Map::new();
    config.insert("lmcache.mp.host".into(), "tcp://127.0.0.1".into());
    config.insert("lmcache.mp.port".into(), mp_port.into());
    for (key, value) in extra {
        config.insert(key.clone(), value.clone());
    }
    serde_json::json!({
        "kv_connector": "LMCacheMPConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": config,
    })
}

/// What the node itself would pass, before `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`.
pub(super) struct NodeValues {
    pub(super) chunk_size: u32,
    pub(super) l1_bytes: u64,
    pub(super) l1_mode: L1Mode,
    /// The node's L2 tiers as they would be shown (secrets redacted).
    pub(super) tiers: String,
    /// The server's API key file, where the LMCache version takes one
    /// (`docs/configuration.md`, "The server's API key").
    pub(super) api_key_file: Option<std::path::PathBuf>,
}

/// The node's own `lmcache server` flags in the documented order
/// (`docs/configuration.md`), each with
/// its value (`--l2-adapter` once per tier).
pub(super) fn node_flags(
    facts: &EngineFacts,
    node: &NodeEnv,
    own: &NodeValues,
    cascade: &Cascade,
) -> Vec<(&'static str, String)> {
    let mut flags: Vec<(&'static str, String)> = vec![
        ("--host", "127.0.0.1".into()),
        ("--port", node.mp_port.to_string()),
        ("--http-host", "127.0.0.1".into()),
        ("--http-port", node.http_port.to_string()),
        ("--chunk-size", own.chunk_size.to_string()),
        ("--l1-size-gb", gib_arg(own.l1_bytes)),
    ];
    match own.l1_mode {
        // LMCache 0.5.6's default prefetch policy loads an L2 hit into L1
        // as a temporary object, freed once the engine has it, so every
        // request pays the disk again; `retain` keeps it in L1 under its
        // LRU (`docs/configuration.md`, "The server command line"). Not
        // with the write buffer, whose `noop` eviction would never free it.
        L1Mode::Cache => flags.extend([
            ("--eviction-policy", "LRU".into()),
            ("--l2-prefetch-policy", "retain".into()),
        ]),
        L1Mode::WriteBuffer => flags.extend([
            ("--eviction-policy", "noop".into()),
            ("--l2-store-policy", "skip_l1".into()),
        ]),
    }
    flags.push(("--max-gpu-workers", facts.gpu_workers().to_string()));
    if let Some(file) = &own.api_key_file {
        flags.push((super::api_key::FLAGS[0], file.display().to_string()));
    }
    if let Some(log) = &node.lookup_hash_log {
        flags.extend([
            ("--lookup-hash-log-dir", log.dir.display().to_string()),
            (
                "--lookup-hash-log-rotation-interval",
                log.rotation_interval_secs.to_string(),
            ),
            (
                "--lookup-hash-log-rotation-max-size",
                log.rotation_max_size_bytes.to_string(),
            ),
            ("--lookup-hash-log-max-files", log.max_files.to_string()),
        ]);
    }
    if node.extra_args.l2_adapters().is_none() {
        for tier in cascade.tiers() {
            flags.push((extra_args::L2_ADAPTER_FLAG, tier.to_arg()));
        }
    }
    flags
}

/// `server`, the node's flags minus those `extra` repeats, then `extra`'s
/// arguments; and what was replaced.
pub(super) fn server_args(
    node_flags: Vec<(&'static str, String)>,
    node_tiers: String,
    extra: &ExtraArgs,
) -> (Vec<String>, Vec<Replaced>) {
    let mut args = vec!["server".to_string()];
    let mut replaced = Vec::new();
    for (flag, value) in node_flags {
        if extra.replaces(flag) {
            if let Some(by) = extra.value(flag) {
                replaced.push(Replaced {
                    flag: flag.to_string(),
                    node: value,
                    extra: by.to_string(),
                });
            }
        } else {
            args.push(flag.to_string());
            args.push(value);
        }
    }
    if let Some(tiers) = extra.l2_adapters() {
        replaced.push(Replaced {
            flag: extra_args::L2_ADAPTER_FLAG.to_string(),
            node: node_tiers,
            extra: tiers.redacted().to_string(),
        });
    }
    args.extend(extra.args().iter().cloned());
    (args, replaced)
}

/// A byte count as LMCache's GiB flag value: `"6"`, `"1.5"`.
fn gib_arg(bytes: u64) -> String {
    format!("{}", bytes as f64 / GIB as f64)
}

//! What the server is and did, as the plan's users read it: its HTTP
//! `/status` endpoint (a typed model of the fields this project reads, and
//! a client that polls it), its liveness events ([`events`]) and how its
//! exit is told from the kernel's count of OOM kills ([`oom`]). Below
//! `run/`, which polls and reports, so that `inspect` and the metrics read
//! the same model without the launch.
//!
//! LMCache 0.5.6 answers 200 with a JSON body when the engine is up and 503
//! while it is not (recorded bodies in `fixtures/lmcache-0.5.6/status/`). The model is
//! tolerant: every field is optional, a field of an unexpected type reads as
//! absent instead of failing the whole body, and unknown fields are ignored,
//! so a newer LMCache that adds or moves fields still parses. The store
//! controller is read from under `storage_manager`, where LMCache 0.5.4 to
//! 0.5.6 put it, else from the top level (`docs/inspect.md`).

pub mod events;
pub mod oom;

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use lmcache_s3_gateway::{capped_body, BodyError};
use lmcache_tier_spec::error_chain;

use crate::plan::api_key::ApiKey;

/// The largest `/status` body read: LMCache 0.5.6's is about 5 KiB idle,
/// and grows with workers and tiers, never near this.
pub const STATUS_MAX_BYTES: usize = 16 << 20;

/// Why a `/status` answer is not LMCache's, or cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The body is larger than [`STATUS_MAX_BYTES`], or was cut short.
    #[error(transparent)]
    Body(#[from] BodyError),
    /// The body is not JSON.
    #[error("not JSON: {0}")]
    NotJson(
        /// The JSON error.
        #[source]
        serde_json::Error,
    ),
    /// The body is JSON, but not an object.
    #[error("a JSON {kind} where a JSON object was expected")]
    NotAnObject {
        /// What it is: `array`, `null`, `string`, ...
        kind: &'static str,
    },
    /// An object without LMCache's own fields.
    #[error("a JSON object without LMCache's fields (a boolean is_healthy, and engine_type or a storage_manager object): another program on this port?")]
    NotLmcache,
    /// An `is_healthy` that is not `true` or `false`.
    #[error("{path}is_healthy is not true or false")]
    MistypedHealth {
        /// Where it is, e.g. `storage_manager.l2_adapters.[0].`; empty at
        /// the top level.
        path: String,
    },
    /// An object the model cannot read.
    #[error("unreadable: {0}")]
    Unreadable(
        /// The JSON error.
        #[source]
        serde_json::Error,
    ),
}

/// Whether a `/status` body is LMCache's, as a poll requires before it
/// reads the body: a JSON object with LMCache's own fields (a boolean
/// `is_healthy`, and a string `engine_type` or a `storage_manager` object),
/// in which every `is_healthy`, at any depth, is `true` or `false` (any
/// process may hold the port; a health that cannot be read is not health).
///
/// # Errors
/// What is missing or mistyped: [`AnswerError::NotAnObject`],
/// [`AnswerError::NotLmcache`], [`AnswerError::MistypedHealth`].
pub fn check_lmcache_answer(body: &serde_json::Value) -> Result<(), AnswerError> {
    if !body.is_object() {
        return Err(AnswerError::NotAnObject {
            kind: json_kind(body),
        });
    }
    let identified = body["is_healthy"].is_boolean()
        && (body["engine_type"].is_string() || body["storage_manager"].is_object());
    if !identified {
        return Err(AnswerError::NotLmcache);
    }
    match mistyped_health(body, "") {
        Some(path) => Err(AnswerError::MistypedHealth { path }),
        None => Ok(()),
    }
}

/// The path of the first `is_healthy` in `value` that is not a boolean.
fn mistyped_health(value: &serde_json::Value, path: &str) -> Option<String> {
    match value {
        serde_json::Value::Object(fields) => fields.iter().find_map(|(key, field)| {
            if key == "is_healthy" && !field.is_boolean() {
                return Some(path.to_string());
            }
            mistyped_health(field, &format!("{path}{key}."))
        }),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| mistyped_health(item, &format!("{path}[{i}]."))),
        _ => None,
    }
}

/// Default per-request timeout of a `/status` poll.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads a field leniently: a value of the wrong type is `None`, not an error.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(serde_json::from_value(value).ok())
}

/// Reads a list leniently: a non-list is empty, an element of the wrong
/// shape is skipped.
fn lenient_list<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = serde_json::Value::deserialize(deserializer)?;
    Ok(match value {
        serde_json::Value::Array(items) => items
            .into_iter()
            .filter_map(|item| serde_json::from_value(item).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// The parts of a `/status` body this project reads. Every field is `None`
/// (or empty) when the body lacks it or has it with another type.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct ServerStatus {
    /// Overall health as the server judges it.
    #[serde(default, deserialize_with = "lenient")]
    pub is_healthy: Option<bool>,
    /// `MPCacheServer` for the multiprocess server.
    #[serde(default, deserialize_with = "lenient")]
    pub engine_type: Option<String>,
    /// Chunk size in tokens.
    #[serde(default, deserialize_with = "lenient")]
    pub chunk_size: Option<u64>,
    /// Hash of chunk keys, e.g. `blake3`.
    #[serde(default, deserialize_with = "lenient")]
    pub hash_algorithm: Option<String>,
    /// L1, L2 tiers and their controllers.
    #[serde(default, deserialize_with = "lenient")]
    pub storage_manager: Option<StorageManager>,
    /// The store controller at the top level, read when `storage_manager`
    /// has none (no LMCache 0.5.4 to 0.5.6 puts it there).
    #[serde(default, deserialize_with = "lenient")]
    pub store_controller: Option<StoreController>,
    /// Engine workers registered with the server.
    #[serde(default, deserialize_with = "lenient")]
    pub worker_liveness: Option<WorkerLiveness>,
}

/// `storage_manager`: the tiers and their controllers.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct StorageManager {
    /// Health of the storage manager.
    #[serde(default, deserialize_with = "lenient")]
    pub is_healthy: Option<bool>,
    /// One entry per L2 tier, in cascade order.
    #[serde(default, deserialize_with = "lenient_list")]
    pub l2_adapters: Vec<L2AdapterStatus>,
    /// Capacity and usage of the tiers LMCache evicts itself.
    #[serde(default, deserialize_with = "lenient")]
    pub l2_eviction_controller: Option<L2EvictionController>,
    /// The store controller (LMCache 0.5.6 layout).
    #[serde(default, deserialize_with = "lenient")]
    pub store_controller: Option<StoreController>,
    /// The L1 (CPU memory) manager.
    #[serde(default, deserialize_with = "lenient")]
    pub l1_manager: Option<L1Manager>,
}

/// One `storage_manager.l2_adapters[]` entry. Only the fields named here are
/// kept: anything else an adapter reports (possibly a credential) is dropped
/// at parse time and can never reach a log or `inspect`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct L2AdapterStatus {
    /// `FSNativeL2Adapter`, `FSL2Adapter`, `S3L2Adapter`, ...
    #[serde(default, rename = "type", deserialize_with = "lenient")]
    pub adapter_type: Option<String>,
    /// Health of this tier.
    #[serde(default, deserialize_with = "lenient")]
    pub is_healthy: Option<bool>,
    /// Directory of a filesystem tier.
    #[serde(default, deserialize_with = "lenient")]
    pub base_path: Option<String>,
    /// Whether a filesystem tier uses O_DIRECT.
    #[serde(default, deserialize_with = "lenient")]
    pub use_odirect: Option<bool>,
    /// I/O worker threads (fs_native).
    #[serde(default, deserialize_with = "lenient")]
    pub num_workers: Option<u64>,
    /// Endpoint of an S3 tier (`<bucket>.<host>[:port]`).
    #[serde(default, deserialize_with = "lenient")]
    pub endpoint: Option<String>,
    /// Region of an S3 tier.
    #[serde(default, deserialize_with = "lenient")]
    pub region: Option<String>,
    /// Failed connections of an S3 tier.
    #[serde(default, deserialize_with = "lenient")]
    pub connection_failures: Option<u64>,
    /// Whether an S3 tier gave up connecting.
    #[serde(default, deserialize_with = "lenient")]
    pub connection_disabled: Option<bool>,
    /// Bytes an S3 tier holds, by its own count.
    #[serde(default, deserialize_with = "lenient")]
    pub current_size_bytes: Option<u64>,
    /// Capacity of an S3 tier in bytes.
    #[serde(default, deserialize_with = "lenient")]
    pub max_capacity_bytes: Option<u64>,
    /// The device of a `raw_block` tier (`RawBlockL2Adapter`'s `core`).
    #[serde(
        default,
        deserialize_with = "lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub core: Option<RawBlockCore>,
}

/// The `core` of a `RawBlockL2Adapter` entry (`RawBlockCore.report_status`
/// in LMCache 0.5.6): its device and how much of it the tier uses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct RawBlockCore {
    /// The block device, e.g. `/dev/nvme1n1`.
    #[serde(default, deserialize_with = "lenient")]
    pub device_path: Option<String>,
    /// Bytes of one object's slot on the device.
    #[serde(default, deserialize_with = "lenient")]
    pub slot_bytes: Option<u64>,
    /// Bytes of the device the tier can hold objects in (its slots).
    #[serde(default, deserialize_with = "lenient")]
    pub usable_capacity_bytes: Option<u64>,
    /// Objects the tier holds, one slot each.
    #[serde(default, deserialize_with = "lenient")]
    pub indexed_key_count: Option<u64>,
}

impl RawBlockCore {
    /// Bytes the tier's objects take: one slot each.
    pub fn used_bytes(&self) -> Option<u64> {
        self.indexed_key_count?.checked_mul(self.slot_bytes?)
    }
}

/// `storage_manager.l2_eviction_controller`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct L2EvictionController {
    /// Health of the controller.
    #[serde(default, deserialize_with = "lenient")]
    pub is_healthy: Option<bool>,
    /// One entry per tier that has a capacity, in cascade order, without a
    /// type or path (see [`ServerStatus::tiers`]).
    #[serde(default, deserialize_with = "lenient_list")]
    pub adapters: Vec<EvictionStatus>,
}

/// Capacity and usage of one tier LMCache evicts.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct EvictionStatus {
    /// `LRU`, ...
    #[serde(default, deserialize_with = "lenient")]
    pub eviction_policy: Option<String>,
    /// Usage fraction that starts an eviction (0..1).
    #[serde(default, deserialize_with = "lenient")]
    pub trigger_watermark: Option<f64>,
    /// Fraction of the capacity an eviction frees (0..1).
    #[serde(default, deserialize_with = "lenient")]
    pub eviction_ratio: Option<f64>,
    /// Usage as a fraction of the capacity (0..1).
    #[serde(default, deserialize_with = "lenient")]
    pub current_usage: Option<f64>,
    /// Bytes used, by LMCache's count (fs_native starts it at 0 on every start).
    #[serde(default, deserialize_with = "lenient")]
    pub total_bytes_used: Option<u64>,
    /// Capacity in bytes.
    #[serde(default, deserialize_with = "lenient")]
    pub total_capacity_bytes: Option<u64>,
}

/// The store controller (moves chunks from L1 to L2).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct StoreController {
    /// Health of the controller.
    #[serde(default, deserialize_with = "lenient")]
    pub is_healthy: Option<bool>,
    /// Whether its thread runs.
    #[serde(default, deserialize_with = "lenient")]
    pub thread_alive: Option<bool>,
    /// Keys waiting to be stored.
    #[serde(default, deserialize_with = "lenient")]
    pub pending_keys_count: Option<u64>,
    /// Store tasks in flight.
    #[serde(default, deserialize_with = "lenient")]
    pub in_flight_task_count: Option<u64>,
    /// L2 tiers it stores to.
    #[serde(default, deserialize_with = "lenient")]
    pub num_l2_adapters: Option<u64>,
    /// Tiers accepting stores.
    #[serde(default, deserialize_with = "lenient")]
    pub num_active_adapters: Option<u64>,
    /// Tiers being drained.
    #[serde(default, deserialize_with = "lenient")]
    pub num_draining_adapters: Option<u64>,
}

/// `storage_manager.l1_manager`: the CPU memory tier.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct L1Manager {
    /// Health of L1.
    #[serde(default, deserialize_with = "lenient")]
    pub is_healthy: Option<bool>,
    /// Chunks held.
    #[serde(default, deserialize_with = "lenient")]
    pub total_object_count: Option<u64>,
    /// Bytes used.
    #[serde(default, deserialize_with = "lenient")]
    pub memory_used_bytes: Option<u64>,
    /// Bytes allocated for L1.
    #[serde(default, deserialize_with = "lenient")]
    pub memory_total_bytes: Option<u64>,
}

/// `worker_liveness`: engine workers registered with the server.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct WorkerLiveness {
    /// Whether the server reaps silent workers.
    #[serde(default, deserialize_with = "lenient")]
    pub enabled: Option<bool>,
    /// Seconds without a PING before a worker is reaped.
    #[serde(default, deserialize_with = "lenient")]
    pub reap_timeout_seconds: Option<f64>,
    /// Seconds a registered worker that never sent a PING is kept.
    #[serde(default, deserialize_with = "lenient")]
    pub registration_grace_seconds: Option<f64>,
    /// Engine workers attached now.
    #[serde(default, deserialize_with = "lenient")]
    pub tracked_instances: Option<u64>,
    /// The last run of LMCache's worker reaper, read by [`StatusClient::poll`]
    /// from the reaper's own route when `enabled` is true. Not part of the
    /// `/status` body; `None` when reaping is off or the route did not answer.
    #[serde(default, skip_deserializing, skip_serializing_if = "Option::is_none")]
    pub reaper: Option<ReaperRun>,
}

/// The name LMCache 0.5.6 gives its worker reaper, a periodic thread that
/// runs every `reap_timeout_seconds / 4` and drops workers that went silent.
/// Its HTTP server shows each periodic thread's last run at
/// `/periodic-threads/<name>` (`fixtures/lmcache-0.5.6/periodic-threads/`).
pub(crate) const REAPER_THREAD: &str = "lmcache-mp-worker-reaper";

/// The last run of LMCache's worker reaper: how many runs so far and how
/// many workers the last one reaped. A fall in `tracked_instances` that no
/// reaper run explains is a clean unregistration (`docs/inspect.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ReaperRun {
    /// Runs since the server started (`total_runs`).
    pub total_runs: u64,
    /// Workers the last run reaped, from its summary `reaped=N`; `None`
    /// when the summary is missing or says something else.
    pub reaped: Option<u64>,
}

impl ReaperRun {
    /// Reads a body of `GET /periodic-threads/lmcache-mp-worker-reaper`;
    /// `None` when it is not the reaper's (no `total_runs`, another name).
    pub fn parse(body: &[u8]) -> Option<ReaperRun> {
        let value: serde_json::Value = serde_json::from_slice(body).ok()?;
        if value["name"] != REAPER_THREAD {
            return None;
        }
        let reaped = value["last_summary"]["message"]
            .as_str()
            .and_then(|m| m.strip_prefix("reaped="))
            .and_then(|n| n.parse().ok());
        Some(ReaperRun {
            total_runs: value["total_runs"].as_u64()?,
            reaped,
        })
    }
}

/// One L2 tier as `/status` reports it, with its capacity and usage when
/// LMCache evicts it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierStatus {
    /// Position in the cascade (0 = first tier).
    pub position: usize,
    /// The adapter's own entry.
    pub adapter: L2AdapterStatus,
    /// Its `l2_eviction_controller.adapters[]` entry, when one maps to it.
    pub eviction: Option<EvictionStatus>,
}

impl ServerStatus {
    /// Parses a `/status` body; missing or mistyped fields read as absent.
    ///
    /// # Errors
    /// [`AnswerError::NotJson`], or those of [`ServerStatus::from_value`].
    pub fn parse(body: &[u8]) -> Result<Self, AnswerError> {
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(AnswerError::NotJson)?;
        Self::from_value(value)
    }

    /// Reads an already-parsed body.
    ///
    /// # Errors
    /// [`AnswerError::NotAnObject`] when it is not a JSON object.
    pub fn from_value(value: serde_json::Value) -> Result<Self, AnswerError> {
        if !value.is_object() {
            return Err(AnswerError::NotAnObject {
                kind: json_kind(&value),
            });
        }
        serde_json::from_value(value).map_err(AnswerError::Unreadable)
    }

    /// `worker_liveness.tracked_instances`, when reported.
    pub fn tracked_instances(&self) -> Option<u64> {
        self.worker_liveness.as_ref()?.tracked_instances
    }

    /// The store controller: under `storage_manager` (LMCache 0.5.6), else
    /// at the top level.
    pub(crate) fn store_controller(&self) -> Option<&StoreController> {
        self.storage_manager
            .as_ref()
            .and_then(|s| s.store_controller.as_ref())
            .or(self.store_controller.as_ref())
    }

    /// The L1 manager, when reported.
    pub fn l1(&self) -> Option<&L1Manager> {
        self.storage_manager.as_ref()?.l1_manager.as_ref()
    }

    /// Whether the server and every part it reports are healthy. A part that
    /// does not report `is_healthy` counts as healthy; `false` anywhere
    /// (server, storage manager, a tier, the store controller) does not.
    pub(crate) fn unhealthy_parts(&self) -> Vec<String> {
        let mut parts = Vec::new();
        if self.is_healthy == Some(false) {
            parts.push("server".to_string());
        }
        if let Some(sm) = &self.storage_manager {
            if sm.is_healthy == Some(false) {
                parts.push("storage_manager".to_string());
            }
            for (i, a) in sm.l2_adapters.iter().enumerate() {
                if a.is_healthy == Some(false) {
                    parts.push(format!(
                        "l2_adapters[{i}] ({})",
                        a.adapter_type.as_deref().unwrap_or("unknown type")
                    ));
                }
            }
        }
        if self.store_controller().and_then(|c| c.is_healthy) == Some(false) {
            parts.push("store_controller".to_string());
        }
        parts
    }

    /// The L2 tiers in cascade order, each with its eviction entry.
    ///
    /// `l2_eviction_controller.adapters[]` lists only the tiers that have a
    /// capacity, in cascade order, without naming them (LMCache 0.5.6).
    /// `declares_capacity` says which tiers LMCache evicts itself
    /// (`TierSpec::lmcache_evicts` of the spec crate: an `eviction` block
    /// with a capacity), one flag per tier in cascade order; the entries are
    /// then mapped by position among those tiers. Without it (or
    /// when it does not fit the body), tiers are taken to declare a capacity
    /// when they are `FSNativeL2Adapter` (the built-in tier always has one)
    /// or report `max_capacity_bytes` (S3). When the counts still disagree no
    /// entry is mapped: a wrong capacity is worse than none.
    pub fn tiers(&self, declares_capacity: Option<&[bool]>) -> Vec<TierStatus> {
        let Some(sm) = &self.storage_manager else {
            return Vec::new();
        };
        let entries = sm
            .l2_eviction_controller
            .as_ref()
            .map(|c| c.adapters.as_slice())
            .unwrap_or_default();
        let guessed: Vec<bool> = sm
            .l2_adapters
            .iter()
            .map(|a| {
                a.adapter_type.as_deref() == Some("FSNativeL2Adapter")
                    || a.max_capacity_bytes.is_some_and(|b| b > 0)
            })
            .collect();
        let fits = |flags: &[bool]| {
            flags.len() == sm.l2_adapters.len()
                && flags.iter().filter(|d| **d).count() == entries.len()
        };
        let flags: Option<&[bool]> = match declares_capacity {
            Some(given) if fits(given) => Some(given),
            _ if fits(&guessed) => Some(&guessed),
            _ => None,
        };
        let mut next = entries.iter();
        sm.l2_adapters
            .iter()
            .enumerate()
            .map(|(position, adapter)| TierStatus {
                position,
                adapter: adapter.clone(),
                eviction: match flags {
                    Some(f) if f[position] => next.next().cloned(),
                    _ => None,
                },
            })
            .collect()
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

/// What one poll of `/status` saw.
#[derive(Debug, Clone, PartialEq)]
pub enum Poll {
    /// 200 with a JSON object.
    Up(Box<ServerStatus>),
    /// 200 with a body that is not a JSON object: what is wrong with it.
    Malformed(String),
    /// An HTTP answer other than 200 (503 while the engine is not up).
    NotReady(u16),
    /// No HTTP answer (refused, timed out, reset): the error text.
    NoAnswer(String),
}

impl Poll {
    /// One line for logs, e.g. `HTTP 503`.
    pub fn describe(&self) -> String {
        match self {
            Poll::Up(_) => "HTTP 200".to_string(),
            Poll::Malformed(e) => format!("HTTP 200 with an unusable body ({e})"),
            Poll::NotReady(401) => "HTTP 401: the server wants an API key, and this request carried none or not one it accepts (docs/configuration.md, \"The server's API key\")".to_string(),
            Poll::NotReady(code) => format!("HTTP {code}"),
            Poll::NoAnswer(e) => format!("no answer ({e})"),
        }
    }
}

/// Polls one server's `/status`.
#[derive(Debug, Clone)]
pub struct StatusClient {
    http: reqwest::Client,
    url: String,
    api_key: Option<ApiKey>,
}

impl StatusClient {
    /// A client of `url` (e.g. `http://127.0.0.1:8090/status`) with the
    /// default [`REQUEST_TIMEOUT`].
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_timeout(url, REQUEST_TIMEOUT)
    }

    /// A client of `url` whose requests give up after `timeout`. Proxies
    /// from the environment are ignored: the server is on loopback. A client
    /// that cannot be built (no TLS is involved, so only on a broken host)
    /// answers every poll with [`Poll::NoAnswer`] saying why.
    pub(crate) fn with_timeout(url: impl Into<String>, timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        StatusClient {
            http,
            url: url.into(),
            api_key: None,
        }
    }

    /// This client with each request carrying `key` as
    /// `Authorization: Bearer` (a server with an API key answers 401
    /// without it: [`crate::plan::api_key`]).
    pub fn with_api_key(mut self, key: Option<ApiKey>) -> Self {
        self.api_key = key;
        self
    }

    /// A GET of `url`, with the key when there is one.
    fn get(&self, url: impl reqwest::IntoUrl) -> reqwest::RequestBuilder {
        let request = self.http.get(url);
        match &self.api_key {
            Some(key) => request.header(reqwest::header::AUTHORIZATION, key.bearer()),
            None => request,
        }
    }

    /// The polled URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One GET of `/status`, and of the reaper's route when the body says
    /// reaping is enabled ([`WorkerLiveness::reaper`]).
    pub async fn poll(&self) -> Poll {
        match self.get(&self.url).send().await {
            Ok(resp) if resp.status().as_u16() == 200 => match read_answer(resp).await {
                Ok(mut status) => {
                    if let Some(liveness) = status.worker_liveness.as_mut() {
                        if liveness.enabled == Some(true) {
                            liveness.reaper = self.reaper().await;
                        }
                    }
                    Poll::Up(Box::new(status))
                }
                Err(e) => Poll::Malformed(e.to_string()),
            },
            Ok(resp) => Poll::NotReady(resp.status().as_u16()),
            // Without the URL: its query or user info may hold a secret.
            Err(e) => Poll::NoAnswer(error_chain(&e.without_url())),
        }
    }

    /// The reaper's last run; `None` when its route does not answer 200
    /// with the reaper's body.
    async fn reaper(&self) -> Option<ReaperRun> {
        let route = format!("periodic-threads/{REAPER_THREAD}");
        let url = reqwest::Url::parse(&self.url).ok()?.join(&route).ok()?;
        let resp = self.get(url).send().await.ok()?;
        if resp.status().as_u16() != 200 {
            return None;
        }
        ReaperRun::parse(&capped_body(resp, STATUS_MAX_BYTES).await.ok()?)
    }
}

/// The status in a 200 answer, once [`check_lmcache_answer`] says it is
/// LMCache's.
async fn read_answer(resp: reqwest::Response) -> Result<ServerStatus, AnswerError> {
    let body = capped_body(resp, STATUS_MAX_BYTES).await?;
    let value = serde_json::from_slice(&body).map_err(AnswerError::NotJson)?;
    check_lmcache_answer(&value)?;
    ServerStatus::from_value(value)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A recorded `/status` body of LMCache 0.5.6 (`fixtures/lmcache-0.5.6/status/`).
    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../fixtures/lmcache-0.5.6/status/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
    }

    /// A recorded body of LMCache 0.5.6's reaper route.
    fn reaper_fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/../fixtures/lmcache-0.5.6/periodic-threads/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
    }

    #[test]
    fn the_reaper_route_reads_its_runs_and_the_last_runs_reaped_count() {
        let idle = ReaperRun::parse(&reaper_fixture("reaper-idle.json"));
        assert_eq!(
            idle,
            Some(ReaperRun {
                total_runs: 5,
                reaped: Some(0)
            })
        );
        let reaped = ReaperRun::parse(&reaper_fixture("reaper-reaped.json"));
        assert_eq!(
            reaped,
            Some(ReaperRun {
                total_runs: 12,
                reaped: Some(1)
            })
        );
        let other = br#"{"name":"DeviceHostFuncDispatcher","total_runs":5}"#;
        assert_eq!(ReaperRun::parse(other), None);
        assert_eq!(ReaperRun::parse(b"<html>"), None);
        let odd = br#"{"name":"lmcache-mp-worker-reaper","total_runs":2,"last_summary":{"message":"busy"}}"#;
        assert_eq!(
            ReaperRun::parse(odd),
            Some(ReaperRun {
                total_runs: 2,
                reaped: None
            })
        );
    }

    #[test]
    fn the_idle_fixture_reads_tiers_in_cascade_order_with_their_capacity() {
        let status = ServerStatus::parse(&fixture("status-idle.json")).unwrap();
        assert_eq!(status.is_healthy, Some(true));
        assert_eq!(status.chunk_size, Some(256));
        assert_eq!(status.tracked_instances(), Some(0));
        let tiers = status.tiers(None);
        let types: Vec<_> = tiers
            .iter()
            .map(|t| t.adapter.adapter_type.as_deref().unwrap())
            .collect();
        assert_eq!(types, ["FSNativeL2Adapter", "FSL2Adapter", "S3L2Adapter"]);
        let capacity = |i: usize| {
            tiers[i]
                .eviction
                .as_ref()
                .and_then(|e| e.total_capacity_bytes)
        };
        assert_eq!(capacity(0), Some(2 << 30));
        assert_eq!(capacity(1), None);
        assert_eq!(capacity(2), Some(5 << 30));
        assert_eq!(tiers[0].adapter.num_workers, Some(4));
        assert_eq!(tiers[0].adapter.use_odirect, Some(true));
        assert_eq!(
            tiers[2].adapter.endpoint.as_deref(),
            Some("kvcache.localtest:5055")
        );
        assert_eq!(status.l1().unwrap().memory_total_bytes, Some(1 << 30));
        assert!(status.unhealthy_parts().is_empty());
    }

    #[test]
    fn the_spec_decides_the_capacity_mapping_when_it_fits() {
        let status = ServerStatus::parse(&fixture("status-idle.json")).unwrap();
        // A spec where the fs tier (not the fs_native one) has the capacity.
        let tiers = status.tiers(Some(&[false, true, true]));
        assert!(tiers[0].eviction.is_none());
        assert_eq!(
            tiers[1].eviction.as_ref().unwrap().total_capacity_bytes,
            Some(2 << 30)
        );
        // A spec that does not fit the body falls back to the guess.
        let tiers = status.tiers(Some(&[true]));
        assert!(tiers[0].eviction.is_some() && tiers[1].eviction.is_none());
    }

    #[test]
    fn counts_that_cannot_be_mapped_map_nothing() {
        let body = br#"{"storage_manager":{"l2_adapters":[{"type":"FSL2Adapter"}],
            "l2_eviction_controller":{"adapters":[{"total_capacity_bytes":1}]}}}"#;
        let status = ServerStatus::parse(body).unwrap();
        assert!(status.tiers(None)[0].eviction.is_none());
    }

    #[test]
    fn the_store_controller_is_found_at_either_level() {
        let nested = ServerStatus::parse(&fixture("status-worker-attached.json")).unwrap();
        assert_eq!(
            nested.store_controller().unwrap().in_flight_task_count,
            Some(2)
        );
        let top = ServerStatus::parse(
            br#"{"store_controller":{"is_healthy":false,"pending_keys_count":7}}"#,
        )
        .unwrap();
        assert_eq!(top.store_controller().unwrap().pending_keys_count, Some(7));
        assert_eq!(top.unhealthy_parts(), ["store_controller"]);
    }

    #[test]
    fn missing_new_and_mistyped_fields_do_not_fail_the_body() {
        let status = ServerStatus::parse(
            br#"{"is_healthy":"yes","brand_new":{"x":1},
                "worker_liveness":{"tracked_instances":"two","enabled":true},
                "storage_manager":{"l2_adapters":[{"type":"FSL2Adapter","is_healthy":false},7]}}"#,
        )
        .unwrap();
        assert_eq!(status.is_healthy, None);
        assert_eq!(status.tracked_instances(), None);
        assert_eq!(status.worker_liveness.unwrap().enabled, Some(true));
        let sm = status.storage_manager.unwrap();
        assert_eq!(sm.l2_adapters.len(), 1);
        assert_eq!(ServerStatus::parse(b"{}").unwrap(), ServerStatus::default());
    }

    #[test]
    fn bodies_that_are_not_objects_are_errors_that_say_what_they_are() {
        assert!(ServerStatus::parse(b"<html>")
            .unwrap_err()
            .to_string()
            .contains("not JSON"));
        assert!(ServerStatus::parse(b"[1,2]")
            .unwrap_err()
            .to_string()
            .contains("array"));
        assert!(ServerStatus::parse(b"null")
            .unwrap_err()
            .to_string()
            .contains("null"));
    }

    #[test]
    fn adapter_fields_outside_the_model_are_dropped() {
        let status = ServerStatus::parse(
            br#"{"storage_manager":{"l2_adapters":[{"type":"S3L2Adapter","aws_secret_access_key":"s3cr3t"}]}}"#,
        )
        .unwrap();
        let printed = serde_json::to_string(&status).unwrap();
        assert!(!printed.contains("s3cr3t"), "{printed}");
    }

    /// Serves one raw HTTP answer on 127.0.0.1 and returns the URL.
    async fn answer_once(head: &'static str, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/status", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&body).await;
        });
        url
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_answer_without_lmcaches_fields_is_not_the_server() {
        for body in [
            &b"{}"[..],
            br#"{"is_healthy":true}"#,
            br#"{"engine_type":"x"}"#,
            br#"{"is_healthy":true,"storage_manager":[]}"#,
            br#"{"is_healthy":null,"engine_type":"MPCacheServer"}"#,
        ] {
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n";
            let url = answer_once(head, body.to_vec()).await;
            match StatusClient::new(url).poll().await {
                Poll::Malformed(why) => assert!(why.contains("without LMCache's fields"), "{why}"),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(body)),
            }
        }
        let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";
        for mistyped in [
            &br#"{"is_healthy":true,"engine_type":"x","storage_manager":{"is_healthy":"false"}}"#[..],
            br#"{"is_healthy":true,"storage_manager":{"l2_adapters":[{"is_healthy":null}]}}"#,
        ] {
            let url = answer_once(head, mistyped.to_vec()).await;
            match StatusClient::new(url).poll().await {
                Poll::Malformed(why) => {
                    assert!(why.contains("is_healthy is not true or false"), "{why}")
                }
                other => panic!("{other:?}"),
            }
        }
        let url = answer_once(head, fixture("status-idle.json")).await;
        assert!(matches!(StatusClient::new(url).poll().await, Poll::Up(_)));
        let moved = "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:1/status\r\nConnection: close\r\n\r\n";
        let url = answer_once(moved, Vec::new()).await;
        assert!(matches!(
            StatusClient::new(url).poll().await,
            Poll::NotReady(302)
        ));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_body_larger_than_the_cap_is_not_read_whole() {
        let declared = "HTTP/1.1 200 OK\r\nContent-Length: 3221225472\r\n\r\n";
        let url = answer_once(declared, b"{".to_vec()).await;
        match StatusClient::new(url).poll().await {
            Poll::Malformed(why) => assert!(why.contains("larger than 16777216 bytes"), "{why}"),
            other => panic!("{other:?}"),
        }
        let chunk = vec![b' '; 1 << 20];
        let mut chunked = Vec::new();
        for _ in 0..17 {
            chunked.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
            chunked.extend_from_slice(&chunk);
            chunked.extend_from_slice(b"\r\n");
        }
        chunked.extend_from_slice(b"0\r\n\r\n");
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        let url = answer_once(head, chunked).await;
        match StatusClient::new(url).poll().await {
            Poll::Malformed(why) => assert!(why.contains("larger than 16777216 bytes"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}

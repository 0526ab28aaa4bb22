//! The server's L1 (`--l1-size-gb`): the node's budget, the write buffer
//! when that is 0, `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` winning, and what the
//! plan says about a size against the memory (`docs/sizing.md`).

use lmcache_sizing::rules::{self, WRITE_BUFFER_L1_BYTES};
use lmcache_sizing::{fmt_gib, Decision, GIB};

use crate::node::env::{self, NodeEnv};
use crate::plan::inputs::PlanError;

/// The L1 the server gets: `--l1-size-gb` in
/// `EREBINE_AGENT_LMCACHE_EXTRA_ARGS`, else the `budget`, else (a budget of
/// 0) the write buffer's 1 GiB.
///
/// Errors: an extra `--l1-size-gb` that is not a size.
pub fn server_l1(node: &NodeEnv, budget: Decision<u64>) -> Result<Decision<u64>, PlanError> {
    let own = match budget.value {
        0 => write_buffer_l1(),
        _ => budget,
    };
    with_extra_l1(node, own)
}

/// The L1 the server gets judged against the node's memory
/// ([`rules::judge_l1`]): refused above the memory when set by hand, its
/// warnings otherwise.
pub(super) fn judge_l1(
    node: &NodeEnv,
    l1: &Decision<u64>,
    memory: &Decision<u64>,
) -> Result<Vec<String>, PlanError> {
    let setting = match l1.rule {
        "explicit" => Some(format!(
            "{}={}",
            env::KV_OFFLOAD_SIZE_GB,
            l1.value as f64 / GIB as f64
        )),
        "extra-args" => Some(format!(
            "{} --l1-size-gb {}",
            env::LMCACHE_EXTRA_ARGS,
            node.extra_args.value("--l1-size-gb").unwrap_or_default()
        )),
        _ => None,
    };
    Ok(rules::judge_l1(
        l1.value,
        setting.as_deref(),
        memory,
        node.host_agent_count,
    )?)
}

/// A warning for an L1 above 0 but below the 1 GiB a write buffer gets:
/// LMCache stages every chunk in L1 on its way to L2 and serves hits from
/// it, and one 256-token chunk of an 8B model is already 32 MiB.
pub(super) fn small_l1_warning(l1_bytes: u64) -> Option<String> {
    (l1_bytes > 0 && l1_bytes < WRITE_BUFFER_L1_BYTES).then(|| {
        format!(
            "L1 is {}, below 1 GiB: LMCache stages every chunk in L1 on its way to L2 and serves hits from it, and one 256-token chunk of an 8B model is 32 MiB; give L1 at least 1 GiB, or 0 for a write buffer",
            fmt_gib(l1_bytes)
        )
    })
}

/// The L1 of a write-buffer-only server.
pub(super) fn write_buffer_l1() -> Decision<u64> {
    Decision::new(
        WRITE_BUFFER_L1_BYTES,
        "write-buffer",
        "L1 budget is 0: L1 runs as a write buffer only (eviction noop, l2-store-policy skip_l1) with the smallest L1 that stages chunks, 1 GiB",
    )
}

/// `own`, or the `--l1-size-gb` of `EREBINE_AGENT_LMCACHE_EXTRA_ARGS` that
/// replaces it.
pub(super) fn with_extra_l1(
    node: &NodeEnv,
    own: Decision<u64>,
) -> Result<Decision<u64>, PlanError> {
    Ok(
        match (extra_l1_bytes(node)?, node.extra_args.value("--l1-size-gb")) {
            (Some(bytes), Some(text)) => Decision::new(
                bytes,
                "extra-args",
                format!(
                    "EREBINE_AGENT_LMCACHE_EXTRA_ARGS --l1-size-gb {text} replaces the node's {} ({})",
                    fmt_gib(own.value),
                    own.reason
                ),
            ),
            _ => own,
        },
    )
}

pub(super) fn extra_l1_bytes(node: &NodeEnv) -> Result<Option<u64>, PlanError> {
    Ok(node
        .extra_args
        .value("--l1-size-gb")
        .map(|v| env::parse_gib(env::LMCACHE_EXTRA_ARGS, v))
        .transpose()?)
}

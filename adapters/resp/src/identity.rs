//! The cache identities a Redis has served (`docs/redis.md`, "Cache
//! identity"). LMCache's RESP keys (`<model>@<rank>@<group>@<chunk
//! hash>`, LMCache 0.5.6's `_object_key_to_string`) name the model but
//! not the weights or settings behind it, and LMCache's `resp` adapter
//! has no key prefix to put them under: launches of one model with other
//! weights read each other's KV from a shared Redis. Nothing here can
//! fence them apart. Each launch records its identity's tag in one hash
//! per model, [`marker_key`], field = tag, value = the Unix second it
//! started, and is warned when the hash holds another tag: the Redis is
//! shared across identities, unfenced.

/// The prefix of the hashes: a name LMCache never writes (its keys end in
/// `@<rank>@<group>@<chunk hash>`).
pub const MARKER_PREFIX: &str = "lmcache-tier:cache-identities:";

/// A launch's cache identity, as a Redis records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheIdentity {
    /// The model LMCache writes its keys under (vLLM's `--model`).
    pub model: String,
    /// The identity's tag (16 hex digits, `docs/configuration.md`, "The
    /// cache identity").
    pub tag: String,
}

/// The hash that records the identities of `model`.
pub fn marker_key(model: &str) -> String {
    format!("{MARKER_PREFIX}{model}")
}

/// How many fields of the hash a launch reads (`HRANDFIELD`): other
/// nodes write it, so what a launch reads of it is bounded whatever it
/// holds.
pub const MOST_READ: usize = 64;

/// How many other tags a warning names; it counts the rest.
pub const MOST_NAMED: usize = 8;

/// The tags of `recorded` (the hash's fields, written by any node) other
/// than `tag`, sorted: only fields shaped as a tag (16 lowercase hex
/// digits) count, so nothing else another writer put there reaches a log
/// line.
pub fn other_tags(recorded: impl IntoIterator<Item = String>, tag: &str) -> Vec<String> {
    let is_tag =
        |t: &String| t.len() == 16 && t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let mut others: Vec<String> = recorded
        .into_iter()
        .filter(|t| t != tag && is_tag(t))
        .collect();
    others.sort();
    others.dedup();
    others
}

/// The warning for a Redis at `address` (tier `position`) that served
/// `identity`'s model under the tags `others` too.
pub fn unfenced_warning(
    position: usize,
    address: &str,
    identity: &CacheIdentity,
    others: &[String],
) -> String {
    format!(
        "L2 tier {position} (resp): Redis at {address} has served model {:?} under other cache identities too ({}; this launch's is {}): LMCache's resp keys name the model but not its weights or settings, so the launches read each other's KV unfenced. Give each cache identity its own Redis (or Redis database), or clear this one (its hash {} lists the identities)",
        identity.model,
        named(others),
        identity.tag,
        marker_key(&identity.model)
    )
}

/// `others`, at most [`MOST_NAMED`] of them, and how many more.
fn named(others: &[String]) -> String {
    let shown = others[..others.len().min(MOST_NAMED)].join(", ");
    match others.len().saturating_sub(MOST_NAMED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

/// Records `identity` in its Redis at `now` (Unix seconds) and returns
/// other tags recorded there (of at most [`MOST_READ`] fields read).
///
/// # Errors
/// The client's.
pub(crate) fn record(
    connection: &mut redis::Connection,
    identity: &CacheIdentity,
    now: u64,
) -> redis::RedisResult<Vec<String>> {
    let key = marker_key(&identity.model);
    redis::cmd("HSET")
        .arg(&key)
        .arg(&identity.tag)
        .arg(now)
        .query::<()>(connection)?;
    let recorded: Vec<String> = redis::cmd("HRANDFIELD")
        .arg(&key)
        .arg(MOST_READ)
        .query(connection)?;
    Ok(other_tags(recorded, &identity.tag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_tags_leave_out_this_launchs_and_name_each_once() {
        let (a, b, ours) = ("aaaaaaaaaaaaaaaa", "0123456789abcdef", "1111111111111111");
        let recorded = [b, a, ours, b, "\u{1b}[2Jx", "ABCDEF0123456789", "short"].map(String::from);
        assert_eq!(other_tags(recorded, ours), [b, a], "tags alone, each once");
        assert!(other_tags(Vec::new(), "ours").is_empty());
    }

    #[test]
    fn the_warning_names_the_model_tags_and_hash() {
        let identity = CacheIdentity {
            model: "org/m".into(),
            tag: "1111".into(),
        };
        let text = unfenced_warning(2, "10.0.0.5:6379", &identity, &["2222".into()]);
        assert!(
            text.starts_with("L2 tier 2 (resp): Redis at 10.0.0.5:6379"),
            "{text}"
        );
        assert!(text.contains("(2222; this launch's is 1111)"), "{text}");
        let many: Vec<String> = (0..20).map(|n| format!("{n:016x}")).collect();
        let text = unfenced_warning(0, "h:1", &identity, &many);
        assert!(text.contains("0000000000000007 and 12 more;"), "{text}");
        assert!(!text.contains("0000000000000008"), "{text}");
        assert!(
            text.contains("lmcache-tier:cache-identities:org/m"),
            "{text}"
        );
        assert!(!marker_key("m").contains('@'), "never an LMCache key");
    }
}

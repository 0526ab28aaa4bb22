//! Redis's `INFO` answer, read: the fields the judge and the metrics use.
//! `INFO` is Redis's one report of its memory, eviction policy and
//! keyspace (`INFO` in the Redis manual: `key:value` lines under `#
//! Section` heads); Valkey answers the same fields. Pure: the caller asks.

/// What a Redis reports of itself; a field it leaves out is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisInfo {
    /// `redis_version`, or `valkey_version` on Valkey.
    pub version: Option<String>,
    /// `run_id`: random at every start of the Redis process, so a new one
    /// says it restarted.
    pub run_id: Option<String>,
    /// `used_memory`: bytes Redis has allocated, its own overhead included.
    pub used_memory: Option<u64>,
    /// `maxmemory`: bytes at which Redis applies its policy; 0 for none.
    pub maxmemory: Option<u64>,
    /// `maxmemory_policy`, e.g. `allkeys-lru`, `noeviction`.
    pub maxmemory_policy: Option<String>,
    /// `evicted_keys`: keys Redis evicted for `maxmemory` since it started.
    pub evicted_keys: Option<u64>,
    /// `keyspace_hits`: reads of a key that existed, every client's.
    pub keyspace_hits: Option<u64>,
    /// `keyspace_misses`: reads of a key that did not.
    pub keyspace_misses: Option<u64>,
    /// Keys in every database (the `keys=` of each `db<N>:` line).
    pub keys: u64,
    /// `maxclients`: the most connections it takes (Redis 7 gives it in
    /// `# Clients`).
    pub maxclients: Option<u64>,
    /// `connected_clients`: connections now, every client's.
    pub connected_clients: Option<u64>,
}

impl RedisInfo {
    /// The fields of an `INFO` answer; unknown lines and values that do not
    /// parse are left out, and so is a text field (version, `run_id`,
    /// policy) that is not up to 64 printable ASCII characters: the store
    /// wrote it, and logs and messages quote it.
    pub fn parse(text: &str) -> RedisInfo {
        let mut info = RedisInfo::default();
        for line in text.lines().map(str::trim_end) {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let number = || value.parse::<u64>().ok();
            let text = || {
                let plain = value.len() <= 64 && value.bytes().all(|b| b.is_ascii_graphic());
                plain.then(|| value.to_string())
            };
            match key {
                "redis_version" | "valkey_version" => {
                    info.version = info.version.take().or_else(text)
                }
                "run_id" => info.run_id = text(),
                "used_memory" => info.used_memory = number(),
                "maxmemory" => info.maxmemory = number(),
                "maxmemory_policy" => info.maxmemory_policy = text(),
                "evicted_keys" => info.evicted_keys = number(),
                "keyspace_hits" => info.keyspace_hits = number(),
                "keyspace_misses" => info.keyspace_misses = number(),
                "maxclients" => info.maxclients = number(),
                "connected_clients" => info.connected_clients = number(),
                db if db.starts_with("db") && db[2..].parse::<u32>().is_ok() => {
                    info.keys += keys_of(value)
                }
                _ => {}
            }
        }
        info
    }
}

/// The `keys=` of a keyspace line's value (`keys=128,expires=0,...`).
fn keys_of(value: &str) -> u64 {
    value
        .split(',')
        .find_map(|field| field.strip_prefix("keys="))
        .and_then(|keys| keys.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::RedisInfo;

    /// Parts of the answer of Debian's Redis 7.0.15 after a CPU bench run.
    const REDIS_7: &str = "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\nrun_id:4f1c0c5e6a1d3e0b8a7f0c2b9d8e7f6a5b4c3d2e\r\n\r\n# Clients\r\nconnected_clients:3\r\nmaxclients:10000\r\n\r\n# Memory\r\nused_memory:22072784\r\nused_memory_human:21.05M\r\nmaxmemory:536870912\r\nmaxmemory_human:512.00M\r\nmaxmemory_policy:allkeys-lru\r\n\r\n# Stats\r\nevicted_keys:0\r\nkeyspace_hits:128\r\nkeyspace_misses:128\r\n\r\n# Keyspace\r\ndb0:keys=128,expires=0,avg_ttl=0\r\ndb3:keys=2,expires=1,avg_ttl=10\r\n";

    #[test]
    fn the_fields_are_read_from_a_real_answer() {
        let info = RedisInfo::parse(REDIS_7);
        assert_eq!(info.version.as_deref(), Some("7.0.15"));
        assert_eq!(
            info.run_id.as_deref(),
            Some("4f1c0c5e6a1d3e0b8a7f0c2b9d8e7f6a5b4c3d2e")
        );
        assert_eq!(info.used_memory, Some(22_072_784));
        assert_eq!(info.maxmemory, Some(512 << 20));
        assert_eq!(info.maxmemory_policy.as_deref(), Some("allkeys-lru"));
        assert_eq!(info.evicted_keys, Some(0));
        assert_eq!(
            (info.keyspace_hits, info.keyspace_misses),
            (Some(128), Some(128))
        );
        assert_eq!(info.keys, 130, "every database's keys");
        assert_eq!(
            (info.connected_clients, info.maxclients),
            (Some(3), Some(10000))
        );
    }

    #[test]
    fn odd_answers_leave_fields_out() {
        let info = RedisInfo::parse(
            "valkey_version:8.0.1\nused_memory:lots\nmaxmemory:\ndbx:keys=9\ndb0:expires=1\n",
        );
        assert_eq!(info.version.as_deref(), Some("8.0.1"));
        assert_eq!((info.used_memory, info.maxmemory), (None, None));
        assert_eq!(info.keys, 0);
        assert_eq!(RedisInfo::parse(""), RedisInfo::default());
        let forged = RedisInfo::parse("maxmemory_policy:allkeys-lru\u{1b}[2J\nrun_id:a b\n");
        assert_eq!(
            (forged.maxmemory_policy, forged.run_id),
            (None, None),
            "a store's text that would forge a log line is left out"
        );
    }
}

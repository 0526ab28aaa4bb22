//! What a tier is, as the launcher acts on it: one reading of a spec's
//! `type` (and, for `s3`, of `s3_bucket`) that every crate matches on
//! instead of comparing adapter-type strings (`docs/design.md`, "Adding a
//! tier kind").

/// A tier's kind, read from its spec by [`crate::TierSpec::kind`].
///
/// Sources: LMCache 0.5.6's L2 adapter types (`fs`, `fs_native`, `s3`,
/// `raw_block`, `resp`, and the ones we only pass through such as `mock`);
/// `s3_bucket` is our extension (`docs/s3-gateway.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierKind<'a> {
    /// One of LMCache's disk tiers, a directory (`base_path`) on a local
    /// volume: `fs` (its file adapter, `native: false`), bounded by our
    /// capacity guard, or `fs_native` (`native: true`), which LMCache also
    /// bounds itself when it has an `eviction` block.
    Disk {
        /// `fs_native` rather than `fs`.
        native: bool,
    },
    /// `s3` with an `s3_bucket` key (any value; a bad one is refused where
    /// the gateway starts): served path-style through our loopback gateway,
    /// which holds the bucket bound.
    Bucket,
    /// `s3` without `s3_bucket`: LMCache's own S3 client, bounded by LMCache
    /// alone.
    Object,
    /// `resp`: a Redis (or Valkey) server at `host`:`port`, written
    /// through LMCache's native RESP client (LMCache 0.5.6's
    /// `RESPL2AdapterConfig`, the `lmcache_redis` extension its wheel
    /// ships); checked and watched by our `lmcache-resp` adapter.
    Resp,
    /// `raw_block`: LMCache's tier on a whole block device
    /// (`device_path`, [`crate::TierSpec::device_path`]), written through
    /// its Rust raw-block extension (LMCache 0.5.6's
    /// `RawBlockL2AdapterConfig`).
    RawBlock,
    /// Any other adapter type, passed to LMCache as written (`mock`,
    /// `hf3fs`, ...); the text is the spec's `type`.
    Other(&'a str),
}

impl<'a> TierKind<'a> {
    /// The kind of a tier whose `type` is `adapter_type` and which has
    /// (`has_bucket`) or lacks an `s3_bucket` key.
    pub fn of(adapter_type: &'a str, has_bucket: bool) -> Self {
        match (adapter_type, has_bucket) {
            ("fs", _) => TierKind::Disk { native: false },
            ("fs_native", _) => TierKind::Disk { native: true },
            ("s3", true) => TierKind::Bucket,
            ("s3", false) => TierKind::Object,
            ("raw_block", _) => TierKind::RawBlock,
            ("resp", _) => TierKind::Resp,
            (other, _) => TierKind::Other(other),
        }
    }

    /// Whether it is a disk tier (`fs` or `fs_native`).
    pub fn is_disk(self) -> bool {
        matches!(self, TierKind::Disk { .. })
    }

    /// Whether it is a Redis (`resp`) tier.
    pub fn is_resp(self) -> bool {
        self == TierKind::Resp
    }

    /// Whether it is served through our S3 gateway.
    pub fn is_bucket(self) -> bool {
        self == TierKind::Bucket
    }
}

#[cfg(test)]
mod tests {
    use super::TierKind;
    use crate::Cascade;

    #[test]
    fn each_adapter_type_reads_as_its_kind() {
        let cascade = Cascade::parse(
            r#"[{"type":"fs","base_path":"/a"},{"type":"fs_native","base_path":"/b"},
                {"type":"s3","s3_bucket":"kv"},{"type":"s3","s3_bucket":null},
                {"type":"s3","s3_endpoint":"s3.example.net"},{"type":"raw_block","device_path":"/dev/x"},
                {"type":"mock"},{"type":"FS"},{"type":""},{"type":"resp","host":"h","port":1},
                {"type":"fs","base_path":"/data/s3_bucket","s3_bucket":"kv"}]"#,
            "test",
        )
        .unwrap();
        let kinds: Vec<TierKind> = cascade.tiers().iter().map(|t| t.kind()).collect();
        assert_eq!(
            kinds,
            [
                TierKind::Disk { native: false },
                TierKind::Disk { native: true },
                TierKind::Bucket,
                TierKind::Bucket,
                TierKind::Object,
                TierKind::RawBlock,
                TierKind::Other("mock"),
                TierKind::Other("FS"),
                TierKind::Other(""),
                TierKind::Resp,
                TierKind::Disk { native: false },
            ]
        );
        let disks: Vec<bool> = kinds.iter().map(|k| k.is_disk()).collect();
        assert_eq!(
            disks,
            [true, true, false, false, false, false, false, false, false, false, true]
        );
        let buckets = kinds.iter().filter(|k| k.is_bucket()).count();
        assert_eq!(buckets, 2);
        assert_eq!(kinds.iter().filter(|k| k.is_resp()).count(), 1);
        let devices: Vec<Option<&str>> = cascade.tiers().iter().map(|t| t.device_path()).collect();
        assert_eq!(devices[5], Some("/dev/x"));
        assert_eq!(devices.iter().flatten().count(), 1, "{devices:?}");
    }
}

//! The launch identity and the identity manifest kept in the tier directory.
//!
//! Nothing in an object name records the KV dtype, the block size, the
//! chunk size, the weights or the engine's numeric settings (LMCache
//! 0.5.6's object names), so the directory remembers them in [`MANIFEST_FILE_NAME`] (`docs/configuration.md`).
//!
//! The manifest is JSON:
//! ```json
//! {
//!   "schema_version": 1,
//!   "identity": {"model": "org/m", "tensor_parallel_size": 4,
//!                "pipeline_parallel_size": 1, "kv_cache_dtype": "bfloat16",
//!                "block_size": 16, "chunk_size": 256,
//!                "weights": "commit 0123abcd...",
//!                "engine_settings": {"dtype": "bfloat16"}},
//!   "identity_digest": "<blake3 hex of LaunchIdentity::canonical_form>",
//!   "writer": "lmcache-housekeeping 0.1.0",
//!   "written_at": "2025-11-30T07:42:00Z"
//! }
//! ```
//! Readers ignore fields they do not know, so a cache written by an earlier
//! or later version is kept while the identity fields are equal.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::codec::{DATA_SUFFIX, MODEL_SEPARATOR};
use crate::tier_dir::{
    read_control_file, replace_control_file, ReplaceError, ReplaceStep, TierDir, TierDirError,
};

/// File name of the identity manifest in a tier directory.
pub const MANIFEST_FILE_NAME: &str = ".lmcache-tier-identity.json";
/// Temporary name the manifest is written under before the rename; a leftover
/// one is a stale temp file.
pub const MANIFEST_TEMP_FILE_NAME: &str = ".lmcache-tier-identity.json.tmp";
/// Schema version this crate writes.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;
/// Largest manifest read, in bytes; a larger file is treated as corrupt.
pub const MANIFEST_MAX_BYTES: u64 = 64 * 1024;

/// What the objects in a tier were written for. Objects are usable only by a
/// launch with an equal identity (`docs/configuration.md`, "The launch
/// identity": each field, the engine flag it comes from and how LMCache
/// 0.5.6 spells it).
///
/// Two fields are in every object name: the model, as
/// [`Self::lmcache_model_name`] writes it, and the world size packed in the
/// kv_rank, [`Self::kv_world_size`]. The KV dtype, block size and chunk size
/// are in no name, so the manifest records them. The DCP and MLA fields are
/// inputs of those two names; at their defaults (1, 1, `false`) they are left
/// out of the JSON and of [`Self::canonical_form`], so a manifest written
/// before they existed reads back with the same digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchIdentity {
    /// The model as the engine names it to LMCache: vLLM's `--model` (its
    /// `model_config.model`, a hub id or a path, `/` kept), not
    /// `--served-model-name`.
    pub model: String,
    /// vLLM `--tensor-parallel-size`, >= 1.
    pub tensor_parallel_size: u32,
    /// vLLM `--pipeline-parallel-size`, >= 1.
    pub pipeline_parallel_size: u32,
    /// vLLM `--kv-cache-dtype` as the engine was given it, compared verbatim
    /// (`auto` is not resolved: the launcher cannot see the model's dtype).
    pub kv_cache_dtype: String,
    /// vLLM `--block-size`, in tokens.
    pub block_size: u32,
    /// LMCache `--chunk-size`, in tokens.
    pub chunk_size: u32,
    /// vLLM `--decode-context-parallel-size`, >= 1 (default 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub decode_context_parallel_size: u32,
    /// vLLM `--cp-kv-cache-interleave-size` as vLLM resolves it, >= 1
    /// (default 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub cp_kv_cache_interleave_size: u32,
    /// The model's KV cache is MLA alone (LMCache's `mla_only`: vLLM's
    /// `use_mla` and not hybrid): one copy per pipeline stage and DCP shard,
    /// shared by the TP ranks (default `false`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub mla_only: bool,
    /// The fingerprint of the weights behind [`Self::model`]: `commit
    /// <40 hex>` for a hub id resolved in the Hugging Face cache, `files
    /// <32 hex>` for a directory or file measured by its configuration and
    /// its weight files' names, sizes and modification times, or what the
    /// node agent gave (`docs/configuration.md`, "The cache identity").
    /// `None`: not measured (the weights were not seen where the launch
    /// runs); left out of the JSON and of [`Self::canonical_form`] then, so
    /// a manifest written before the field existed reads back unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// The engine's settings that change the bytes of the KV it computes,
    /// by vLLM flag name without its dashes (`dtype`, `quantization`,
    /// `hf_overrides`, ...), each as the engine was given it; only those
    /// given are present (`docs/configuration.md`, "The cache identity",
    /// lists them and says why the others are left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub engine_settings: BTreeMap<String, String>,
}

/// The longest file name Linux filesystems take, in bytes.
pub const NAME_MAX: usize = 255;

/// The suffix LMCache 0.5.6's vLLM connector adds to the model name for a
/// DCP layout (`get_dcp_decorated_model_name`), before `d<dcp>-interleave<n>`.
pub const DCP_LAYOUT_NAMESPACE: &str = "##lmcache-dcp-layout-v1-";

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// One field of a [`LaunchIdentity`], for "the cache was emptied because
/// this changed".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdentityField {
    /// `model`.
    Model,
    /// `tensor_parallel_size`.
    TensorParallelSize,
    /// `pipeline_parallel_size`.
    PipelineParallelSize,
    /// `kv_cache_dtype`.
    KvCacheDtype,
    /// `block_size`.
    BlockSize,
    /// `chunk_size`.
    ChunkSize,
    /// `decode_context_parallel_size`.
    DecodeContextParallelSize,
    /// `cp_kv_cache_interleave_size`.
    CpKvCacheInterleaveSize,
    /// `mla_only`.
    MlaOnly,
    /// `weights`.
    Weights,
    /// `engine_settings`.
    EngineSettings,
}

impl IdentityField {
    /// The field's JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::TensorParallelSize => "tensor_parallel_size",
            Self::PipelineParallelSize => "pipeline_parallel_size",
            Self::KvCacheDtype => "kv_cache_dtype",
            Self::BlockSize => "block_size",
            Self::ChunkSize => "chunk_size",
            Self::DecodeContextParallelSize => "decode_context_parallel_size",
            Self::CpKvCacheInterleaveSize => "cp_kv_cache_interleave_size",
            Self::MlaOnly => "mla_only",
            Self::Weights => "weights",
            Self::EngineSettings => "engine_settings",
        }
    }
}

impl fmt::Display for IdentityField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An identity that cannot describe an LMCache launch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// The model name is empty or holds `@` or NUL (LMCache's names cannot).
    #[error(
        "model name {0:?} is empty or holds `@` or NUL, which LMCache object names cannot carry"
    )]
    Model(String),
    /// A size is 0.
    #[error("{0} is 0; it must be at least 1")]
    Zero(IdentityField),
    /// The world size LMCache packs into kv_rank does not fit its 8 bits.
    #[error("the world size LMCache writes in every object name ({0}: tensor_parallel_size x pipeline_parallel_size, or for an MLA-only model pipeline_parallel_size x decode_context_parallel_size) exceeds 255, the largest its kv_rank can hold")]
    WorldSize(u64),
    /// The dtype is empty.
    #[error("kv_cache_dtype is empty; pass the engine's value (e.g. `auto`, `fp8`)")]
    Dtype,
    /// A weights fingerprint that is there but empty.
    #[error(
        "the weights fingerprint is empty; give none, or the fingerprint the engine's weights have"
    )]
    Weights,
}

impl LaunchIdentity {
    /// Checks that the identity can describe a launch.
    ///
    /// # Errors
    /// [`IdentityError`] naming the field and value at fault.
    pub fn validate(&self) -> Result<(), IdentityError> {
        if self.model.is_empty() || self.model.contains(['@', '\0']) {
            return Err(IdentityError::Model(self.model.clone()));
        }
        for (field, value) in [
            (IdentityField::TensorParallelSize, self.tensor_parallel_size),
            (
                IdentityField::PipelineParallelSize,
                self.pipeline_parallel_size,
            ),
            (IdentityField::BlockSize, self.block_size),
            (IdentityField::ChunkSize, self.chunk_size),
            (
                IdentityField::DecodeContextParallelSize,
                self.decode_context_parallel_size,
            ),
            (
                IdentityField::CpKvCacheInterleaveSize,
                self.cp_kv_cache_interleave_size,
            ),
        ] {
            if value == 0 {
                return Err(IdentityError::Zero(field));
            }
        }
        if self.kv_world_size() > 255 {
            return Err(IdentityError::WorldSize(self.kv_world_size()));
        }
        if self.kv_cache_dtype.is_empty() {
            return Err(IdentityError::Dtype);
        }
        if self.weights.as_deref().is_some_and(str::is_empty) {
            return Err(IdentityError::Weights);
        }
        Ok(())
    }

    /// The world size every object of this launch carries in its kv_rank,
    /// as LMCache 0.5.6's `ParallelStrategy.kv_world_size` computes it for
    /// one server: TP x PP, or for an MLA-only model PP x DCP (its KV is the
    /// same on every TP rank, so one copy per pipeline stage and DCP shard
    /// is stored). The CPU bench worker writes 1; objects whose world size
    /// differs contradict this identity.
    pub fn kv_world_size(&self) -> u64 {
        let pp = u64::from(self.pipeline_parallel_size);
        match self.mla_only {
            true => pp * u64::from(self.decode_context_parallel_size),
            false => u64::from(self.tensor_parallel_size) * pp,
        }
    }

    /// The model name LMCache 0.5.6 writes in every object name: [`Self::model`],
    /// with `##lmcache-dcp-layout-v1-d<dcp>-interleave<n>` appended when the
    /// decode-context-parallel size is above 1 and the interleave is not 1
    /// (its vLLM connector's `get_dcp_decorated_model_name`).
    pub fn lmcache_model_name(&self) -> Cow<'_, str> {
        let (dcp, interleave) = (
            self.decode_context_parallel_size,
            self.cp_kv_cache_interleave_size,
        );
        match dcp <= 1 || interleave == 1 {
            true => Cow::Borrowed(&self.model),
            false => Cow::Owned(format!(
                "{}{DCP_LAYOUT_NAMESPACE}d{dcp}-interleave{interleave}",
                self.model
            )),
        }
    }

    /// Bytes of the longest name LMCache 0.5.6's fs adapters give this
    /// launch's unsalted objects: the model as written (`/` as `-SEP-`),
    /// `@0x` and 8 hex digits, `@` and an object group of 1 hex digit, `@`
    /// and a 32-byte chunk hash in hex, `.data`. A cache salt adds 1 + its
    /// length. Above [`NAME_MAX`] every store to a disk tier fails (the file
    /// cannot be created).
    pub fn object_name_len(&self) -> usize {
        let written = self.lmcache_model_name().replace('/', MODEL_SEPARATOR);
        written.len() + "@0x".len() + 8 + "@0".len() + 1 + 64 + DATA_SUFFIX.len()
    }

    /// The canonical form the digest covers: compact JSON of the fields in
    /// declaration order (model, tensor_parallel_size,
    /// pipeline_parallel_size, kv_cache_dtype, block_size, chunk_size, then
    /// decode_context_parallel_size, cp_kv_cache_interleave_size, mla_only,
    /// weights and engine_settings where they are not at their defaults).
    pub fn canonical_form(&self) -> String {
        serde_json::to_string(self).expect("an identity of strings and integers serialises")
    }

    /// blake3 of [`Self::canonical_form`], 64 lowercase hex digits.
    pub fn digest(&self) -> String {
        blake3::hash(self.canonical_form().as_bytes())
            .to_hex()
            .to_string()
    }

    /// The cache identity's tag: the first 16 hex digits of
    /// [`Self::digest`]. The S3 gateway keeps a tier's objects under a
    /// segment named after it (`docs/s3-gateway.md`, "The cache identity in
    /// a bucket"), so launches of other identities never read them.
    pub fn tag(&self) -> String {
        self.digest()[..16].to_string()
    }

    /// The first field, in declaration order, where `other` differs.
    pub fn first_difference(&self, other: &LaunchIdentity) -> Option<IdentityField> {
        self.differences(other).next().map(|(field, ..)| field)
    }

    /// Every field where `other` differs: (field, this value, other value).
    pub fn differences<'a>(
        &'a self,
        other: &'a LaunchIdentity,
    ) -> impl Iterator<Item = (IdentityField, String, String)> + 'a {
        let pairs = [
            (
                IdentityField::Model,
                self.model.clone(),
                other.model.clone(),
            ),
            (
                IdentityField::TensorParallelSize,
                self.tensor_parallel_size.to_string(),
                other.tensor_parallel_size.to_string(),
            ),
            (
                IdentityField::PipelineParallelSize,
                self.pipeline_parallel_size.to_string(),
                other.pipeline_parallel_size.to_string(),
            ),
            (
                IdentityField::KvCacheDtype,
                self.kv_cache_dtype.clone(),
                other.kv_cache_dtype.clone(),
            ),
            (
                IdentityField::BlockSize,
                self.block_size.to_string(),
                other.block_size.to_string(),
            ),
            (
                IdentityField::ChunkSize,
                self.chunk_size.to_string(),
                other.chunk_size.to_string(),
            ),
            (
                IdentityField::DecodeContextParallelSize,
                self.decode_context_parallel_size.to_string(),
                other.decode_context_parallel_size.to_string(),
            ),
            (
                IdentityField::CpKvCacheInterleaveSize,
                self.cp_kv_cache_interleave_size.to_string(),
                other.cp_kv_cache_interleave_size.to_string(),
            ),
            (
                IdentityField::MlaOnly,
                self.mla_only.to_string(),
                other.mla_only.to_string(),
            ),
            (
                IdentityField::Weights,
                shown_weights(&self.weights),
                shown_weights(&other.weights),
            ),
            (
                IdentityField::EngineSettings,
                shown_settings(&self.engine_settings),
                shown_settings(&other.engine_settings),
            ),
        ];
        pairs.into_iter().filter(|(_, a, b)| a != b)
    }
}

/// A weights fingerprint as a purge names it: the fingerprint, or
/// `not recorded`.
fn shown_weights(weights: &Option<String>) -> String {
    weights.clone().unwrap_or_else(|| "not recorded".into())
}

/// Engine settings as a purge names them: `name=value` pairs in name
/// order, `none` for none.
fn shown_settings(settings: &BTreeMap<String, String>) -> String {
    match settings.is_empty() {
        true => "none".into(),
        false => settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// The identity manifest as stored (see the module docs for the JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Schema of the file; this crate writes [`MANIFEST_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Identity of the objects written to the directory.
    pub identity: LaunchIdentity,
    /// blake3 of `identity`'s canonical form (checked for schema 1).
    pub identity_digest: String,
    /// Who wrote it: `lmcache-housekeeping <version>`.
    pub writer: String,
    /// When, RFC 3339 UTC.
    pub written_at: String,
}

/// What [`read_manifest`] found. Never an error: a manifest that cannot be
/// used means "identity unknown", which the planner treats like no manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestRead {
    /// No manifest file.
    Missing,
    /// A manifest whose identity can be compared.
    Found(Manifest),
    /// A manifest that is there but unusable; log the warning.
    Unusable(ManifestWarning),
}

/// Why a manifest file was ignored, for the launch log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ManifestWarning {
    /// The manifest's path.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

impl fmt::Display for ManifestWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "identity manifest {} ignored: {}; its objects are treated as having no manifest (purged) and a new manifest is written",
            self.path.display(),
            self.problem
        )
    }
}

/// Reads the manifest of `dir`, never following a symlink.
pub fn read_manifest(dir: &TierDir) -> ManifestRead {
    let path = dir.entry_path(MANIFEST_FILE_NAME);
    let unusable = |problem: String| {
        ManifestRead::Unusable(ManifestWarning {
            path: path.clone(),
            problem,
        })
    };
    let bytes = match read_control_file(dir.fd(), MANIFEST_FILE_NAME, MANIFEST_MAX_BYTES) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return ManifestRead::Missing,
        Err(problem) => return unusable(problem.to_string()),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return unusable("it is not UTF-8 text".into());
    };
    let manifest: Manifest = match serde_json::from_str(&text) {
        Ok(m) => m,
        Err(e) => return unusable(format!("it is not a valid manifest: {e}")),
    };
    if manifest.schema_version == 0 {
        return unusable("schema_version 0 is not a schema".into());
    }
    if manifest.schema_version == MANIFEST_SCHEMA_VERSION
        && manifest.identity_digest != manifest.identity.digest()
    {
        return unusable(format!(
            "identity_digest {} does not match its identity fields (digest {}): edited or damaged",
            manifest.identity_digest,
            manifest.identity.digest()
        ));
    }
    ManifestRead::Found(manifest)
}

/// Failure to write the manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The identity is not valid.
    #[error("not writing the identity manifest: {0}")]
    Identity(#[from] IdentityError),
    /// The directory was opened read-only.
    #[error(transparent)]
    Dir(#[from] TierDirError),
    /// A write, fsync or rename failed.
    #[error("cannot write identity manifest {path} ({step}): {source}; check space and permissions on the tier volume")]
    Io {
        /// The file at fault.
        path: PathBuf,
        /// Which step failed.
        step: &'static str,
        /// The underlying error.
        source: io::Error,
    },
}

/// Writes the manifest for `identity` crash-safely
/// ([`replace_control_file`]): to [`MANIFEST_TEMP_FILE_NAME`], fsync, rename
/// over [`MANIFEST_FILE_NAME`], fsync the directory. Killed at any point,
/// the directory holds the old manifest or the new one, plus perhaps a
/// stale temp the next housekeeping removes; a link placed at the temp
/// name is unlinked, never written through.
///
/// # Errors
/// [`ManifestError`] naming the file and step at fault.
pub fn write_manifest(dir: &TierDir, identity: &LaunchIdentity) -> Result<Manifest, ManifestError> {
    identity.validate()?;
    dir.require_writable()?;
    let manifest = Manifest {
        schema_version: MANIFEST_SCHEMA_VERSION,
        identity: identity.clone(),
        identity_digest: identity.digest(),
        writer: concat!(env!("CARGO_PKG_NAME"), " ", env!("CARGO_PKG_VERSION")).to_owned(),
        written_at: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
    };
    let mut text = serde_json::to_string_pretty(&manifest).expect("a manifest serialises");
    text.push('\n');
    replace_control_file(
        dir.fd(),
        MANIFEST_TEMP_FILE_NAME,
        MANIFEST_FILE_NAME,
        text.as_bytes(),
    )
    .map_err(|ReplaceError { step, source }| ManifestError::Io {
        path: match step {
            ReplaceStep::SyncDirectory => dir.path().to_path_buf(),
            step if step.on_temp_file() => dir.entry_path(MANIFEST_TEMP_FILE_NAME),
            _ => dir.entry_path(MANIFEST_FILE_NAME),
        },
        step: step.as_str(),
        source,
    })?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier_dir::Access;

    fn identity() -> LaunchIdentity {
        LaunchIdentity {
            model: "meta-llama/Llama-3.1-8B".into(),
            tensor_parallel_size: 4,
            pipeline_parallel_size: 1,
            kv_cache_dtype: "bfloat16".into(),
            block_size: 16,
            chunk_size: 256,
            decode_context_parallel_size: 1,
            cp_kv_cache_interleave_size: 1,
            mla_only: false,
            weights: None,
            engine_settings: Default::default(),
        }
    }

    #[test]
    fn written_manifest_reads_back_equal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        assert_eq!(read_manifest(&dir), ManifestRead::Missing);
        let written = write_manifest(&dir, &identity()).unwrap();
        assert_eq!(read_manifest(&dir), ManifestRead::Found(written));
        assert!(!tmp.path().join(MANIFEST_TEMP_FILE_NAME).exists());
    }

    #[test]
    fn unknown_fields_are_ignored_and_later_schemas_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let mut value = serde_json::to_value(write_manifest(&dir, &identity()).unwrap()).unwrap();
        value["schema_version"] = 7.into();
        value["identity"]["kv_layout"] = "NHD".into();
        value["identity_digest"] = "computed-some-other-way".into();
        value["future"] = serde_json::json!({"x": 1});
        std::fs::write(tmp.path().join(MANIFEST_FILE_NAME), value.to_string()).unwrap();
        match read_manifest(&dir) {
            ManifestRead::Found(m) => assert_eq!(m.identity, identity()),
            other => panic!("expected Found, got {other:?}"),
        }
    }

    #[test]
    fn corrupt_manifests_are_unusable_with_a_warning_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let path = tmp.path().join(MANIFEST_FILE_NAME);
        let mut edited = serde_json::to_value(write_manifest(&dir, &identity()).unwrap()).unwrap();
        edited["identity"]["chunk_size"] = 512.into();
        for content in [
            "{not json".to_owned(),
            "{}".to_owned(),
            edited.to_string(),
            " ".repeat(MANIFEST_MAX_BYTES as usize + 1),
        ] {
            std::fs::write(&path, &content).unwrap();
            match read_manifest(&dir) {
                ManifestRead::Unusable(w) => {
                    assert_eq!(w.path, path);
                    assert!(w.to_string().contains(MANIFEST_FILE_NAME), "{w}");
                }
                other => panic!("expected Unusable for {content:.40}, got {other:?}"),
            }
        }
    }

    /// What a torn write or a damaged disk can leave: every prefix of a
    /// written manifest (a truncation), and every byte of it flipped in a
    /// few ways. Each reads as unusable, with a warning that names the file
    /// and says it is ignored, or (a byte outside the identity, a dropped
    /// final newline) as the very identity written: never another one.
    #[test]
    fn truncated_or_garbled_manifests_are_ignored_never_misread() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let path = tmp.path().join(MANIFEST_FILE_NAME);
        write_manifest(&dir, &identity()).unwrap();
        let written = std::fs::read(&path).unwrap();
        let check = |bytes: &[u8], what: &str| match read_manifest(&dir) {
            ManifestRead::Unusable(w) => {
                let line = w.to_string();
                assert!(
                    line.contains(MANIFEST_FILE_NAME) && line.contains("ignored"),
                    "{what}: {line}"
                );
            }
            ManifestRead::Found(m) => assert_eq!(
                m.identity,
                identity(),
                "{what}: {:?}",
                String::from_utf8_lossy(bytes)
            ),
            ManifestRead::Missing => panic!("{what}: the manifest is there"),
        };
        let mut found = 0;
        for len in 0..written.len() {
            std::fs::write(&path, &written[..len]).unwrap();
            check(&written[..len], &format!("truncated to {len} bytes"));
            found += usize::from(matches!(read_manifest(&dir), ManifestRead::Found(_)));
        }
        assert_eq!(found, 1, "only the final newline may be cut off");
        for at in 0..written.len() {
            for flip in [0x01u8, 0x20, 0x80, 0xff] {
                let mut garbled = written.clone();
                garbled[at] ^= flip;
                std::fs::write(&path, &garbled).unwrap();
                check(&garbled, &format!("byte {at} xor {flip:#04x}"));
            }
        }
    }

    #[test]
    fn a_symlinked_manifest_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let dir = TierDir::open(outside.path(), Access::ReadWrite).unwrap();
        write_manifest(&dir, &identity()).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join(MANIFEST_FILE_NAME),
            tmp.path().join(MANIFEST_FILE_NAME),
        )
        .unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        assert!(matches!(read_manifest(&dir), ManifestRead::Unusable(_)));
    }

    #[test]
    fn digest_covers_every_field_and_differences_name_them() {
        let base = identity();
        let mut other = base.clone();
        other.chunk_size = 512;
        assert_ne!(base.digest(), other.digest());
        assert_eq!(
            base.first_difference(&other),
            Some(IdentityField::ChunkSize)
        );
        other.kv_cache_dtype = "fp8".into();
        let diffs: Vec<_> = base.differences(&other).collect();
        assert_eq!(
            diffs,
            vec![
                (IdentityField::KvCacheDtype, "bfloat16".into(), "fp8".into()),
                (IdentityField::ChunkSize, "256".into(), "512".into()),
            ]
        );
        assert_eq!(base.first_difference(&base), None);
        assert_eq!(base.kv_world_size(), 4);
    }

    #[test]
    fn the_model_name_and_world_size_are_those_lmcache_writes() {
        let plain = identity();
        assert_eq!(plain.lmcache_model_name(), "meta-llama/Llama-3.1-8B");
        let dcp_without_interleave = LaunchIdentity {
            decode_context_parallel_size: 2,
            ..identity()
        };
        assert_eq!(dcp_without_interleave.lmcache_model_name(), plain.model);
        let dcp = LaunchIdentity {
            decode_context_parallel_size: 2,
            cp_kv_cache_interleave_size: 8,
            ..identity()
        };
        assert_eq!(
            dcp.lmcache_model_name(),
            "meta-llama/Llama-3.1-8B##lmcache-dcp-layout-v1-d2-interleave8"
        );
        assert_eq!(dcp.kv_world_size(), 4);
        let mla = LaunchIdentity {
            tensor_parallel_size: 8,
            pipeline_parallel_size: 2,
            decode_context_parallel_size: 4,
            mla_only: true,
            ..identity()
        };
        assert_eq!(mla.kv_world_size(), 8);
        assert_eq!(mla.validate(), Ok(()));
    }

    /// A manifest written before the DCP and MLA fields existed: six
    /// fields, its digest over those six. It reads back as the same
    /// identity, so upgrading keeps the cache.
    #[test]
    fn a_manifest_from_before_the_parallel_layout_fields_keeps_its_cache() {
        let six = r#"{"model":"meta-llama/Llama-3.1-8B","tensor_parallel_size":4,"pipeline_parallel_size":1,"kv_cache_dtype":"bfloat16","block_size":16,"chunk_size":256}"#;
        assert_eq!(identity().canonical_form(), six);
        let tmp = tempfile::tempdir().unwrap();
        let manifest = serde_json::json!({
            "schema_version": 1,
            "identity": serde_json::from_str::<serde_json::Value>(six).unwrap(),
            "identity_digest": blake3::hash(six.as_bytes()).to_hex().to_string(),
            "writer": "lmcache-housekeeping 0.1.0",
            "written_at": "2026-11-30T07:42:00Z",
        });
        std::fs::write(tmp.path().join(MANIFEST_FILE_NAME), manifest.to_string()).unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        match read_manifest(&dir) {
            ManifestRead::Found(m) => assert_eq!(m.identity, identity()),
            other => panic!("expected Found, got {other:?}"),
        }
        let dcp = LaunchIdentity {
            decode_context_parallel_size: 2,
            ..identity()
        };
        assert_ne!(dcp.digest(), identity().digest());
        assert_eq!(
            dcp.first_difference(&identity()),
            Some(IdentityField::DecodeContextParallelSize)
        );
    }

    /// Other weights, or another engine setting that changes the KV's
    /// bytes, are another identity, named field by field; an identity
    /// without either keeps the digest it had before the fields existed.
    #[test]
    fn the_weights_and_engine_settings_are_part_of_the_identity() {
        let commit_a = LaunchIdentity {
            weights: Some("commit a1b2".into()),
            ..identity()
        };
        let commit_b = LaunchIdentity {
            weights: Some("commit c3d4".into()),
            ..identity()
        };
        assert_ne!(commit_a.digest(), commit_b.digest());
        assert_ne!(commit_a.tag(), commit_b.tag());
        assert_eq!(commit_a.tag().len(), 16);
        assert_eq!(
            commit_a.differences(&commit_b).collect::<Vec<_>>(),
            vec![(
                IdentityField::Weights,
                "commit a1b2".into(),
                "commit c3d4".into()
            )]
        );
        assert_eq!(
            identity().differences(&commit_a).collect::<Vec<_>>(),
            vec![(
                IdentityField::Weights,
                "not recorded".into(),
                "commit a1b2".into()
            )]
        );
        let fp8 = LaunchIdentity {
            engine_settings: [("quantization".to_string(), "fp8".to_string())].into(),
            ..identity()
        };
        assert_eq!(
            identity().first_difference(&fp8),
            Some(IdentityField::EngineSettings)
        );
        assert_eq!(
            fp8.differences(&identity()).next().map(|(_, a, b)| (a, b)),
            Some(("quantization=fp8".into(), "none".into()))
        );
        assert!(!identity().canonical_form().contains("weights"));
        assert!(commit_a
            .canonical_form()
            .ends_with(r#","weights":"commit a1b2"}"#));
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadWrite).unwrap();
        let written = write_manifest(&dir, &fp8).unwrap();
        assert_eq!(read_manifest(&dir), ManifestRead::Found(written));
        let empty = LaunchIdentity {
            weights: Some(String::new()),
            ..identity()
        };
        assert_eq!(empty.validate(), Err(IdentityError::Weights));
    }

    #[test]
    fn invalid_identities_are_refused() {
        let mut bad = identity();
        bad.model = "a@b".into();
        assert!(matches!(bad.validate(), Err(IdentityError::Model(_))));
        let mut bad = identity();
        bad.block_size = 0;
        assert_eq!(
            bad.validate(),
            Err(IdentityError::Zero(IdentityField::BlockSize))
        );
        let mut bad = identity();
        bad.tensor_parallel_size = 64;
        bad.pipeline_parallel_size = 8;
        assert_eq!(bad.validate(), Err(IdentityError::WorldSize(512)));
        let mut bad = identity();
        bad.kv_cache_dtype.clear();
        assert_eq!(bad.validate(), Err(IdentityError::Dtype));
        assert_eq!(identity().validate(), Ok(()));
    }

    #[test]
    fn read_only_directories_get_no_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = TierDir::open(tmp.path(), Access::ReadOnly).unwrap();
        assert!(matches!(
            write_manifest(&dir, &identity()),
            Err(ManifestError::Dir(TierDirError::NotWritable { .. }))
        ));
    }
}

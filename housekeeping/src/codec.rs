//! The names LMCache 0.5.6 gives its objects in `fs` and `fs_native` tiers.
//!
//! An object file is named
//! `<model>@0x<kv_rank>@<object_group_id>@<chunk_hash>[@<cache_salt>].data`
//! (read from the LMCache 0.5.6 wheel and seen on disk, recorded in
//! `fixtures/lmcache-0.5.6/object-names.txt`):
//!
//! - `model`: the served model name with every `/` written as `-SEP-`;
//! - `kv_rank`: exactly 8 lowercase hex digits after `0x`, packing
//!   `(world_size << 24) | (rank << 16) | (local_world_size << 8) | local_rank`;
//! - `object_group_id`: lowercase hex without leading zeros (`0`, `1f`);
//! - `chunk_hash`: an even number of lowercase hex digits (32 bytes from the
//!   server's blake3 hashes, 16 bytes from `lmcache bench l2`);
//! - `cache_salt`: optional, non-empty.
//!
//! `@` cannot occur in a model name or a salt. While it writes, the `fs`
//! adapter uses the same name with `.data` replaced by `.tmp` (Python's
//! `with_suffix`); see [`parse_temp_name`].
//!
//! Decoding is strict: a name decodes only if [`ObjectNameRef`]'s `Display`
//! (the encoder) gives the very same bytes back, so an [`ObjectKey`] can stand
//! in for the file name and the name can be rebuilt from it before unlinking.
//! Hashes longer than [`MAX_HASH_BYTES`] do not decode: such files are left
//! alone as foreign.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// Suffix of a finished object file.
pub const DATA_SUFFIX: &str = ".data";
/// Suffix of an object the `fs` adapter is still writing (`.data` replaced).
pub const TEMP_SUFFIX: &str = ".tmp";
/// How LMCache writes `/` of a model name in a file name.
pub const MODEL_SEPARATOR: &str = "-SEP-";
/// Longest chunk hash that decodes, in bytes (LMCache's blake3 hashes are 32).
pub const MAX_HASH_BYTES: usize = 32;

/// Why a file name is not an LMCache object name. Each variant names the
/// part of `<model>@0x<kv_rank>@<group>@<hash>[@<salt>].data` at fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name does not end in `.data` (or `.tmp` for a temp file).
    #[error("the name does not end in `.data`")]
    Suffix,
    /// Not 4 or 5 `@`-separated fields.
    #[error(
        "the name has {found} `@`-separated fields; an object name has 4, or 5 with a cache salt"
    )]
    FieldCount {
        /// Fields found.
        found: usize,
    },
    /// The model field is empty or holds `/` or NUL.
    #[error("the model field is empty or holds `/` or NUL")]
    Model,
    /// The kv_rank field is not `0x` and 8 lowercase hex digits.
    #[error("the kv_rank field is not `0x` followed by 8 lowercase hex digits")]
    KvRank,
    /// The object group field is not lowercase hex without leading zeros.
    #[error(
        "the object_group_id field is not lowercase hex (at most 16 digits, no leading zeros)"
    )]
    ObjectGroup,
    /// The chunk hash is not 2..=64 lowercase hex digits, an even number.
    #[error("the chunk hash is not an even number of lowercase hex digits (2 to 64)")]
    ChunkHash,
    /// The cache salt is empty or holds `/` or NUL.
    #[error("the cache salt is empty or holds `/` or NUL")]
    Salt,
}

/// LMCache's `kv_rank`: `(world_size << 24) | (rank << 16) |
/// (local_world_size << 8) | local_rank`, 8 bits each (LMCache's
/// `ComputeKVRank`). `world_size` is the engine's number of workers,
/// tensor-parallel size x pipeline-parallel size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct KvRank(u32);

impl KvRank {
    /// Packs the four fields.
    pub const fn new(world_size: u8, rank: u8, local_world_size: u8, local_rank: u8) -> Self {
        Self(
            (world_size as u32) << 24
                | (rank as u32) << 16
                | (local_world_size as u32) << 8
                | local_rank as u32,
        )
    }

    /// The packed value as LMCache computes it.
    pub const fn from_raw(raw: u32) -> Self {
        Self(raw)
    }

    /// The packed value, as written (8 hex digits) in the name.
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// Number of engine workers (TP x PP) of the engine that wrote the object.
    pub const fn world_size(self) -> u8 {
        (self.0 >> 24) as u8
    }

    /// Global rank of the worker that wrote the object.
    pub const fn rank(self) -> u8 {
        (self.0 >> 16) as u8
    }

    /// Workers of that engine on the writer's node.
    pub const fn local_world_size(self) -> u8 {
        (self.0 >> 8) as u8
    }

    /// Rank of the writer on its node.
    pub const fn local_rank(self) -> u8 {
        self.0 as u8
    }
}

/// A chunk hash of 1 to [`MAX_HASH_BYTES`] bytes, stored inline (33 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkHash {
    len: u8,
    bytes: [u8; MAX_HASH_BYTES],
}

impl ChunkHash {
    /// The hash of these bytes; `None` when empty or longer than
    /// [`MAX_HASH_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.is_empty() || bytes.len() > MAX_HASH_BYTES {
            return None;
        }
        let mut stored = [0u8; MAX_HASH_BYTES];
        stored[..bytes.len()].copy_from_slice(bytes);
        Some(Self {
            len: bytes.len() as u8,
            bytes: stored,
        })
    }

    /// The hash bytes (16 or 32 in practice).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    fn from_hex(hex: &str) -> Result<Self, NameError> {
        let digits = hex.as_bytes();
        if digits.is_empty() || !digits.len().is_multiple_of(2) || digits.len() > 2 * MAX_HASH_BYTES
        {
            return Err(NameError::ChunkHash);
        }
        let mut stored = [0u8; MAX_HASH_BYTES];
        for (slot, pair) in stored.iter_mut().zip(digits.chunks_exact(2)) {
            let high = hex_value(pair[0]).ok_or(NameError::ChunkHash)?;
            let low = hex_value(pair[1]).ok_or(NameError::ChunkHash)?;
            *slot = high << 4 | low;
        }
        Ok(Self {
            len: (digits.len() / 2) as u8,
            bytes: stored,
        })
    }
}

impl fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkHash({self})")
    }
}

impl Serialize for ChunkHash {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Lowercase hex digit value; uppercase is rejected so decoding stays exact.
fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// An object name borrowed from a file name, with the model still in its
/// written form (`-SEP-` for `/`). `Display` encodes it back to the file
/// name, `.data` included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectNameRef<'a> {
    model_written: &'a str,
    /// The writer's kv_rank.
    pub kv_rank: KvRank,
    /// LMCache's object group id.
    pub object_group: u64,
    /// The chunk hash.
    pub chunk_hash: ChunkHash,
    salt: Option<&'a str>,
}

impl<'a> ObjectNameRef<'a> {
    /// The model as written in the name, `-SEP-` standing for `/`.
    pub fn model_written(&self) -> &'a str {
        self.model_written
    }

    /// The model name, `-SEP-` turned back into `/`.
    pub fn model(&self) -> Cow<'a, str> {
        decode_model(self.model_written)
    }

    /// The cache salt, if the name has one.
    pub fn salt(&self) -> Option<&'a str> {
        self.salt
    }
}

impl fmt::Display for ObjectNameRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_stem(
            f,
            self.model_written,
            self.kv_rank,
            self.object_group,
            &self.chunk_hash,
            self.salt,
        )?;
        f.write_str(DATA_SUFFIX)
    }
}

fn write_stem(
    f: &mut impl fmt::Write,
    model_written: &str,
    kv_rank: KvRank,
    group: u64,
    hash: &ChunkHash,
    salt: Option<&str>,
) -> fmt::Result {
    write!(
        f,
        "{model_written}@0x{:08x}@{group:x}@{hash}",
        kv_rank.raw()
    )?;
    if let Some(salt) = salt {
        write!(f, "@{salt}")?;
    }
    Ok(())
}

fn decode_model(written: &str) -> Cow<'_, str> {
    if written.contains(MODEL_SEPARATOR) {
        Cow::Owned(written.replace(MODEL_SEPARATOR, "/"))
    } else {
        Cow::Borrowed(written)
    }
}

fn encode_model(model: &str) -> Cow<'_, str> {
    if model.contains('/') {
        Cow::Owned(model.replace('/', MODEL_SEPARATOR))
    } else {
        Cow::Borrowed(model)
    }
}

/// Decodes the name of a finished object file (`... .data`).
///
/// # Errors
/// [`NameError`] naming the first field that is not as LMCache writes it.
pub fn parse_object_name(file_name: &str) -> Result<ObjectNameRef<'_>, NameError> {
    let stem = file_name
        .strip_suffix(DATA_SUFFIX)
        .ok_or(NameError::Suffix)?;
    parse_stem(stem)
}

/// Decodes the name of an object the `fs` adapter was writing when it
/// stopped: the object name with `.data` replaced by `.tmp`.
///
/// # Errors
/// [`NameError::Suffix`] when the name does not end in `.tmp`, else as
/// [`parse_object_name`].
pub fn parse_temp_name(file_name: &str) -> Result<ObjectNameRef<'_>, NameError> {
    let stem = file_name
        .strip_suffix(TEMP_SUFFIX)
        .ok_or(NameError::Suffix)?;
    parse_stem(stem)
}

fn parse_stem(stem: &str) -> Result<ObjectNameRef<'_>, NameError> {
    let mut fields = stem.split('@');
    let (Some(model), Some(rank), Some(group), Some(hash)) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return Err(NameError::FieldCount {
            found: stem.split('@').count(),
        });
    };
    let salt = fields.next();
    if fields.next().is_some() {
        return Err(NameError::FieldCount {
            found: stem.split('@').count(),
        });
    }
    if !is_clean_field(model) {
        return Err(NameError::Model);
    }
    let kv_rank = parse_kv_rank(rank)?;
    let object_group = parse_group(group)?;
    let chunk_hash = ChunkHash::from_hex(hash)?;
    if let Some(salt) = salt {
        if !is_clean_field(salt) {
            return Err(NameError::Salt);
        }
    }
    Ok(ObjectNameRef {
        model_written: model,
        kv_rank,
        object_group,
        chunk_hash,
        salt,
    })
}

/// Non-empty, and nothing a file name cannot hold.
fn is_clean_field(field: &str) -> bool {
    !field.is_empty() && !field.bytes().any(|b| b == b'/' || b == 0)
}

fn parse_kv_rank(field: &str) -> Result<KvRank, NameError> {
    let digits = field.strip_prefix("0x").ok_or(NameError::KvRank)?;
    if digits.len() != 8 {
        return Err(NameError::KvRank);
    }
    let mut raw = 0u32;
    for digit in digits.bytes() {
        raw = raw << 4 | u32::from(hex_value(digit).ok_or(NameError::KvRank)?);
    }
    Ok(KvRank(raw))
}

fn parse_group(field: &str) -> Result<u64, NameError> {
    if field.is_empty() || field.len() > 16 || (field.len() > 1 && field.starts_with('0')) {
        return Err(NameError::ObjectGroup);
    }
    let mut value = 0u64;
    for digit in field.bytes() {
        value = value << 4 | u64::from(hex_value(digit).ok_or(NameError::ObjectGroup)?);
    }
    Ok(value)
}

/// An object name owned, with the model decoded (`/`, not `-SEP-`): the form
/// for reports, tests and callers that build names. `Display` is the file
/// name; `FromStr` parses one as [`parse_object_name`] does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ObjectName {
    /// Model name as the engine knows it (with `/`).
    pub model: String,
    /// The writer's kv_rank.
    pub kv_rank: KvRank,
    /// LMCache's object group id.
    pub object_group: u64,
    /// The chunk hash.
    pub chunk_hash: ChunkHash,
    /// The cache salt, if any. Must be non-empty and hold no `@`, `/` or NUL.
    pub salt: Option<String>,
}

impl ObjectName {
    /// Name of the `.tmp` file the `fs` adapter writes before renaming it to
    /// this object.
    pub fn temp_file_name(&self) -> String {
        let mut name = String::new();
        self.write_stem(&mut name);
        name.push_str(TEMP_SUFFIX);
        name
    }

    fn write_stem(&self, out: &mut impl fmt::Write) {
        // Writing into a String cannot fail.
        let _ = write_stem(
            out,
            &encode_model(&self.model),
            self.kv_rank,
            self.object_group,
            &self.chunk_hash,
            self.salt.as_deref(),
        );
    }
}

impl From<ObjectNameRef<'_>> for ObjectName {
    fn from(name: ObjectNameRef<'_>) -> Self {
        Self {
            model: name.model().into_owned(),
            kv_rank: name.kv_rank,
            object_group: name.object_group,
            chunk_hash: name.chunk_hash,
            salt: name.salt.map(str::to_owned),
        }
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut stem = String::new();
        self.write_stem(&mut stem);
        f.write_str(&stem)?;
        f.write_str(DATA_SUFFIX)
    }
}

impl FromStr for ObjectName {
    type Err = NameError;

    fn from_str(file_name: &str) -> Result<Self, NameError> {
        parse_object_name(file_name).map(Self::from)
    }
}

/// Index of a model name in a [`NameTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(u32);

/// Index of a cache salt in a [`NameTable`] (never 0, so `Option` is free).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SaltId(NonZeroU32);

/// The compact form of an object name: 56 bytes, the model and salt interned
/// in a [`NameTable`]. Meaningful only with the table that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Interned model (written form).
    pub model: ModelId,
    /// The writer's kv_rank.
    pub kv_rank: KvRank,
    /// LMCache's object group id.
    pub object_group: u64,
    /// The chunk hash.
    pub chunk_hash: ChunkHash,
    /// Interned salt, if any.
    pub salt: Option<SaltId>,
}

/// Interned model names and cache salts, shared by every [`ObjectKey`] made
/// from it. A tier holds few models and few salts, so the table stays small
/// however many objects there are.
#[derive(Debug, Default, Clone)]
pub struct NameTable {
    models: Interner,
    salts: Interner,
}

#[derive(Debug, Default, Clone)]
struct Interner {
    strings: Vec<Box<str>>,
    ids: HashMap<Box<str>, u32>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.strings.len())
            .expect("fewer than 2^32 distinct model names or salts in one directory");
        self.strings.push(s.into());
        self.ids.insert(s.into(), id);
        id
    }

    fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    fn resolve(&self, id: u32) -> &str {
        &self.strings[id as usize]
    }
}

impl NameTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The compact key of a parsed name, interning its model and salt.
    pub fn intern(&mut self, name: &ObjectNameRef<'_>) -> ObjectKey {
        ObjectKey {
            model: ModelId(self.models.intern(name.model_written)),
            kv_rank: name.kv_rank,
            object_group: name.object_group,
            chunk_hash: name.chunk_hash,
            salt: name.salt.map(|salt| self.salt_id(salt)),
        }
    }

    /// The compact key of an owned name, interning its model and salt.
    pub fn intern_owned(&mut self, name: &ObjectName) -> ObjectKey {
        ObjectKey {
            model: ModelId(self.models.intern(&encode_model(&name.model))),
            kv_rank: name.kv_rank,
            object_group: name.object_group,
            chunk_hash: name.chunk_hash,
            salt: name.salt.as_deref().map(|salt| self.salt_id(salt)),
        }
    }

    /// The compact key of a parsed name if its model and salt (if any) are
    /// already in the table, without interning anything: `None` means no
    /// key made from this table can stand for the name.
    pub fn lookup(&self, name: &ObjectNameRef<'_>) -> Option<ObjectKey> {
        let salt = match name.salt {
            Some(salt) => Some(SaltId(NonZeroU32::new(self.salts.get(salt)? + 1)?)),
            None => None,
        };
        Some(ObjectKey {
            model: ModelId(self.models.get(name.model_written)?),
            kv_rank: name.kv_rank,
            object_group: name.object_group,
            chunk_hash: name.chunk_hash,
            salt,
        })
    }

    fn salt_id(&mut self, salt: &str) -> SaltId {
        let id = self.salts.intern(salt) + 1;
        SaltId(NonZeroU32::new(id).expect("interned id + 1 is never 0"))
    }

    /// The id of a model name (with `/`), if any object of it was interned.
    pub fn model_id(&self, model: &str) -> Option<ModelId> {
        self.models.get(&encode_model(model)).map(ModelId)
    }

    /// A model name (with `/`).
    ///
    /// # Panics
    /// If `id` comes from another table.
    pub fn model(&self, id: ModelId) -> Cow<'_, str> {
        decode_model(self.models.resolve(id.0))
    }

    /// Number of distinct models interned.
    pub fn model_count(&self) -> usize {
        self.models.strings.len()
    }

    /// The borrowed name a key stands for; `Display` gives the file name.
    ///
    /// # Panics
    /// If `key` comes from another table.
    pub fn name(&self, key: &ObjectKey) -> ObjectNameRef<'_> {
        ObjectNameRef {
            model_written: self.models.resolve(key.model.0),
            kv_rank: key.kv_rank,
            object_group: key.object_group,
            chunk_hash: key.chunk_hash,
            salt: key.salt.map(|id| self.salts.resolve(id.0.get() - 1)),
        }
    }

    /// Moves the names of `other` into this table and returns the function
    /// that rewrites `other`'s keys into this table's ids.
    pub(crate) fn absorb(&mut self, other: &NameTable) -> impl Fn(ObjectKey) -> ObjectKey {
        let models: Vec<u32> = other
            .models
            .strings
            .iter()
            .map(|m| self.models.intern(m))
            .collect();
        let salts: Vec<u32> = other
            .salts
            .strings
            .iter()
            .map(|s| self.salts.intern(s) + 1)
            .collect();
        move |key| ObjectKey {
            model: ModelId(models[key.model.0 as usize]),
            salt: key.salt.map(|id| {
                SaltId(NonZeroU32::new(salts[id.0.get() as usize - 1]).expect("id + 1 is never 0"))
            }),
            ..key
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fixture_names() -> Vec<String> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/lmcache-0.5.6/object-names.txt"
        );
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read the recorded object names at {path}: {e}"));
        text.lines()
            .filter(|l| !l.starts_with('#') && l.ends_with(DATA_SUFFIX))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn every_recorded_lmcache_name_decodes_and_encodes_back() {
        let names = fixture_names();
        assert!(names.len() >= 18, "fixture has {} .data names", names.len());
        for name in names {
            let parsed = parse_object_name(&name).unwrap();
            assert_eq!(parsed.to_string(), name);
            let owned: ObjectName = name.parse().unwrap();
            assert_eq!(owned.to_string(), name);
        }
    }

    #[test]
    fn server_object_name_fields() {
        let name = fixture_names()
            .into_iter()
            .find(|n| n.starts_with("test-model@"))
            .unwrap();
        let parsed = parse_object_name(&name).unwrap();
        assert_eq!(parsed.model(), "test-model");
        assert_eq!(parsed.kv_rank.world_size(), 1);
        assert_eq!(parsed.kv_rank.rank(), 0);
        assert_eq!(parsed.kv_rank.local_world_size(), 1);
        assert_eq!(parsed.kv_rank.local_rank(), 0);
        assert_eq!(parsed.object_group, 0);
        assert_eq!(parsed.chunk_hash.as_bytes().len(), 32);
        assert_eq!(parsed.salt(), None);
    }

    #[test]
    fn bench_l2_names_have_16_byte_hashes_and_world_size_0() {
        let names: Vec<_> = fixture_names()
            .into_iter()
            .filter(|n| n.starts_with("bench-model@"))
            .collect();
        assert_eq!(names.len(), 4);
        let second = parse_object_name(&names[1]).unwrap();
        assert_eq!(second.chunk_hash.as_bytes().len(), 16);
        assert_eq!(second.kv_rank, KvRank::new(0, 0, 0, 1));
    }

    #[test]
    fn sep_in_name_is_a_slash_in_the_model() {
        let name = "meta-llama-SEP-Llama-3.1-8B@0x04020401@1f@00ff@tenant-a.data";
        let parsed: ObjectName = name.parse().unwrap();
        assert_eq!(parsed.model, "meta-llama/Llama-3.1-8B");
        assert_eq!(parsed.kv_rank, KvRank::new(4, 2, 4, 1));
        assert_eq!(parsed.object_group, 0x1f);
        assert_eq!(parsed.chunk_hash.as_bytes(), &[0x00, 0xff]);
        assert_eq!(parsed.salt.as_deref(), Some("tenant-a"));
        assert_eq!(parsed.to_string(), name);
        assert_eq!(
            parsed.temp_file_name(),
            "meta-llama-SEP-Llama-3.1-8B@0x04020401@1f@00ff@tenant-a.tmp"
        );
    }

    #[test]
    fn temp_names_decode_to_the_object_they_stand_for() {
        for name in fixture_names() {
            let temp = name.replace(DATA_SUFFIX, TEMP_SUFFIX);
            assert_eq!(parse_temp_name(&temp).unwrap().to_string(), name);
            assert_eq!(parse_object_name(&temp), Err(NameError::Suffix));
        }
    }

    #[test]
    fn names_that_must_not_decode() {
        let hash = "00112233445566778899aabbccddeeff";
        let cases: &[(&str, NameError)] = &[
            ("model.safetensors", NameError::Suffix),
            ("README", NameError::Suffix),
            (".data", NameError::FieldCount { found: 1 }),
            ("m@0x01000100@0.data", NameError::FieldCount { found: 3 }),
            (
                "m@0x01000100@0@00@salt@extra.data",
                NameError::FieldCount { found: 6 },
            ),
            ("@0x01000100@0@00.data", NameError::Model),
            ("m@01000100@0@00.data", NameError::KvRank),
            ("m@0x1000100@0@00.data", NameError::KvRank),
            ("m@0x010001000@0@00.data", NameError::KvRank),
            ("m@0x0100010G@0@00.data", NameError::KvRank),
            ("m@0X01000100@0@00.data", NameError::KvRank),
            ("m@0x0100010A@0@00.data", NameError::KvRank),
            ("m@0x01000100@@00.data", NameError::ObjectGroup),
            ("m@0x01000100@00@00.data", NameError::ObjectGroup),
            ("m@0x01000100@A@00.data", NameError::ObjectGroup),
            (
                "m@0x01000100@11112222333344445@00.data",
                NameError::ObjectGroup,
            ),
            ("m@0x01000100@0@.data", NameError::ChunkHash),
            ("m@0x01000100@0@abc.data", NameError::ChunkHash),
            ("m@0x01000100@0@AB.data", NameError::ChunkHash),
            ("m@0x01000100@0@zz.data", NameError::ChunkHash),
            ("m@0x01000100@0@00@.data", NameError::Salt),
            ("m@0x01000100@0@00@a/b.data", NameError::Salt),
        ];
        for (name, want) in cases {
            assert_eq!(parse_object_name(name).err(), Some(*want), "{name}");
        }
        let too_long = format!("m@0x01000100@0@{hash}{hash}00.data");
        assert_eq!(
            parse_object_name(&too_long).err(),
            Some(NameError::ChunkHash)
        );
        let longest = format!("m@0x01000100@0@{hash}{hash}.data");
        assert!(parse_object_name(&longest).is_ok());
    }

    #[test]
    fn object_key_stays_within_the_capacity_guard_budget() {
        assert!(std::mem::size_of::<ObjectKey>() <= 56);
    }

    #[test]
    fn table_round_trips_keys_and_absorbs_another_table() {
        let mut first = NameTable::new();
        let mut second = NameTable::new();
        let a: ObjectName = "org-SEP-a@0x01000100@0@00@s1.data".parse().unwrap();
        let b: ObjectName = "org-SEP-b@0x02000200@3@0102@s2.data".parse().unwrap();
        let key_a = first.intern_owned(&a);
        let key_b = second.intern_owned(&b);
        let key_a_in_second = second.intern_owned(&a);
        let remap = first.absorb(&second);
        assert_eq!(first.name(&remap(key_b)).to_string(), b.to_string());
        assert_eq!(remap(key_a_in_second), key_a);
        assert_eq!(first.model_count(), 2);
        assert_eq!(first.model(key_a.model), "org/a");
        assert_eq!(first.model_id("org/b"), Some(remap(key_b).model));
        assert_eq!(first.model_id("org/c"), None);
    }

    #[test]
    fn lookup_finds_interned_names_and_interns_nothing() {
        let mut table = NameTable::new();
        let salted = "org-SEP-a@0x01000100@0@00@s1.data";
        let key = table.intern(&parse_object_name(salted).unwrap());
        assert_eq!(table.lookup(&parse_object_name(salted).unwrap()), Some(key));
        for unknown in [
            "org-SEP-b@0x01000100@0@00@s1.data",
            "org-SEP-a@0x01000100@0@00@s2.data",
        ] {
            assert_eq!(table.lookup(&parse_object_name(unknown).unwrap()), None);
        }
        let unsalted = table
            .lookup(&parse_object_name("org-SEP-a@0x01000100@0@0011.data").unwrap())
            .unwrap();
        assert_eq!(
            table.name(&unsalted).to_string(),
            "org-SEP-a@0x01000100@0@0011.data"
        );
        assert_eq!(table.model_count(), 1);
    }

    fn field() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._-]{1,24}"
    }

    fn object_name() -> impl Strategy<Value = ObjectName> {
        (
            proptest::collection::vec(field(), 1..4),
            any::<u32>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 1..=MAX_HASH_BYTES),
            proptest::option::of(field()),
        )
            .prop_filter(
                "`-SEP-` inside a segment is ambiguous by design",
                |(segs, ..)| {
                    segs.iter().all(|s| !s.contains(MODEL_SEPARATOR))
                        && !segs.join("/").contains(MODEL_SEPARATOR)
                },
            )
            .prop_map(|(segments, rank, group, hash, salt)| ObjectName {
                model: segments.join("/"),
                kv_rank: KvRank::from_raw(rank),
                object_group: group,
                chunk_hash: ChunkHash::from_bytes(&hash).unwrap(),
                salt,
            })
    }

    proptest! {
        #[test]
        fn every_field_round_trips(name in object_name()) {
            let file = name.to_string();
            prop_assert!(!file.contains('/'));
            let back: ObjectName = file.parse().unwrap();
            prop_assert_eq!(&back, &name);
            let temp = name.temp_file_name();
            prop_assert_eq!(ObjectName::from(parse_temp_name(&temp).unwrap()), name.clone());
            let mut table = NameTable::new();
            let key = table.intern(&parse_object_name(&file).unwrap());
            prop_assert_eq!(table.name(&key).to_string(), file);
        }

        #[test]
        fn kv_rank_fields_round_trip(w in any::<u8>(), r in any::<u8>(), lw in any::<u8>(), lr in any::<u8>()) {
            let rank = KvRank::new(w, r, lw, lr);
            prop_assert_eq!(
                (rank.world_size(), rank.rank(), rank.local_world_size(), rank.local_rank()),
                (w, r, lw, lr)
            );
        }

        #[test]
        fn whatever_decodes_encodes_to_the_same_bytes(s in "[a-z0-9@x.SEP-]{0,40}(\\.data)?") {
            if let Ok(parsed) = parse_object_name(&s) {
                prop_assert_eq!(parsed.to_string(), s);
            }
        }
    }
}

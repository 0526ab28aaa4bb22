//! The keys LMCache 0.5.6 gives its objects in `s3` tiers.
//!
//! An object key is `<model>@<kv_rank>@<object_group_id>@<chunk_hash>[@<cache_salt>]`
//! (read from the LMCache 0.5.6 wheel and seen in bucket listings, recorded
//! in `fixtures/lmcache-0.5.6/object-names.txt`): the fields of a file name
//! of [`crate::codec`], with three differences: the model keeps its `/`,
//! the kv_rank has no `0x`, and there is no suffix.
//!
//! Decoding is as strict as for file names: a key decodes only if
//! [`s3_key`] of what it decodes to gives the very same bytes back, so
//! anything else in a bucket (another program's objects, a key LMCache did
//! not write) is left alone as foreign. A model name holding `-SEP-` does
//! not decode: its file-name form would be ambiguous.

use crate::codec::{parse_object_name, NameError, ObjectName, DATA_SUFFIX, MODEL_SEPARATOR};

/// Decodes an S3 object key of LMCache's (without the tier's key prefix).
///
/// # Errors
/// [`NameError`] naming the field at fault; [`NameError::Model`] also for a
/// model holding `-SEP-` or NUL.
pub fn parse_s3_key(key: &str) -> Result<ObjectName, NameError> {
    if key.contains(MODEL_SEPARATOR) {
        return Err(NameError::Model);
    }
    let mut fields = key.splitn(3, '@');
    let (Some(model), Some(rank), Some(rest)) = (fields.next(), fields.next(), fields.next())
    else {
        return Err(NameError::FieldCount {
            found: key.split('@').count(),
        });
    };
    let file_name = format!(
        "{}@0x{rank}@{rest}{DATA_SUFFIX}",
        model.replace('/', MODEL_SEPARATOR)
    );
    let name = ObjectName::from(parse_object_name(&file_name)?);
    if s3_key(&name) != key {
        return Err(NameError::Model);
    }
    Ok(name)
}

/// The S3 key LMCache writes for `name` (without a key prefix).
pub fn s3_key(name: &ObjectName) -> String {
    let mut key = format!(
        "{}@{:08x}@{:x}@{}",
        name.model,
        name.kv_rank.raw(),
        name.object_group,
        name.chunk_hash
    );
    if let Some(salt) = &name.salt {
        key.push('@');
        key.push_str(salt);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_s3_key_of_the_recorded_listing_decodes_and_encodes_back() {
        let recorded = include_str!("../../fixtures/lmcache-0.5.6/object-names.txt");
        let keys: Vec<&str> = recorded
            .lines()
            .skip_while(|l| !l.starts_with("# s3 keys"))
            .skip(1)
            .take_while(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(keys.len(), 8, "{keys:?}");
        for key in keys {
            let name = parse_s3_key(key).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(name.model, "test-model");
            assert_eq!(name.kv_rank.raw(), 0x0100_0100);
            assert_eq!(s3_key(&name), key);
        }
    }

    #[test]
    fn a_model_with_slashes_and_a_salt_decodes() {
        let key = "meta-llama/Llama-3.1-8B@04020401@1f@00ff@tenant-a";
        let name = parse_s3_key(key).unwrap();
        assert_eq!(name.model, "meta-llama/Llama-3.1-8B");
        assert_eq!(name.object_group, 0x1f);
        assert_eq!(name.salt.as_deref(), Some("tenant-a"));
        assert_eq!(s3_key(&name), key);
        let path_model = "/models/llama@01000100@0@00";
        assert_eq!(parse_s3_key(path_model).unwrap().model, "/models/llama");
    }

    #[test]
    fn keys_that_are_not_lmcaches_do_not_decode() {
        for key in [
            "notes.txt",
            "m@0x01000100@0@00",
            "m@01000100@0@00.data",
            "m@0100010@0@00",
            "m@01000100@00@00",
            "m@01000100@0@0",
            "m@01000100@0@AB",
            "a-SEP-b@01000100@0@00",
            "m@01000100@0@00@",
            "m@01000100@0@00@s@t",
        ] {
            assert!(parse_s3_key(key).is_err(), "{key} decoded");
        }
    }
}

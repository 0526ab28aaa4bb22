//! The cache identity in a bucket: the gateway keeps LMCache's objects
//! under a key segment named after the launch's cache identity, so nodes of
//! another identity (other weights, another KV dtype, block or chunk size
//! under the same `--model`) never read them (`docs/s3-gateway.md`, "The
//! cache identity in a bucket").
//!
//! A tier's `cache_identity` is a tag of 16 lowercase hex digits (the
//! launch sets the first 16 of its identity's blake3 digest). LMCache's key
//! `<key>` is stored as `<s3_key_prefix>cache-identity-<tag>/<key>`; its
//! listings stay inside that segment and come back without it. The bucket
//! bound counts every identity's objects of a model it knows as one budget
//! ([`model_of`]).

/// The spec key of an `s3_bucket` tier that holds its tag; LMCache never
/// sees it.
pub const CACHE_IDENTITY: &str = "cache_identity";

/// What every identity segment starts with.
pub const SEGMENT_PREFIX: &str = "cache-identity-";

/// Hex digits in a tag.
pub const TAG_LEN: usize = 16;

/// Checks that `tag` is a cache identity tag: [`TAG_LEN`] lowercase hex
/// digits. Errors with what is wrong.
pub fn check_tag(tag: &str) -> Result<(), String> {
    let hex = tag
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    match tag.len() == TAG_LEN && hex {
        true => Ok(()),
        false => Err(format!(
            "{} is not {TAG_LEN} lowercase hex digits",
            lmcache_tier_spec::shown_value(tag)
        )),
    }
}

/// The key segment of `tag`: `cache-identity-<tag>/`.
pub fn segment(tag: &str) -> String {
    format!("{SEGMENT_PREFIX}{tag}/")
}

/// `key` (inside the tier's prefix) split into its identity tag and the
/// rest: `("0123456789abcdef", "m@...")` for
/// `cache-identity-0123456789abcdef/m@...`, `(None, key)` for a key
/// without a segment.
pub fn split(key: &str) -> (Option<&str>, &str) {
    let Some(rest) = key.strip_prefix(SEGMENT_PREFIX) else {
        return (None, key);
    };
    match rest.split_once('/') {
        Some((tag, after)) if check_tag(tag).is_ok() => (Some(tag), after),
        _ => (None, key),
    }
}

/// The model a bound counts an object's decoded model under: the model
/// without its identity segment, so every identity of a model shares the
/// model's place in the budget.
pub fn model_of(model: &str) -> &str {
    split(model).1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_sixteen_lowercase_hex_digits() {
        assert_eq!(check_tag("0123456789abcdef"), Ok(()));
        for bad in [
            "",
            "0123456789ABCDEF",
            "0123456789abcde",
            "0123456789abcdef0",
            "../../../etc/pas",
            "0123456789abcde/",
            "0123456789abcdeé",
        ] {
            assert!(check_tag(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn only_a_whole_segment_is_split_off() {
        let tag = "0123456789abcdef";
        let key = format!("{}org/m@0x01000000@0@ab", segment(tag));
        assert_eq!(split(&key), (Some(tag), "org/m@0x01000000@0@ab"));
        for plain in [
            "org/m@0x01000000@0@ab",
            "cache-identity-/m@x",
            "cache-identity-0123456789abcdef",
            "cache-identity-0123456789ABCDEF/m@x",
            "cache-identity-0123/m@x",
            "./cache-identity-0123456789abcdef/m@x",
        ] {
            assert_eq!(split(plain), (None, plain));
        }
        assert_eq!(model_of(&format!("{}a/b", segment(tag))), "a/b");
        assert_eq!(model_of("a/b"), "a/b");
    }
}

//! Repeated keys in operator JSON. serde_json keeps the last of two equal
//! keys without a word, so `{"type":"fs","type":"s3"}` would be read as an
//! `s3` tier; LMCache's Python `json.loads` does the same. The project
//! refuses such JSON instead (`docs/configuration.md`, "Variables"), and
//! finds the key with a deserializer that builds nothing.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// A key written twice in one JSON object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatedKey {
    /// The position of the top-level array element (the tier of a cascade)
    /// that holds it; `None` when the text is not an array.
    pub element: Option<usize>,
    /// The key, and where its second occurrence ends (serde_json's line and
    /// column).
    pub detail: String,
}

/// The first key written twice in one object of the JSON `text`, at any
/// depth; `None` when there is none, or when `text` is not JSON (its
/// parser says so).
pub fn repeated_key(text: &str) -> Option<RepeatedKey> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let mut element = None;
    let found = Top {
        element: &mut element,
    }
    .deserialize(&mut deserializer)
    .err()?;
    let detail = found.to_string();
    detail
        .starts_with(MESSAGE)
        .then_some(RepeatedKey { element, detail })
}

const MESSAGE: &str = "the key ";

/// The text's top level: an array's elements are counted, so the element
/// that holds the key can be named.
struct Top<'a> {
    element: &'a mut Option<usize>,
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut position = 0;
        *self.element = Some(position);
        while seq.next_element_seed(Unique)?.is_some() {
            position += 1;
            *self.element = Some(position);
        }
        *self.element = None;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        Unique.visit_map(map)
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Any JSON value whose objects must each hold every key once.
#[derive(Clone, Copy)]
struct Unique;

impl<'de> DeserializeSeed<'de> for Unique {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Unique {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Unique)?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key.clone()) {
                return Err(serde::de::Error::custom(format!(
                    "{MESSAGE}{} is written twice in one object",
                    crate::shown_value(&key)
                )));
            }
            map.next_value_seed(Unique)?;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_key_written_twice_at_any_depth_and_names_the_element() {
        let cases = [
            (r#"{"type":"fs","type":"s3"}"#, None, "\"type\""),
            (
                r#"[{"type":"fs"},{"type":"fs","base_path":"/a","base_path":"/b"}]"#,
                Some(1),
                "\"base_path\"",
            ),
            (
                r#"{"type":"fs","eviction":{"eviction_ratio":0.1,"eviction_ratio":0.9}}"#,
                None,
                "\"eviction_ratio\"",
            ),
            (r#"{"a":[1,{"b":1,"b":2}]}"#, None, "\"b\""),
        ];
        for (text, element, key) in cases {
            let found = repeated_key(text).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(found.element, element, "{text}");
            assert!(
                found.detail.contains(key) && found.detail.contains("column"),
                "{found:?}"
            );
        }
        for text in [
            r#"{"a":1,"b":{"a":2}}"#,
            "[]",
            r#"[{"a":1},{"a":2}]"#,
            "not json",
            "3",
        ] {
            assert_eq!(repeated_key(text), None, "{text}");
        }
    }
}

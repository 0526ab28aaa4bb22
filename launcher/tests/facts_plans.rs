//! Plans from recorded facts. Each `tests/facts/<name>.json` holds an
//! engine, the node's variables, the facts a launch measures (as [`Facts`]
//! serialises them) and the plan expected from them. Planning is a pure
//! function of those three, so the plan is the same on every machine, and
//! together the fixtures cover every sizing rule of `docs/sizing.md`
//! (checked below).
//!
//! After an intended change, rewrite the expected plans with
//! `EREBINE_BLESS_GOLDEN=1 cargo test -p lmcache-launcher --test
//! facts_plans` and review the diff.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use lmcache_launcher::{plan, EngineFacts, Facts, HostFacts, Vars};
use serde_json::{json, Value};

/// One fixture: its path and its JSON.
fn fixtures() -> Vec<(PathBuf, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/facts");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no fixtures in {}", dir.display());
    paths
        .into_iter()
        .map(|p| {
            let text = fs::read_to_string(&p).unwrap();
            let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            (p, value)
        })
        .collect()
}

/// The plan (or the error) the fixture's inputs give, as JSON.
fn planned(fixture: &Value) -> Value {
    let engine: EngineFacts = serde_json::from_value(fixture["engine"].clone()).unwrap();
    let facts: Facts = serde_json::from_value(fixture["facts"].clone()).unwrap();
    let vars: Vars = fixture["vars"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.into(), v.as_str().unwrap().into()))
        .collect();
    match plan(&engine, &vars, &HostFacts::from(&facts)) {
        Ok(planned) => planned.to_json(),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

#[test]
fn every_fixture_plans_as_recorded() {
    let bless = std::env::var_os("EREBINE_BLESS_GOLDEN").is_some();
    for (path, mut fixture) in fixtures() {
        let got = planned(&fixture);
        if bless {
            fixture["plan"] = got;
            let text = serde_json::to_string_pretty(&fixture).unwrap() + "\n";
            fs::write(&path, text).unwrap();
            continue;
        }
        assert_eq!(
            got,
            fixture["plan"],
            "{}: the plan differs from the recorded one",
            path.display()
        );
    }
}

#[test]
fn the_facts_of_every_fixture_read_back_as_written() {
    for (path, fixture) in fixtures() {
        let facts: Facts = serde_json::from_value(fixture["facts"].clone()).unwrap();
        assert_eq!(
            serde_json::to_value(&facts).unwrap(),
            fixture["facts"],
            "{}",
            path.display()
        );
    }
}

/// Every rule of `docs/sizing.md` and of the plan, by the decision it
/// decides: each must be chosen in at least one fixture.
const RULES: &[(&str, &[&str])] = &[
    ("host.memory", &["host-ram", "cgroup-limit"]),
    ("l1_budget", &["explicit", "derived-25pct-ram"]),
    (
        "l1_size",
        &[
            "explicit",
            "derived-25pct-ram",
            "write-buffer",
            "extra-args",
        ],
    ),
    (
        "chunk_size",
        &[
            "explicit",
            "half-max-batched-tokens",
            "explicit-raised-hybrid-block",
            "derived-raised-hybrid-block",
            "extra-args",
        ],
    ),
    (
        "cascade_source",
        &["built-in", "l1-only", "custom", "extra-args"],
    ),
    (
        "disk.capacity",
        &[
            "disabled-explicit",
            "explicit",
            "explicit-capped-75pct",
            "below-1gib",
            "derived-nearly-full",
            "derived-75pct-volume",
            "derived-8x-l1",
            "derived-12.5pct-volume",
            "derived-room",
            "explicit-unmeasured",
            "memory-bound",
        ],
    ),
    (
        "disk.volume_kind",
        &[
            "local",
            "memory-backed",
            "fuse",
            "network",
            "implausible-statistics",
            "unrecognised-type",
        ],
    ),
    ("disk.io_workers", &["half-physical-cores"]),
    (
        "disk.use_odirect",
        &[
            "block-size-misaligned",
            "probe-succeeded",
            "probe-failed",
            "probe-volume-full",
        ],
    ),
];

/// Every refusal of a plan from its facts: each must be the recorded
/// error of at least one fixture.
const REFUSALS: &[&str] = &[
    "is a FUSE filesystem",
    "is a network or shared filesystem",
    "reports figures that cannot be true",
    "on a memory-backed volume",
    "both ask for port",
    "is a kernel pseudo-filesystem",
];

#[test]
fn the_fixtures_cover_every_refusal() {
    let errors: Vec<String> = fixtures()
        .into_iter()
        .filter_map(|(_, f)| f["plan"]["error"].as_str().map(str::to_string))
        .collect();
    let missing: Vec<&&str> = REFUSALS
        .iter()
        .filter(|r| !errors.iter().any(|e| e.contains(**r)))
        .collect();
    assert!(missing.is_empty(), "no fixture is refused with {missing:?}");
}

#[test]
fn the_fixtures_cover_every_sizing_rule() {
    let mut chosen = BTreeSet::new();
    for (_, fixture) in fixtures() {
        let decisions = &fixture["plan"]["decisions"];
        for (decision, _) in RULES {
            let at = decision
                .split('.')
                .fold(decisions, |value, key| &value[key]);
            if let Some(rule) = at["rule"].as_str() {
                chosen.insert((decision.to_string(), rule.to_string()));
            }
        }
    }
    let missing: Vec<String> = RULES
        .iter()
        .flat_map(|(decision, rules)| rules.iter().map(move |rule| (decision, rule)))
        .filter(|(decision, rule)| !chosen.contains(&(decision.to_string(), rule.to_string())))
        .map(|(decision, rule)| format!("{decision}: {rule}"))
        .collect();
    assert!(missing.is_empty(), "no fixture chooses {missing:?}");
}

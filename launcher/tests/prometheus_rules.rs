//! The alerting rules shipped under `deploy/prometheus/` pass `promtool
//! check rules`, and `promtool test rules` runs one case per alert; the
//! Grafana dashboards under `deploy/grafana/` are JSON whose every query
//! names only families of `docs/metrics.md`.

use std::path::{Path, PathBuf};
use std::process::Command;

use lmcache_tier_e2e::promtool;

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(path)
}

fn promtool_ok(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(deploy("prometheus"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn the_alerting_rules_check_and_every_alert_has_a_passing_case() {
    let rules = std::fs::read_to_string(deploy("prometheus/lmcache-node-alerts.yml")).unwrap();
    let alerts = rules
        .lines()
        .filter(|l| l.trim().starts_with("- alert: "))
        .count();
    let checked = promtool_ok(&["check", "rules", "lmcache-node-alerts.yml"]);
    assert!(
        checked.contains(&format!("SUCCESS: {alerts} rules found")),
        "promtool did not find the file's {alerts} alerts:\n{checked}"
    );
    promtool_ok(&["test", "rules", "lmcache-node-alerts.test.yml"]);
    let tests = std::fs::read_to_string(deploy("prometheus/lmcache-node-alerts.test.yml")).unwrap();
    for alert in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
    {
        assert!(
            tests.contains(&format!("alertname: {alert}")),
            "no test case for {alert}"
        );
    }
}

#[test]
fn every_dashboard_query_names_documented_families() {
    let documented = std::fs::read_to_string(deploy("../docs/metrics.md")).unwrap();
    for file in ["grafana/lmcache-node.json", "grafana/lmcache-fleet.json"] {
        let text = std::fs::read_to_string(deploy(file)).unwrap();
        let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
        let exprs: Vec<String> = dashboard["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
            .map(|t| t["expr"].as_str().unwrap().to_string())
            .collect();
        assert!(!exprs.is_empty(), "{file}");
        for expr in exprs {
            let families = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("lmcache_tier_"));
            for family in families {
                let short = family.trim_start_matches("lmcache_tier_");
                // A histogram's series carry a suffix its family does not.
                let short = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| short.strip_suffix(suffix))
                    .unwrap_or(short);
                assert!(
                    documented.contains(&format!("`{short}`")),
                    "{file}: {family} is not in docs/metrics.md"
                );
            }
        }
    }
}

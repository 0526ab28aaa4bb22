//! `lmcache-tier inspect` reads the node as `launch` plans it, and trusts
//! nothing it is answered: a port served by something other than LMCache is
//! not a healthy server.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output};

/// Answers every connection on a loopback port with `body` (200, JSON)
/// until the test ends; returns the port.
fn serve(body: Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 2048];
            let _ = stream.read(&mut request);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&body);
        }
    });
    port
}

fn fixture() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/lmcache-0.5.6/status/status-idle.json"
    ))
    .unwrap()
}

fn inspect(home: &std::path::Path, vars: &[(&str, String)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
        .env_clear()
        .env("HOME", home)
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .args(["inspect", "--json"])
        .output()
        .unwrap()
}

#[test]
fn inspect_polls_the_http_port_and_reads_the_tiers_extra_args_set() {
    let home = tempfile::tempdir().unwrap();
    let port = serve(fixture());
    let tier = home.path().join("extra-tier");
    let extra = format!(
        r#"--http-port {port} --l2-adapter {{"type":"fs","base_path":"{}"}}"#,
        tier.display()
    );
    let out = inspect(
        home.path(),
        &[
            ("EREBINE_AGENT_LMCACHE_HTTP_PORT", "1".into()),
            ("EREBINE_AGENT_LMCACHE_EXTRA_ARGS", extra),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["url"], format!("http://127.0.0.1:{port}/status"));
    let dirs: Vec<&str> = report["disk"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["path"].as_str())
        .collect();
    assert!(dirs.contains(&tier.to_str().unwrap()), "{dirs:?}");
    let builtin = home.path().join(".cache/erebine/lmcache");
    assert!(
        !dirs.contains(&builtin.to_str().unwrap()),
        "the built-in directory is not the node's tier: {dirs:?}"
    );
}

#[test]
fn an_answer_without_lmcaches_fields_is_not_a_healthy_server() {
    let home = tempfile::tempdir().unwrap();
    for body in [&b"{}"[..], br#"{"is_healthy": true}"#, b"[]"] {
        let port = serve(body.to_vec());
        let out = inspect(
            home.path(),
            &[("EREBINE_AGENT_LMCACHE_HTTP_PORT", port.to_string())],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(9), "{stderr}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["server"]["healthy"], false, "{report:#}");
    }
}

/// `inspect --json` prints one JSON document in every case: the report
/// (with `server.state` up, unhealthy or down, as exit statuses 0, 9 and 8
/// say), or an error document for input it refuses.
#[test]
fn inspect_json_prints_one_document_in_every_case() {
    let home = tempfile::tempdir().unwrap();
    let up = serve(fixture()).to_string();
    let unhealthy = serve(b"{}".to_vec()).to_string();
    let port = |p: &str| vec![("EREBINE_AGENT_LMCACHE_HTTP_PORT", p.to_string())];
    let reports = [
        (&up, 0, "up"),
        (&unhealthy, 9, "unhealthy"),
        (&"1".to_string(), 8, "down"),
    ];
    for (http_port, code, state) in reports {
        let out = inspect(home.path(), &port(http_port));
        assert_eq!(out.status.code(), Some(code), "{state}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{state}: not one JSON document: {e}"));
        assert_eq!(report["server"]["state"], state, "{report:#}");
    }
    let refused: [(&[&str], &str); 3] = [
        (&["--url", "file:///etc/passwd"], "1"),
        (&["--no-such-flag"], "1"),
        (&[], "not-a-port"),
    ];
    for (args, http_port) in refused {
        let vars = port(http_port);
        let out = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"))
            .env_clear()
            .env("HOME", home.path())
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .args(["inspect", "--json"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let document: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: not one JSON document: {e}"));
        assert_eq!(document["error"]["exit_status"], 2, "{document:#}");
        assert_eq!(document["error"]["kind"], "bad_input", "{document:#}");
        let message = document["error"]["message"].as_str().unwrap();
        assert!(!message.is_empty() && !message.contains('\n'), "{message}");
    }
}

/// A `/status` URL's user info and query may carry a secret: neither the
/// report nor its description of a failed poll repeats them.
#[test]
fn a_secret_in_the_url_is_never_printed() {
    let home = tempfile::tempdir().unwrap();
    for json in [true, false] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lmcache-tier"));
        cmd.env_clear().env("HOME", home.path()).args([
            "inspect",
            "--url",
            "http://user:pw-secret@127.0.0.1:1/status?tok=q-secret",
        ]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(8));
        for stream in [&out.stdout, &out.stderr] {
            let text = String::from_utf8_lossy(stream);
            assert!(!text.contains("secret"), "{text}");
        }
    }
}

//! A process that made itself a subreaper (`become_subreaper`, as an agent
//! linking the library may) and supervises several children: the orphans
//! one server leaves are stopped when that server is reaped, and nothing
//! else is: not another supervised server, not a child the process started
//! itself. This binary is a subreaper for all its tests, so it holds this
//! one test alone.

use std::time::Duration;

use lmcache_launcher::run::supervise::{become_subreaper, Output, Supervised, TREE_VARIABLE};
use tokio::process::Command;

/// The state letter and the parent of `pid`, from `/proc/<pid>/stat`.
fn state_and_parent(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.next()?.parse().ok()?))
}

/// Running, not a zombie (which still answers `kill(0)`).
fn alive(pid: i32) -> bool {
    matches!(state_and_parent(pid), Some((state, _)) if state != 'Z' && state != 'X')
}

#[tokio::test(flavor = "current_thread")]
async fn reaping_one_servers_orphans_leaves_every_other_child_alone() {
    become_subreaper().unwrap();
    // A wrapper that leaves its child behind and exits, as an
    // `erebine-lmcache` killed by SIGKILL leaves the Python server.
    let mut wrapper = Command::new("sh");
    wrapper.args(["-c", "sleep 300 & echo $!"]);
    let mut wrapper = Supervised::spawn(wrapper, Output::Tee).unwrap();
    let other_server = Supervised::spawn(
        {
            let mut sleep = Command::new("sleep");
            sleep.arg("300");
            sleep
        },
        Output::Tee,
    )
    .unwrap();
    let mut own_child = std::process::Command::new("sleep")
        .arg("300")
        .env_remove(TREE_VARIABLE)
        .spawn()
        .unwrap();
    assert!(wrapper.wait().await.unwrap().success());
    let orphan: i32 = wrapper.tail()[0].trim().parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while state_and_parent(orphan).map(|(_, parent)| parent) != Some(std::process::id() as i32) {
        assert!(
            std::time::Instant::now() < deadline,
            "the orphan was never adopted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    wrapper.reap_orphans(Duration::from_secs(5)).await;
    assert!(!alive(orphan), "the server's orphan {orphan} still runs");
    assert!(
        alive(other_server.pid()),
        "another server was stopped with the first one's orphans"
    );
    assert!(
        alive(own_child.id() as i32),
        "a child of the agent's own was stopped"
    );
    own_child.kill().unwrap();
    own_child.wait().unwrap();
}

#!/usr/bin/env python3
"""The timed part of benches/launch_start/run.sh (see there).

usage: bench.py WORK COUNT ROUNDS VENV RELEASE_DIR
"""
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PREFIX = "meta-llama-SEP-Llama-3.1-8B-Instruct"


def make_tier(tier, count):
    """COUNT empty objects of MODEL at TP=2, ranks 0 and 1 (LMCache 0.5.6 names)."""
    dfd = os.open(tier, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(count):
        h = hashlib.blake2b(b"launch:%d" % i, digest_size=32).hexdigest()
        name = f"{PREFIX}@0x0200020{i & 1}@0@{h}.data"
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd))
    os.close(dfd)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


def server_process_started(after_pids):
    """Whether a python process runs `lmcache server` that was not there before."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) in after_pids:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(b"python" in a for a in argv[:1]) and b"server" in argv and any(
            a.endswith(b"lmcache") for a in argv[1:2]
        ):
            return True
    return False


def pids():
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def timed_start(cmd, env, http_port, watch_process):
    """Seconds from the start to the server's process (or None) and to /status 200."""
    url = f"http://127.0.0.1:{http_port}/status"
    before = pids()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    process_at = None
    while True:
        now = time.monotonic() - t0
        if watch_process and process_at is None and server_process_started(before):
            process_at = now
        if (process_at is not None or not watch_process) and ready(url):
            ready_at = time.monotonic() - t0
            break
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited with {proc.returncode} before it was ready")
        if now > 600:
            raise SystemExit(f"{cmd[0]} not ready in 600 s")
        time.sleep(0.01)
    stop(proc)
    return process_at, ready_at


def timed_launch(tier, base, release):
    """`lmcache-tier launch` of MODEL at TP=2 on `tier`, timed by timed_start."""
    mp, http = free_port(), free_port()
    env = dict(base, EREBINE_AGENT_KV_CACHE_BACKEND="lmcache",
               EREBINE_AGENT_KV_OFFLOAD_SIZE_GB="1",
               EREBINE_AGENT_LMCACHE_DISK_PATH=tier,
               EREBINE_AGENT_LMCACHE_DISK_SIZE_GB="8",
               EREBINE_AGENT_LMCACHE_MP_PORT=str(mp),
               EREBINE_AGENT_LMCACHE_HTTP_PORT=str(http),
               EREBINE_AGENT_LMCACHE_PATH=os.path.join(release, "erebine-lmcache"))
    launch = [os.path.join(release, "lmcache-tier"), "launch", "--model", MODEL,
              "--tensor-parallel-size", "2"]
    return timed_start(launch, env, http, True)


def main():
    work, count, rounds, venv, release = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    tier, empty = os.path.join(work, "tier"), os.path.join(work, "empty")
    os.makedirs(empty, mode=0o700)
    base = dict(os.environ, VIRTUAL_ENV=venv, PATH=f"{venv}/bin:{os.environ['PATH']}",
                LMCACHE_TRACK_USAGE="false")
    # A first launch on the empty tier records the launch identity, so the
    # objects made next are this launch's and housekeeping keeps them all.
    timed_launch(tier, base, release)
    t = time.monotonic()
    make_tier(tier, count)
    print(f"# created {count} objects in {time.monotonic() - t:.0f} s")
    scan_bin = os.path.join(release, "examples", "housekeeping-bench")
    results = {"scan": [], "stock_ready": [], "launch_process": [], "launch_ready": []}
    subprocess.run([scan_bin, "scan", tier], stdout=subprocess.DEVNULL, check=True)  # warm the cache
    for r in range(1, rounds + 1):
        t = time.monotonic()
        subprocess.run([scan_bin, "scan", tier], stdout=subprocess.DEVNULL, check=True)
        results["scan"].append(time.monotonic() - t)

        mp, http = free_port(), free_port()
        spec = json.dumps({"type": "fs_native", "base_path": empty, "num_workers": 4,
                           "use_odirect": False, "max_capacity_gb": 8})
        stock = [f"{venv}/bin/lmcache", "server", "--host", "127.0.0.1", "--port", str(mp),
                 "--http-host", "127.0.0.1", "--http-port", str(http), "--l1-size-gb", "1",
                 "--eviction-policy", "LRU", "--l2-adapter", spec]
        _, at = timed_start(stock, base, http, False)
        results["stock_ready"].append(at)

        process_at, ready_at = timed_launch(tier, base, release)
        results["launch_process"].append(process_at)
        results["launch_ready"].append(ready_at)
        objects = sum(1 for n in os.listdir(tier) if n.endswith(".data"))
        if objects != count:
            raise SystemExit(f"the launch left {objects} of {count} objects: not a same-identity tier")
        print(f"round={r} scan_s={results['scan'][-1]:.2f} stock_ready_s={results['stock_ready'][-1]:.2f} "
              f"launch_to_server_process_s={process_at:.2f} launch_ready_s={ready_at:.2f}", flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("median " + " ".join(f"{k}_s={v:.2f}" for k, v in med.items()))
    print(f"server process start / scan = {med['launch_process'] / med['scan']:.2f}x; "
          f"launch ready - stock ready = {med['launch_ready'] - med['stock_ready']:.2f} s "
          f"= {(med['launch_ready'] - med['stock_ready']) / med['scan']:.2f}x one scan")


if __name__ == "__main__":
    main()

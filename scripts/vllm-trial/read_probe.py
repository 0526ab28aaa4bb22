"""The volume's read limit for scripts/vllm-trial.sh: reads every LMCache
object (`*.data`) in DIR with O_DIRECT, in 4 MiB reads, at 1, 4, 16 and 64
parallel streams (threads taking the next 4 MiB of the objects in turn), at
most --limit-gib a round, and prints one JSON object:
{"objects": N, "object_bytes": [min, max], "rounds": [{"streams", "bytes",
"seconds", "gb_per_s"}]} (GB = 10^9 bytes). O_DIRECT keeps the page cache
out, as LMCache's fs_native tier does where the volume takes it.

    python3 read_probe.py DIR [--limit-gib N]
"""

import argparse
import json
import mmap
import os
import queue
import sys
import threading
import time

BLOCK = 4 << 20


def round_of(files, streams, limit):
    work = queue.SimpleQueue()
    planned = 0
    for path, size in files:
        for offset in range(0, size, BLOCK):
            if planned >= limit:
                break
            work.put((path, offset))
            planned += min(BLOCK, size - offset)
    done = [0] * streams

    def reader(k):
        buf = mmap.mmap(-1, BLOCK)
        fds = {}
        try:
            while True:
                try:
                    path, offset = work.get_nowait()
                except queue.Empty:
                    return
                if path not in fds:
                    fds[path] = os.open(path, os.O_RDONLY | os.O_DIRECT)
                done[k] += os.preadv(fds[path], [buf], offset)
        finally:
            for fd in fds.values():
                os.close(fd)
            buf.close()

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(streams)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - started
    total = sum(done)
    return {"streams": streams, "bytes": total, "seconds": round(seconds, 3),
            "gb_per_s": round(total / seconds / 1e9, 3)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir")
    p.add_argument("--limit-gib", type=float, default=4.0)
    args = p.parse_args()
    files = sorted((e.path, e.stat().st_size) for e in os.scandir(args.dir)
                   if e.name.endswith(".data") and e.is_file(follow_symlinks=False))
    if not files:
        print(f"read_probe: no *.data objects in {args.dir}", file=sys.stderr)
        return 1
    limit = int(args.limit_gib * (1 << 30))
    rounds = [round_of(files, streams, limit) for streams in (1, 4, 16, 64)]
    sizes = [size for _, size in files]
    print(json.dumps({"objects": len(files), "object_bytes": [min(sizes), max(sizes)], "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Plain-Python reference for scan + plan, the way the launcher we replace
would do it: os.scandir + stat (no symlink following) + decode the name, then
the same plan as the Rust crate's benchmark (purge other model / world
size, then trim oldest-first by max(atime, mtime) to half the objects'
allocated bytes).

usage: scan_reference.py DIR
"""
import json
import os
import re
import sys
import time

OBJECT = re.compile(
    r"^([^@/]+)@0x([0-9a-f]{8})@(0|[1-9a-f][0-9a-f]{0,15})@((?:[0-9a-f]{2}){1,32})(?:@([^@/]+))?\.data$"
)
TEMP = re.compile(
    r"^([^@/]+)@0x([0-9a-f]{8})@(0|[1-9a-f][0-9a-f]{0,15})@((?:[0-9a-f]{2}){1,32})(?:@([^@/]+))?\.tmp$"
)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORLD_SIZE = 2


def main():
    start = time.monotonic()
    objects, temps, foreign = [], [], []
    with os.scandir(sys.argv[1]) as it:
        for entry in it:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            name = entry.name
            regular = (st.st_mode & 0o170000) == 0o100000
            m = OBJECT.match(name) if regular else None
            if m:
                model = m.group(1).replace("-SEP-", "/")
                kv_rank = int(m.group(2), 16)
                objects.append(
                    (model, kv_rank, int(m.group(3), 16), bytes.fromhex(m.group(4)), m.group(5),
                     st.st_blocks * 512, st.st_mtime_ns, st.st_atime_ns)
                )
            elif regular and TEMP.match(name):
                temps.append((name, st.st_blocks * 512))
            else:
                foreign.append(name)
    scanned = time.monotonic() - start
    deletions, survivors = [], []
    for o in objects:
        if o[0] != MODEL:
            deletions.append((o, "other_model"))
        elif (o[1] >> 24) != WORLD_SIZE:
            deletions.append((o, "other_world_size"))
        else:
            survivors.append((max(o[6], o[7]), o))
    capacity = sum(o[5] for o in objects) // 2
    kept = sum(s[1][5] for s in survivors)
    if kept > capacity:
        survivors.sort(key=lambda s: s[0])
        for _, o in survivors:
            if kept <= capacity:
                break
            kept -= o[5]
            deletions.append((o, "trim"))
    deletions.extend((t, "stale_temp") for t in temps)
    total = time.monotonic() - start
    print(json.dumps({"mode": "python-reference", "objects": len(objects), "foreign": len(foreign),
                      "planned_deletions": len(deletions), "scan_s": round(scanned, 3),
                      "scan_plan_s": round(total, 3)}))


if __name__ == "__main__":
    main()

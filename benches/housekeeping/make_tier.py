#!/usr/bin/env python3
"""Fill a directory with empty files named like an LMCache 0.5.6 fs_native tier.

usage: make_tier.py DIR COUNT [SEED] [empty]

Mix (per 100 files): 80 objects of the launch's model at TP=2
(`meta-llama-SEP-Llama-3.1-8B-Instruct@0x0200020r@0@<32-byte hash>.data`,
rank r = 0/1), 8 of them salted, 10 of another model at TP=1, 5 from
`lmcache bench l2` (16-byte hashes), 3 stale `.tmp` files, 2 foreign files.
Object and temp files hold one byte (one 4 KiB block allocated on ext4), so
the capacity trim has bytes to count; foreign files are empty. With `empty`,
every file is empty (no blocks to free: a delete measures the directory work,
not the volume's discard of freed blocks).
"""
import hashlib
import os
import sys


def names(count, seed):
    for i in range(count):
        h = hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=32).hexdigest()
        k = i % 100
        if k < 80:
            rank = i & 1
            salt = "@tenant-%d" % (i % 7) if k < 8 else ""
            yield f"meta-llama-SEP-Llama-3.1-8B-Instruct@0x0200020{rank}@0@{h}{salt}.data"
        elif k < 90:
            yield f"Qwen-SEP-Qwen2.5-7B-Instruct@0x01000100@0@{h}.data"
        elif k < 95:
            yield f"bench-model@0x{i % 4:08x}@0@{h[:32]}.data"
        elif k < 98:
            yield f"meta-llama-SEP-Llama-3.1-8B-Instruct@0x02000200@0@{h}.tmp"
        else:
            yield f"notes-{h[:12]}.txt"


def main():
    target, count = sys.argv[1], int(sys.argv[2])
    seed = sys.argv[3] if len(sys.argv) > 3 else "bench"
    empty = len(sys.argv) > 4 and sys.argv[4] == "empty"
    os.makedirs(target, exist_ok=True)
    dfd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for name in names(count, seed):
        fd = os.open(name, flags, 0o644, dir_fd=dfd)
        if not empty and not name.endswith(".txt"):
            os.write(fd, b"k")
        os.close(fd)
    os.close(dfd)


if __name__ == "__main__":
    main()

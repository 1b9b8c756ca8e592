#!/usr/bin/env python3
"""What storing one file costs the artifact store, per way of copying it.

python benchmarks/bench_artifacts_copy.py [--dir DIR] [--mb 200] [--repeat 5]

``copy_hashed`` (expr_tracker/artifacts/files.py) makes every stored copy, cheapest way
first: a reflink clone (then read once for the hash), ``copy_file_range`` (then read back for
the hash), or a plain read-hash-write. This times each of them on one ``--mb`` file in
``--dir`` (its file system decides which are possible: ext4 has no clone; XFS with reflink
and Btrfs do), and, for comparison, hashing alone (what ``mode: link`` pays). The source is
in the page cache (a checkpoint just saved); each copy is removed and ``sync`` run before the
next timing; the ways are interleaved. Prints, per way, the wall time of ``--repeat`` runs
(median, min, max) and the median CPU time of this process (user + system: kernel copies
made for it included, the later writeback of dirty pages not), which a loaded machine
disturbs less.
"""

from __future__ import annotations

import argparse
import errno
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from expr_tracker.artifacts import files


def _once(fn, cleanup) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process: user + system) of one call."""
    os.sync()
    c, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    took, c2 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    cleanup()
    return took, (c2.ru_utime - c.ru_utime) + (c2.ru_stime - c.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="a folder on the file system to measure")
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="et-bench-copy-") as d:
        src, dst = Path(d) / "ckpt.pt", Path(d) / "copy"
        block = os.urandom(1 << 20)
        with open(src, "wb") as f:
            for _ in range(args.mb):
                f.write(block)
        files.hash_file(src)  # in the page cache, as a checkpoint just written

        def rm() -> None:
            dst.unlink(missing_ok=True)

        def copy() -> None:
            files.copy_hashed(src, dst)

        no_clone = mock.patch.object(files, "_clone", lambda fin, fout: False)

        def plain() -> None:
            with no_clone, mock.patch.object(os, "copy_file_range", create=True) as cfr:
                cfr.side_effect = OSError(errno.ENOSYS, "not here")  # the read and write
                copy()

        def in_kernel() -> None:
            with no_clone:
                copy()

        clones: list[bool] = []
        real = files._clone
        with mock.patch.object(
            files, "_clone", lambda a, b: clones.append(real(a, b)) or clones[-1]
        ):
            copy()
            rm()
        ways = {"plain read/hash/write": plain}
        if hasattr(os, "copy_file_range"):
            ways["copy_file_range + read back"] = in_kernel
        if clones[0]:
            ways["reflink clone + read for hash"] = copy
        else:
            print("(no reflink clone on this file system)")
        ways["hash only (mode: link)"] = lambda: files.hash_file(src)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        for i in range(args.repeat):  # interleaved, the order turning: load hits all alike
            names = list(ways)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                times[name].append(_once(ways[name], rm))
        print(f"{args.mb} MB in {d} ({os.uname().sysname} {os.uname().release})")
        for name, ts in times.items():
            wall, cpu = [w for w, _ in ts], [c for _, c in ts]
            print(
                f"  {name:32s} wall median {statistics.median(wall):.3f} s "
                f"(min {min(wall):.3f}, max {max(wall):.3f}); "
                f"CPU median {statistics.median(cpu):.3f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: pack a realistic cache vs tar|zstd, compression ratios, decompress+extract.

    python3 bench/bench_pack.py > bench/pack.md

Builds (or reuses) bench/realistic_cache.py's cache: ~190 key dirs of real sm_90 compiles.
Every timing is the median of 3 runs on this machine; sizes are exact.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import realistic_cache  # noqa: E402
import zstandard  # noqa: E402

from cachebake.artifact.pack import pack_artifact, parse_root  # noqa: E402
from cachebake.artifact.layer import COMPRESSION  # noqa: E402


def median_time(fn, runs=3):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def sh(cmd):
    subprocess.run(["bash", "-c", cmd], check=True)


def main():
    cache = realistic_cache.build()
    files = [p for p in cache.rglob("*") if p.is_file()]
    raw = sum(p.stat().st_size for p in files)
    work = Path(tempfile.mkdtemp(prefix="cachebake-bench-"))
    rows = []
    try:
        art = work / "art"

        def do_pack(prune=False, out=art):
            shutil.rmtree(out, ignore_errors=True)
            return pack_artifact([parse_root(f"triton={cache}")], out, target="sm_90", prune_ir=prune)

        t_pack = median_time(do_pack)
        rep = do_pack()
        rows.append((f"cachebake pack ({COMPRESSION})", t_pack, rep.manifest.layer.size))
        pruned = work / "pruned"
        t_pruned = median_time(lambda: do_pack(True, pruned))
        rep_pruned = do_pack(True, pruned)
        rows.append((f"cachebake pack --prune-ir ({COMPRESSION})", t_pruned, rep_pruned.manifest.layer.size))
        for label, comp in [("tar -c | gzip -6", "gzip -6"), ("tar -c | zstd -3 -T0", "zstd -q -3 -T0"),
                            ("tar -c | zstd -9 -T0", "zstd -q -9 -T0"), ("tar -c | zstd -19 -T0", "zstd -q -19 -T0"),
                            ("tar -c | zstd -19 --long -T0", "zstd -q -19 --long=27 -T0")]:
            out = work / "x"
            t = median_time(lambda: sh(f"tar -C {cache} -cf - . | {comp} > {out}"))
            rows.append((label, t, out.stat().st_size))

        layer = Path(art / "blobs" / "sha256" / rep.manifest.layer.digest.split(":")[1])
        dest = work / "extract"

        def py_extract():
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            with open(layer, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r, \
                    tarfile.open(fileobj=r, mode="r|") as tar:
                tar.extractall(dest, filter="data")

        def cli_extract():
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            sh(f"zstd -q -d -c {layer} | tar -C {dest} -xf -")

        t_py = median_time(py_extract)
        t_cli = median_time(cli_extract)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"# pack benchmark\n\n{date.today()}, {platform.node() or 'host'}: {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, zstandard {zstandard.__version__}, {platform.machine()}\n")
    print(f"Command: `python3 bench/bench_pack.py`. Cache: bench/realistic_cache.py, {len(files)} files in "
          f"{sum(1 for p in cache.iterdir() if p.is_dir())} key dirs, {raw / 1e6:.1f} MB raw (real sm_90 AOT compiles). "
          "Times: median of 3.\n")
    print("| how | seconds | compressed | % of raw |\n| --- | ---: | ---: | ---: |")
    for label, t, size in rows:
        print(f"| {label} | {t:.2f} | {size / 1e6:.2f} MB | {100 * size / raw:.1f}% |")
    print("\n| decompress + extract the cachebake layer | seconds |\n| --- | ---: |")
    print(f"| python zstandard + tarfile (data filter) | {t_py:.2f} |")
    print(f"| zstd -d \\| tar -x | {t_cli:.2f} |")


if __name__ == "__main__":
    main()

"""Benchmark: `cachebake install` of a realistic cache vs `zstd -d | tar -x` on the same disk.

The cache: bench/realistic_cache.py (hundreds of genuinely different sm_90 AOT compiles, tens
of MB; built once and reused), packed with the real packer (cachebake.artifact.pack).

    python3 bench/bench_install.py [--repeat 5] [--out bench/install.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "kit"), str(REPO / "bench")]

NOTES = """Reading it: install reads the layer once (cachebake/install/extract.py): a helper thread
decompresses, the main thread parses and checks each tar header and makes the directories, and
each file is written right after its header passed: by the main thread itself on tmpfs (the
copy into memory is the work, and more threads only add hand-overs) and on a disk while
creating a file is fast; by up to three writer threads once it turns slow there (a window of 32
creations with a median over 80 us: creation is then kernel work that overlaps across
threads).  `--lanes` measures 0-3 writer threads, fixed.  The blob's digest is checked at the end, before the
switch.  Install also verifies every document, relocates Triton's group files for DIR, records
the inventory (install.json: each file's size and one ctime seal), syncs the filesystem once
(syncfs; not with `--no-sync`, what the init container and the Dockerfile run) and switches one
symlink; the pipeline does none of that.  A repeat install re-checks the installed
tree against install.json (one stat per entry) and otherwise costs Python's start.  The CLI
rows run with compiled bytecode, as a pip-installed cachebake has it.  This VM has
2 vCPUs shared with other work and its disk speed drifts a lot between runs: rounds are
interleaved in a shuffled order, the last column is the median over rounds of each method's
time divided by the pipeline's in the same round, and the load average at the start and end
is printed."""


def cache_stats(triton_dir: Path) -> tuple[int, int, int]:
    files = [p for p in triton_dir.rglob("*") if p.is_file()]
    dirs = sum(1 for p in triton_dir.iterdir() if p.is_dir())
    return dirs, len(files), sum(p.stat().st_size for p in files)


def _cpu() -> float:
    """CPU seconds of this process (every thread) and of its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def in_memory_dir(path: Path) -> bool:
    """Whether ``path`` is on tmpfs/ramfs (install/staging.py's choice of writer lanes)."""
    from cachebake.fsops import DIR_FLAGS, in_memory

    fd = os.open(path, DIR_FLAGS)
    try:
        return in_memory(fd)
    finally:
        os.close(fd)


def timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of one run: CPU counts the work whatever else loads the machine."""
    t, c = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - t, _cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--workdir", action="append", default=None,
                    help="where to pack and extract (the disk measured); repeatable "
                         "(default: the temp dir's disk, and /dev/shm as a CPU-bound reference)")
    ap.add_argument("--phases", action="store_true",
                    help="instead: time install's phases (extraction, syncfs, commit) beside the pipeline")
    ap.add_argument("--keep-trees", action="store_true",
                    help="on a disk, keep every run's tree until the end instead of deleting the last "
                         "one before the next run: on a filesystem mounted with discard, those deletes "
                         "make the next run's file creation several times slower")
    ap.add_argument("--lanes", action="store_true",
                    help="instead: time the extraction alone with 0-3 file-writer threads beside the "
                         "pipeline (what install/staging.py's choice rests on)")
    ap.add_argument("--parts", action="store_true",
                    help="instead: time the extraction alone, then with each part install adds "
                         "(group-file relocation, checkpoints, the digest-verified source), then install")
    args = ap.parse_args()
    workdirs = args.workdir or [tempfile.gettempdir()] + (["/dev/shm"] if os.path.isdir("/dev/shm") else [])
    if args.phases or args.lanes or args.parts:
        for workdir in workdirs:
            if args.phases:
                print(phases(workdir, args.repeat))
            else:
                print((lanes if args.lanes else parts)(workdir, args.repeat, args.keep_trees))
        return
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    lines = [
        "# Install benchmark",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.node()}, {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}, "
        f"Python {platform.python_version()}",
        f"- command: `python3 bench/bench_install.py --repeat {args.repeat}"
        f"{' --keep-trees' if args.keep_trees else ''}`",
        f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    for workdir in workdirs:
        lines += measure(workdir, args.repeat, with_cache_line=workdir == workdirs[0],
                         keep_trees=args.keep_trees)
    lines += ["", f"- load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", "", NOTES]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


def phases(workdir: str, repeat: int) -> str:
    """Where an install's time goes: extraction (decompress + check + write, one pass), the
    syncfs, the commit (marker, sync, links, switch), beside the pipeline on the same disk."""
    import installkit
    import realistic_cache
    from badlayers import layer_blob

    from cachebake.install import atomic, extract, install_artifact

    spent: dict[str, list[float]] = {}

    def timing(owner, name, label):
        real = getattr(owner, name)

        def timed_call(*a, **kw):
            t = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                spent.setdefault(label, []).append(time.perf_counter() - t)
        setattr(owner, name, timed_call)

    work = Path(tempfile.mkdtemp(prefix="cachebake-bench-", dir=workdir))
    try:
        art = installkit.pack(realistic_cache.build().parent, work / "artifact")
        fp = work / "fp.json"
        installkit.cli("fingerprint", "--target", "sm_90", "--out", fp, check=True)
        blob = layer_blob(art)
        timing(extract, "extract_layer", "extraction")
        timing(atomic, "sync_tree", "syncfs")
        timing(atomic.Transaction, "commit", "commit (incl. syncfs)")
        for i in range(repeat):
            os.sync()
            t = time.perf_counter()
            install_artifact(art, work / f"o{i}", fingerprint_file=str(fp))
            spent.setdefault("install_artifact()", []).append(time.perf_counter() - t)
            os.sync()
            (work / f"t{i}").mkdir()
            t = time.perf_counter()
            subprocess.run(f"zstd -d -c {blob} | tar -x -C {work / f't{i}'}", shell=True, check=True)
            spent.setdefault("zstd -d | tar -x", []).append(time.perf_counter() - t)
        return "\n".join(f"{workdir}: {k}: median {statistics.median(v) * 1000:.0f} ms, "
                         f"min {min(v) * 1000:.0f}, max {max(v) * 1000:.0f} (n={len(v)})"
                         for k, v in spent.items())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def extraction_rounds(workdir: str, repeat: int, keep_trees: bool, methods_for) -> str:
    """The pipeline and the methods ``methods_for(ctx)`` returns, each writing into a fresh
    directory, in shuffled rounds on one disk; medians and the per-round ratio to the pipeline.
    ``ctx``: art, blob, fp (a fingerprint file), limits and fresh() (a new empty directory)."""
    import installkit
    import realistic_cache
    from badlayers import layer_blob

    from cachebake.artifact.oci import open_artifact
    from cachebake.install import extract

    work = Path(tempfile.mkdtemp(prefix="cachebake-bench-", dir=workdir))
    try:
        art = installkit.pack(realistic_cache.build().parent, work / "artifact")
        fp = work / "fp.json"
        installkit.cli("fingerprint", "--target", "sm_90", "--out", fp, check=True)
        bake = open_artifact(art).select()
        # roots as long as an install's version dir, for the PATH_MAX budget
        limits = extract.LayerLimits.from_manifest(bake.manifest, bake.layer_size, (f"{work}/{'0' * 60}",))
        n = iter(range(10**6))

        def fresh() -> Path:
            d = work / f"x{next(n)}"
            d.mkdir()
            return d

        ctx = argparse.Namespace(art=art, blob=layer_blob(art), fp=fp, limits=limits, fresh=fresh)
        methods = [("zstd -d | tar -x", lambda: subprocess.run(f"zstd -d -c {ctx.blob} | tar -x -C {fresh()}",
                                                               shell=True, check=True))]
        methods += methods_for(ctx)
        spent: dict[str, list[float]] = {name: [] for name, _ in methods}
        rng = random.Random(0)
        memory = in_memory_dir(work)
        for _ in range(repeat):
            for name, fn in rng.sample(methods, len(methods)):
                if memory or not keep_trees:
                    for d in work.glob("x*"):
                        shutil.rmtree(d)
                os.sync()
                t = time.perf_counter()
                fn()
                spent[name].append(time.perf_counter() - t)
        kind = "tmpfs/ramfs" if memory else "not in memory" + (", trees kept" if keep_trees else "")
        pipeline = spent["zstd -d | tar -x"]
        return "\n".join(f"{workdir} ({kind}): {k}: median {statistics.median(v) * 1000:.1f} ms, "
                         f"min {min(v) * 1000:.1f}, max {max(v) * 1000:.1f}, / pipeline "
                         f"{statistics.median(a / b for a, b in zip(v, pipeline)):.2f}x (n={len(v)})"
                         for k, v in spent.items())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _extract_into(ctx, lanes=None, transform=False, checkpoint=False, verified=False):
    """extract_layer() of ctx's layer into a fresh directory, with the parts install adds."""
    import installkit

    from cachebake.artifact.reader import open_source
    from cachebake.install import extract, relocate
    from cachebake.fsops import DIR_FLAGS

    source = open_source(str(ctx.art)) if verified else None
    bake = source.select("sm_90") if verified else None

    def run():
        d = ctx.fresh()
        fd = os.open(d, DIR_FLAGS)
        try:
            with (source.open_layer(bake) if verified else open(ctx.blob, "rb")) as f:
                extract.extract_layer(f, ctx.limits, fd, relocate.group_rewriter(str(d)) if transform else None,
                                      installkit.Checkpoints() if checkpoint else (lambda _: None), lanes=lanes)
        finally:
            os.close(fd)
    return run


def lanes(workdir: str, repeat: int, keep_trees: bool = False) -> str:
    """extract_layer() with 0 (the extracting thread writes), 1, 2 and 3 writer threads."""
    return extraction_rounds(workdir, repeat, keep_trees, lambda ctx: [
        (f"extract_layer(lanes={k})", _extract_into(ctx, lanes=k)) for k in range(4)])


def parts(workdir: str, repeat: int, keep_trees: bool = False) -> str:
    """What install adds to the extraction, one part at a time, then all of install."""
    from cachebake.install import install_artifact

    return extraction_rounds(workdir, repeat, keep_trees, lambda ctx: [
        ("extract_layer() alone", _extract_into(ctx)),
        ("+ group-file relocation", _extract_into(ctx, transform=True)),
        ("+ checkpoints", _extract_into(ctx, checkpoint=True)),
        ("+ digest-verified source", _extract_into(ctx, verified=True)),
        ("all three", _extract_into(ctx, transform=True, checkpoint=True, verified=True)),
        ("install_artifact(sync=False)",
         lambda: install_artifact(ctx.art, ctx.fresh() / "d", fingerprint_file=str(ctx.fp), sync=False)),
    ])


def measure(workdir: str, repeat: int, with_cache_line: bool, keep_trees: bool = False) -> list[str]:
    import installkit

    from cachebake.install import install_artifact
    work = Path(tempfile.mkdtemp(prefix="cachebake-bench-", dir=workdir))
    memory = in_memory_dir(work)
    try:
        import realistic_cache

        triton_dir = realistic_cache.build()
        dirs, files, size = cache_stats(triton_dir)
        t = time.perf_counter()
        art = installkit.pack(triton_dir.parent, work / "artifact")
        pack_s = time.perf_counter() - t
        from badlayers import layer_blob
        blob = layer_blob(art)
        fp = work / "fp.json"
        installkit.cli("fingerprint", "--target", "sm_90", "--out", fp, check=True)
        n = iter(range(10**6))

        made: list[Path] = []

        def fresh() -> Path:
            made.append(work / f"to{next(n)}")
            return made[-1]

        def settle() -> None:
            """Untimed, between runs: flush what the run wrote (otherwise writeback of earlier
            runs slows later ones) and, unless --keep-trees on a disk, delete it first."""
            for d in made:
                if d.name != "to0" and not (keep_trees and not memory):
                    shutil.rmtree(d, ignore_errors=True)
            made.clear()
            os.sync()

        def ours():
            install_artifact(art, fresh(), fingerprint_file=str(fp))

        # The CLI as pip installs it, with compiled bytecode: from a checkout under
        # PYTHONDONTWRITEBYTECODE every start would compile cachebake's modules again (~25 ms here).
        cli_env = installkit.env_with(PYTHONPYCACHEPREFIX=work / "pycache")
        cli_env.pop("PYTHONDONTWRITEBYTECODE", None)

        def cli_install(to: Path) -> None:
            subprocess.run([sys.executable, "-m", "cachebake.cli", "install", str(art), "--to", str(to),
                            "--fingerprint", str(fp)], check=True, stdout=subprocess.DEVNULL, env=cli_env)

        def cli_ours():
            cli_install(fresh())

        def plain():
            d = fresh()
            d.mkdir()
            subprocess.run(f"zstd -d -c {blob} | tar -x -C {d}", shell=True, check=True)

        def plain_sync():
            d = fresh()
            d.mkdir()
            subprocess.run(f"zstd -d -c {blob} | tar -x -C {d} && sync -f {d}", shell=True, check=True)

        def ours_nosync():
            install_artifact(art, fresh(), fingerprint_file=str(fp), sync=False)

        ours()  # warm the page cache and imports once
        cli_ours()  # and the CLI's bytecode
        methods = [
            ("zstd -d \\| tar -x", plain),
            ("zstd -d \\| tar -x && sync -f", plain_sync),
            ("install_artifact() (in-process)", ours),
            ("install_artifact(sync=False): `install --no-sync`", ours_nosync),
            ("`cachebake install` CLI (incl. Python start)", cli_ours),
            ("repeat install: already installed (CLI)", lambda: cli_install(work / "to0")),
        ]
        # Interleaved rounds in a shuffled (seeded) order: this VM's disk and CPU speed drift,
        # every method should see the drift, and none should always follow the same neighbour.
        times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in methods}
        rng = random.Random(0)
        for _ in range(repeat):
            for name, fn in rng.sample(methods, len(methods)):
                settle()
                times[name].append(timed(fn))
        rows = list(times.items())
        fs = subprocess.run(["df", "-T", str(work)], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
        lines = []
        if with_cache_line:
            lines.append(
                f"- cache: bench/realistic_cache.py, {dirs} kernel dirs, {files} files, {size / 1e6:.1f} MB "
                "raw (real sm_90 AOT compiles); layer (cachebake pack) "
                f"{blob.stat().st_size / 1e6:.2f} MB ({100 * blob.stat().st_size / size:.1f}% of raw), "
                f"packed in {pack_s:.2f} s")
        lines += [
            "",
            f"## {fs} ({work.parent})",
            "",
            f"| method (n={repeat}) | median s | min s | max s | CPU s, median | CPU s, min "
            "| / pipeline, same round (median) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        pipeline = [w for w, _ in rows[0][1]]
        for name, ts in rows:
            wall, cpu = [w for w, _ in ts], [c for _, c in ts]
            paired = statistics.median(w / p for w, p in zip(wall, pipeline))
            lines.append(f"| {name} | {statistics.median(wall):.3f} | {min(wall):.3f} | {max(wall):.3f} "
                         f"| {statistics.median(cpu):.3f} | {min(cpu):.3f} | {paired:.2f}x |")
        return lines
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""cachebake.install.staging: every lane count writes the same tree, and the extractor the same
inventory in layer order; a lane's error reaches the extractor; no thread or fd outlives an extraction;
the filesystem decides the lanes."""

import io
import os
import threading

import pytest

from cachebake.artifact.layer import LayerWriter
from cachebake.artifact.snapshot import CacheRoot, snapshot_roots
from cachebake.errors import UnsafeArtifact
from cachebake import fsops
from cachebake.install import extract, staging
from cachebake.install.extract import LayerLimits, extract_layer


@pytest.fixture
def layer(triton_cache):
    """A real packer layer of a real Triton cache, widened to many directories so the lanes
    all get work: (compressed bytes, limits, {member: bytes})."""
    import tarfile

    import zstandard

    keys = [p for p in sorted(triton_cache.iterdir()) if p.is_dir()]
    for i in range(12):  # more key dirs than lanes, each with the real kernel's files
        copy = triton_cache / f"{keys[0].name[:-2]}{i:02d}"
        if not copy.exists():
            copy.mkdir()
            for f in keys[0].iterdir():
                (copy / f.name).write_bytes(f.read_bytes())
    snap = snapshot_roots([CacheRoot("triton", triton_cache)])
    buf = io.BytesIO()
    LayerWriter(buf).write(snap)
    tar = zstandard.ZstdDecompressor().decompress(buf.getvalue(), max_output_size=1 << 30)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        members = t.getmembers()
        files = {m.name: t.extractfile(m).read() for m in members if m.isreg()}
    limits = LayerLimits(roles=frozenset({"triton"}), entries=len(members), files=len(files),
                         file_bytes=sum(map(len, files.values())), tar_size=len(tar),
                         compressed_size=len(buf.getvalue()))
    return buf.getvalue(), limits, files


def _extract(blob, limits, root, lanes, monkeypatch=None):
    os.makedirs(root, exist_ok=True)
    fd = os.open(root, fsops.DIR_FLAGS)
    try:
        return extract_layer(io.BytesIO(blob), limits, fd, lanes=lanes)
    finally:
        os.close(fd)


def _tree(root):
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = (f.read(), os.stat(p).st_mode & 0o7777)
    return out


def _open_fds():
    return set(os.listdir("/proc/self/fd"))


def _staging_threads():
    return [t for t in threading.enumerate() if t.name.startswith("cachebake-staging")]


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_every_lane_count_writes_what_one_thread_writes(layer, tmp_path, lanes, monkeypatch):
    blob, limits, files = layer
    fds = _open_fds()
    one = _extract(blob, limits, tmp_path / "l0", 0, monkeypatch)
    many = _extract(blob, limits, tmp_path / f"l{lanes}", lanes, monkeypatch)
    tree = _tree(tmp_path / "l0")
    assert {n: data for n, (data, _) in tree.items()} == files
    assert _tree(tmp_path / f"l{lanes}") == tree
    # the inventory lists the files in layer order whoever wrote them, with their size on disk
    assert list(many.inventory) == list(one.inventory) == [n for n in files]
    for name, size in many.inventory.items():
        assert size == os.stat(tmp_path / f"l{lanes}" / name).st_size
    assert sorted(many.dirs) == sorted(one.dirs) and len(many.dirs) > lanes
    assert _open_fds() == fds and not _staging_threads()


@pytest.mark.parametrize("lanes", [0, 2])
def test_a_write_error_in_a_lane_reaches_the_extractor(layer, tmp_path, lanes, monkeypatch):
    """A file that cannot be created (here: a directory already holds its name, as EEXIST;
    ENOSPC and EIO take the same path) fails the extraction, and nothing is left running."""
    blob, limits, files = layer
    victim = sorted(files)[len(files) // 2]
    os.makedirs(tmp_path / "out" / victim)
    fds = _open_fds()
    with pytest.raises(FileExistsError):
        _extract(blob, limits, tmp_path / "out", lanes, monkeypatch)
    assert _open_fds() == fds and not _staging_threads()


@pytest.mark.parametrize("lanes", [0, 2])
def test_a_refusal_mid_stream_stops_the_lanes(layer, tmp_path, lanes, monkeypatch):
    """The layer declares one file fewer than it holds: refused at the surplus file, after the
    lanes have written some; no thread or fd survives."""
    blob, limits, files = layer
    limits.files -= 1
    limits.file_bytes -= min(map(len, files.values()))
    fds = _open_fds()
    with pytest.raises(UnsafeArtifact):
        _extract(blob, limits, tmp_path / "out", lanes, monkeypatch)
    assert _open_fds() == fds and not _staging_threads()


def _fstype(path) -> str:
    """The filesystem type /proc/self/mountinfo gives for ``path``'s device."""
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[2] == want:
                return fields[fields.index("-") + 1]
    return "?"


@pytest.mark.parametrize("path", ["/dev/shm", "tmp_path", "/proc"])
def test_in_memory_agrees_with_mountinfo(path, tmp_path):
    path = tmp_path if path == "tmp_path" else path
    if not os.path.isdir(path):
        pytest.skip(f"{path} does not exist here")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # devtmpfs is tmpfs inside (same magic): a /dev without its own /dev/shm mount shows it
        assert fsops.in_memory(fd) == (_fstype(path) in ("tmpfs", "ramfs", "devtmpfs"))
    finally:
        os.close(fd)


def test_lanes_follow_the_filesystem(tmp_path):
    """tmpfs: the extractor's thread writes (no lanes, no timing); a disk: it writes and times
    the first files' creation before choosing."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and _fstype("/dev/shm") == "tmpfs" else None
    for path in [tmp_path, *([shm] if shm else [])]:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            s = staging.Staging(fd, extract.LayerStats(), lambda _: None)
            assert s.lanes == 0
            assert (s._out.creations is None) == (_fstype(path) in ("tmpfs", "ramfs"))
            s.finish()
        finally:
            os.close(fd)


@pytest.mark.parametrize("slow_create_s,fans_out", [(0.0, True), (1.0, False)])
def test_slow_creation_hands_the_rest_to_lanes(layer, tmp_path, monkeypatch, slow_create_s, fans_out):
    """On a disk, creations are timed on the extractor's thread in windows of PROBE_FILES;
    when a window is over the threshold (0 here: the first) the rest go to writer threads,
    under it (1 s: never) they stay.  Either way the whole layer is written."""
    blob, limits, files = layer
    monkeypatch.setattr(staging, "SLOW_CREATE_S", slow_create_s)
    monkeypatch.setattr(staging, "PROBE_FILES", 4)
    monkeypatch.setattr(staging, "in_memory", lambda fd: False)  # time creations on tmpfs too
    chosen = []
    real_choose = staging.Staging._choose

    def choose(self):
        real_choose(self)
        chosen.append(self.lanes)
    monkeypatch.setattr(staging.Staging, "_choose", choose)
    threads = _staging_threads()
    stats = _extract(blob, limits, tmp_path / "out", None)
    if fans_out:  # at the end of the first window
        assert chosen == [min(staging.DISK_LANES, staging.usable_cpus())]
    else:  # at the end of every window
        assert chosen == [0] * (len(files) // 4)
    assert {n: data for n, (data, _) in _tree(tmp_path / "out").items()} == files
    assert list(stats.inventory) == list(files)
    assert _staging_threads() == threads

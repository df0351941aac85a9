"""Issue 10's twelve classes of hostile artifacts and hostile DIRs, one test (or more) each.

Every artifact is consistent (digests, sizes, config, manifest, index agree) so only the
attack itself is wrong.  Each refusal asserts: the exit code, one line on stderr with the
reason, no traceback, DIR (holding a good install) exactly as it was, a fresh DIR not left
behind, and a canary directory beside DIR untouched (nothing written or removed outside)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import zstandard

import badlayers
from badlayers import Entry, pad, raw_dir, raw_file, raw_tar, ustar_header
from installkit import (INSTALL_PYTHON, Checkpoints, cli, current_fingerprint_dict, env_with, resolved_view,
                        spawn_install, tree_state)

from cachebake.errors import ExitCode

KEY = "A" * 52
GOOD = [Entry("triton", tarfile.DIRTYPE), Entry(f"triton/{KEY}", tarfile.DIRTYPE),
        Entry(f"triton/{KEY}/k.cubin", data=b"\x7fELF" + b"x" * 100),
        Entry(f"triton/{KEY}/k.json", data=b'{"name": "k"}')]


@pytest.fixture(scope="module")
def fp(tmp_path_factory) -> dict:
    return current_fingerprint_dict()


@pytest.fixture(scope="module")
def fp_file(tmp_path_factory, fp) -> Path:
    p = tmp_path_factory.mktemp("fp") / "fingerprint.json"
    p.write_text(json.dumps(fp))
    p.chmod(0o644)
    return p


@pytest.fixture
def site(tmp_path, fp, fp_file):
    """A good install in site/dir, a canary directory beside it, and a helper that runs an
    install expected to be refused and checks everything the issue asks for."""
    good = badlayers.artifact_from_entries(tmp_path / "good", GOOD, fp)
    to = tmp_path / "dir"
    cli("install", good, "--to", to, "--fingerprint", fp_file, check=True)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("a file outside DIR that must survive")
    (canary / "sub").mkdir()
    (canary / "sub" / "data").write_bytes(b"\x00" * 100)

    class Site:
        pass

    s = Site()
    s.tmp, s.to, s.canary, s.good, s.fp, s.fp_file = tmp_path, to, canary, good, fp, fp_file

    def refused(art, code, message, *extra, to=None, fresh=True, timeout=60):
        target = to or s.to
        before, canary_before = tree_state(target), tree_state(canary)
        r = cli_timeout(timeout, "install", art, "--to", target, "--fingerprint", fp_file, *extra)
        assert r.returncode == code, (r.returncode, r.stderr)
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("cachebake: error: "), r.stderr
        assert message in lines[0], r.stderr
        assert "Traceback" not in r.stderr + r.stdout
        assert tree_state(target) == before, "DIR changed"
        assert tree_state(canary) == canary_before, "something outside DIR changed"
        if fresh:
            new = tmp_path / "fresh" / "dir"
            r2 = cli_timeout(timeout, "install", art, "--to", new, "--fingerprint", fp_file, *extra)
            assert r2.returncode == code, r2.stderr
            assert not (tmp_path / "fresh").exists(), "a refused install left a fresh DIR behind"
        return r

    s.refused = refused
    return s


def cli_timeout(timeout, *args, env=None):
    return cli(*args, env=env, timeout=timeout)


def _head(*parts: bytes) -> bytes:
    return raw_dir("triton") + raw_dir(f"triton/{KEY}") + b"".join(parts)


# -- 1. tar sizes, trailing data, structure, declared counts --------------------------------------
@pytest.mark.parametrize("case", ["base256_negative", "base256_positive", "not_octal", "pax_negative_size",
                                  "pax_size_override"])
def test_1_hostile_sizes_are_refused(site, case):
    """A base-256 negative size makes tarfile before CVE-2025-8194's fix walk backwards."""
    neg = b"\xff" * 4 + struct.pack(">q", -4096)  # base-256, two's complement, 12 bytes
    data = b"x" * 600
    if case == "base256_negative":
        body = _head(ustar_header(f"triton/{KEY}/a", size_field=neg) + pad(data))
        message = "base-256 size"
    elif case == "base256_positive":
        body = _head(ustar_header(f"triton/{KEY}/a", size_field=b"\x80" + b"\x00" * 9 + struct.pack(">H", 600))
                     + pad(data))
        message = "base-256 size"
    elif case == "not_octal":
        body = _head(ustar_header(f"triton/{KEY}/a", size_field=b"-0000001130\x00") + pad(data))
        message = "not plain octal"
    elif case == "pax_negative_size":
        body = _head(badlayers.pax_header({"size": "-4096"}), raw_file(f"triton/{KEY}/a", data))
        message = "pax 'size' record"
    else:
        body = _head(badlayers.pax_header({"size": "1000000"}), raw_file(f"triton/{KEY}/a", data))
        message = "pax 'size' record"
    art = badlayers.artifact_from_tar(site.tmp / "art", raw_tar(body), site.fp, entries=3, files=1,
                                      file_bytes=len(data))
    site.refused(art, ExitCode.UNSAFE, message)


@pytest.mark.parametrize("trailer", ["garbage", "entry_after_eoa", "zeros_past_record"])
def test_1_anything_after_the_end_of_archive_but_padding_is_refused(site, trailer):
    body = _head(raw_file(f"triton/{KEY}/a", b"ok"))
    eoa = badlayers.end_of_archive(len(body))
    extra = {"garbage": b"\x01" * 512,
             "entry_after_eoa": ustar_header(f"triton/{KEY}/evil", size=1, mode=0o4755) + pad(b"x"),
             "zeros_past_record": b"\x00" * (64 << 10)}[trailer]
    tar = body + eoa + extra
    art = badlayers.artifact_from_tar(site.tmp / "art", tar, site.fp, entries=3, files=1, file_bytes=2)
    site.refused(art, ExitCode.UNSAFE, "after the tar's end-of-archive marker")


def test_1_more_entries_and_bytes_than_declared(site):
    body = _head(raw_file(f"triton/{KEY}/a", b"1"), raw_file(f"triton/{KEY}/b", b"2"))
    art = badlayers.artifact_from_tar(site.tmp / "a1", raw_tar(body), site.fp, entries=3, files=1, file_bytes=2)
    site.refused(art, ExitCode.UNSAFE, "more entries than the 3")
    art = badlayers.artifact_from_tar(site.tmp / "a2", raw_tar(body), site.fp, entries=4, files=2, file_bytes=1)
    site.refused(art, ExitCode.UNSAFE, "more files or more file data than")


OTHER_DIFF_ID = "sha256:" + hashlib.sha256(b"another tar").hexdigest()


@pytest.mark.parametrize("form", ["layout", "bare", "check-only"])
def test_1_a_layer_whose_tar_is_not_its_diff_id_is_refused(site, form):
    """The blob is the one its digest names, but the manifest (and the image config's
    rootfs.diff_ids) declare another uncompressed tar: every layer form install reads checks
    the sha256 of the tar stream against the diff_id, exit 6, before anything is switched in."""
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD, site.fp, layer_overrides={"diff_id": OTHER_DIFF_ID})
    extra = ["--check-only"] if form == "check-only" else []
    if form == "bare":
        layer = site.tmp / "bare" / "bake.tar.zst"
        layer.parent.mkdir()
        shutil.copy(badlayers.layer_blob(art), layer)
        shutil.copy(art / "cachebake.json", layer.parent / "cachebake.json")
        art = layer
    # (DIR holds the good install of this very blob: "already installed" reads no layer)
    site.refused(art, ExitCode.UNSAFE, f"not the diff_id {OTHER_DIFF_ID[:19]}", *extra, to=site.tmp / "new")


def test_1_an_image_config_whose_diff_ids_disagree_with_the_manifest_is_refused(site):
    tar = badlayers.make_tar(GOOD)
    layer = badlayers.layer_stats(GOOD, tar)
    blob = zstandard.ZstdCompressor(level=3).compress(tar)
    for n, diff_ids in enumerate(([OTHER_DIFF_ID], [layer["diff_id"], OTHER_DIFF_ID], [])):
        art = badlayers.write_artifact(site.tmp / f"art{n}", blob, badlayers.manifest_for(layer, site.fp),
                                       config_diff_ids=diff_ids)
        site.refused(art, ExitCode.UNSAFE, "rootfs.diff_ids is not the one layer", to=site.tmp / "new")
    r = cli("inspect", art)
    assert r.returncode == ExitCode.UNSAFE and "rootfs.diff_ids" in r.stderr


# -- 2. a hostile DIR: links under .cachebake, another uid's state, DIR a link --------------------
@pytest.mark.parametrize("planted", ["staging", "versions", "lock", "state"])
def test_2_links_under_dot_cachebake_are_refused_and_never_followed(site, planted):
    victim = site.canary  # what the links point at: must survive
    state = site.to / ".cachebake"
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD + [Entry(f"triton/{KEY}/new", data=b"n")], site.fp)
    if planted == "staging":
        shutil.rmtree(state / "staging", ignore_errors=True)
        os.symlink(victim, state / "staging")
    elif planted == "versions":
        # a second directory of versions is not ours to follow: the link replaces the real one
        (state / "versions").rename(state / "versions.real")
        os.symlink(victim, state / "versions")
    elif planted == "lock":
        (state / "lock").unlink()
        os.symlink(victim / "created-by-install", state / "lock")  # dangling
    else:
        shutil.rmtree(site.to)
        site.to.mkdir()
        os.symlink(victim, state)
    r = site.refused(art, ExitCode.BAD_INPUT, "symbolic link", fresh=False)
    assert not (victim / "created-by-install").exists()
    assert ".cachebake" in r.stderr


def test_2_a_leftover_staging_entry_that_is_a_link_is_unlinked_not_followed(site):
    """Leftover cleanup removes a link in staging/ (ours to clean) without entering it."""
    (site.to / ".cachebake" / "staging").mkdir(exist_ok=True)
    os.symlink(site.canary, site.to / ".cachebake" / "staging" / "0123456789abcdef")
    shutil.rmtree(site.to / ".cachebake" / "versions")  # force a real install, not "already installed"
    before = tree_state(site.canary)
    r = cli("install", site.good, "--to", site.to, "--fingerprint", site.fp_file, "--json")
    assert r.returncode == 0, r.stderr
    assert ".cachebake/staging/0123456789abcdef" in json.loads(r.stdout)["cleaned"]
    assert tree_state(site.canary) == before


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_2_state_owned_by_another_uid_is_refused(site):
    for p in [site.to / ".cachebake", *(site.to / ".cachebake").rglob("*")]:
        os.lchown(p, 65534, 65534)
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD + [Entry(f"triton/{KEY}/new", data=b"n")], site.fp)
    site.refused(art, ExitCode.BAD_INPUT, "owned by uid 65534", fresh=False)


def test_2_dir_itself_a_symlink_is_refused(site):
    link = site.tmp / "dirlink"
    os.symlink(site.canary, link)
    site.refused(site.good, ExitCode.BAD_INPUT, "is a symbolic link", to=link, fresh=False)


# -- 3. memory: bytes after the end-of-archive behind a skippable frame ----------------------------
def _zero_padded_artifact(site, zeros: int) -> Path:
    """A small tar followed by ``zeros`` zero bytes (compressing to ~16 KB per 512 MiB), the
    blob padded with a skippable zstd frame so the declared size passes the ratio check.
    Built in a function so its big buffers are freed before the installer is forked."""
    body = _head(raw_file(f"triton/{KEY}/a", b"ok"))
    tar = body + badlayers.end_of_archive(len(body))
    cctx = zstandard.ZstdCompressor(level=1)
    zero_frame = cctx.compressobj()
    chunk = b"\x00" * (16 << 20)
    stream = b"".join(zero_frame.compress(chunk) for _ in range(zeros // len(chunk))) + zero_frame.flush()
    skippable = struct.pack("<II", 0x184D2A50, 600_000) + b"\x00" * 600_000
    return badlayers.artifact_from_tar(site.tmp / "art", tar + b"\x00" * zeros, site.fp, entries=3, files=1,
                                       file_bytes=2, compressed=cctx.compress(tar) + stream + skippable)


def test_3_padding_and_skippable_frames_cannot_inflate_memory(site):
    """The issue's attack (4.3 MB blob, 4.2 GB peak RSS before): memory stays bounded by the
    extractor's chunk queue, not by the declared size."""
    art = _zero_padded_artifact(site, 512 << 20)
    site.refused(art, ExitCode.UNSAFE, "after the tar's end-of-archive marker", fresh=False)
    # Peak RSS from a small parent: a child's ru_maxrss starts at its parent's high-water mark
    # at fork (and this test process built 512 MiB), so measure from a fresh interpreter.
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    r = subprocess.run([sys.executable, "-c", probe, INSTALL_PYTHON, "-m", "cachebake.cli", "install", str(art),
                        "--to", str(site.tmp / "rss"), "--fingerprint", str(site.fp_file)],
                       capture_output=True, text=True, env=env_with(), cwd="/")
    peak_mib = int(r.stdout) / 1024
    assert peak_mib < 250, f"peak RSS of the installer {peak_mib:.0f} MiB"


# -- 4. FIFOs and endless documents ----------------------------------------------------------------
@pytest.mark.parametrize("which", ["config", "image_manifest", "layer", "index"])
def test_4_a_fifo_is_refused_without_hanging(site, which):
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD + [Entry(f"triton/{KEY}/new", data=b"n")], site.fp)
    idx = json.loads((art / "index.json").read_text())
    img_path = art / "blobs" / "sha256" / idx["manifests"][0]["digest"].split(":")[1]
    img = json.loads(img_path.read_text())
    path = {"config": art / "blobs" / "sha256" / img["config"]["digest"].split(":")[1],
            "image_manifest": img_path, "layer": badlayers.layer_blob(art), "index": art / "index.json"}[which]
    path.unlink()
    os.mkfifo(path)
    site.refused(art, ExitCode.CORRUPT, "is not a regular file (a FIFO)", fresh=False, timeout=30)


def test_4_endless_or_huge_documents_are_capped(site):
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD, site.fp)
    (art / "index.json").unlink()
    with open(art / "index.json", "wb") as f:
        f.truncate(8 << 30)  # an 8 GiB sparse "index": refused from its size, never read
    site.refused(art, ExitCode.CORRUPT, "index.json: (top level): is 8589934592 bytes", fresh=False)
    (art / "index.json").unlink()
    os.symlink("/dev/zero", art / "index.json")
    site.refused(art, ExitCode.CORRUPT, "index.json: (top level): is a symbolic link", fresh=False)


# -- 5. a user's file appearing at DIR/<role> during the install ----------------------------------
@pytest.mark.parametrize("kind", ["file", "directory"])
@pytest.mark.parametrize("first", [True, False], ids=["fresh", "replace"])
def test_5_a_role_path_appearing_mid_install_is_never_replaced(site, kind, first, monkeypatch):
    from cachebake.errors import BadInput
    from cachebake.install import atomic, install_artifact

    to = site.tmp / "fresh-dir" if first else site.to
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD + [Entry(f"triton/{KEY}/new", data=b"n")], site.fp)
    before = resolved_view(to / "triton")
    real_sync = atomic.sync_tree

    def racing_sync(fd):  # runs after every check, right before the role links are made
        real_sync(fd)
        if os.path.islink(to / "triton"):
            os.unlink(to / "triton")
        if kind == "file":
            (to / "triton").write_text("the user's file")
        else:
            (to / "triton").mkdir()
            (to / "triton" / "mine").write_text("the user's file")

    monkeypatch.setattr(atomic, "sync_tree", racing_sync)
    with pytest.raises(BadInput, match="not managed by cachebake"):
        install_artifact(art, to, fingerprint_file=str(site.fp_file))
    user = to / "triton" if kind == "file" else to / "triton" / "mine"
    assert user.read_text() == "the user's file"
    assert not list(to.glob(".*cachebake-tmp*"))
    staging = to / ".cachebake" / "staging"
    assert not staging.exists() or not any(staging.iterdir())
    if not first:
        assert before is not None  # the old install's version is still there, current unchanged
        assert (to / ".cachebake" / "current").is_symlink()
    # once the user's file is gone, the next install succeeds (no leftover makes it exit 3)
    monkeypatch.setattr(atomic, "sync_tree", real_sync)
    shutil.rmtree(to / "triton") if kind == "directory" else (to / "triton").unlink()
    report = install_artifact(art, to, fingerprint_file=str(site.fp_file))
    assert report.status in ("installed", "replaced") and (to / "triton" / KEY / "new").read_bytes() == b"n"


# -- 6. parser differential: headers tarfile would skip --------------------------------------------
def test_6_a_bad_checksum_header_is_refused_not_skipped(site, tmp_path):
    """tarfile stops at a bad header (installing the first part, exit 0 before), GNU tar skips
    it and extracts a setuid file and a symlink from the same bytes."""
    body = _head(raw_file(f"triton/{KEY}/a", b"ok"),
                 ustar_header(f"triton/{KEY}/bad", size=0, checksum_delta=1),
                 raw_file(f"triton/{KEY}/suid", b"#!/bin/sh\n", mode=0o4755),
                 ustar_header(f"triton/{KEY}/link", type=b"2", linkname=b"/etc/shadow"))
    tar = raw_tar(body)
    gnu = tmp_path / "gnu"
    gnu.mkdir()
    subprocess.run(["tar", "-x", "-C", str(gnu)], input=tar, capture_output=True)
    assert (gnu / "triton" / KEY / "suid").exists()  # the differential is real
    art = badlayers.artifact_from_tar(site.tmp / "art", tar, site.fp, entries=4, files=1, file_bytes=2)
    site.refused(art, ExitCode.UNSAFE, "checksum does not match")


@pytest.mark.parametrize("case", ["gnu_magic", "gnu_longname", "global_pax", "pax_linkpath", "sparse_pax",
                                  "old_regular_type", "pax_then_eoa"])
def test_6_headers_other_readers_interpret_differently_are_refused(site, case):
    name = f"triton/{KEY}/a"
    parts = {
        "gnu_magic": ustar_header(name, size=2, magic=b"ustar  \x00") + pad(b"ok"),
        "gnu_longname": ustar_header("././@LongLink", type=b"L", size=12) + pad(b"../../../x\x00\x00")
        + raw_file(name, b"ok"),
        "global_pax": ustar_header("pax_global_header", type=b"g", size=0) + raw_file(name, b"ok"),
        "pax_linkpath": badlayers.pax_header({"linkpath": "/etc/passwd"}) + raw_file(name, b"ok"),
        "sparse_pax": badlayers.pax_header({"GNU.sparse.major": "1"}) + raw_file(name, b"ok"),
        "old_regular_type": ustar_header(name, type=b"\x00", size=2) + pad(b"ok"),
        "pax_then_eoa": badlayers.pax_header({"path": name}),
    }[case]
    art = badlayers.artifact_from_tar(site.tmp / "art", raw_tar(_head(parts)), site.fp, entries=3, files=1,
                                      file_bytes=2)
    site.refused(art, ExitCode.UNSAFE, "layer entry")


# -- 7. what pack writes, a non-root installer can read --------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_7_pack_output_is_world_readable_and_installs_as_nobody(public_tmp):
    from cachebake.artifact.pack import CacheRoot, pack_artifact

    cache = public_tmp / "cache" / "triton" / KEY
    cache.mkdir(parents=True)
    (cache / "k.cubin").write_bytes(b"\x7fELF" + b"x" * 100)
    (cache / "k.json").write_text('{"name": "k"}')
    old = os.umask(0o022)
    try:
        pack_artifact([CacheRoot("triton", cache.parent)], public_tmp / "art", target="sm_90")
    finally:
        os.umask(old)
    for p in [public_tmp / "art", *(public_tmp / "art").rglob("*")]:
        mode = p.stat().st_mode & 0o777
        assert mode == (0o755 if p.is_dir() else 0o644), (p, oct(mode))
    fp = public_tmp / "fp.json"
    fp.write_text(json.dumps(current_fingerprint_dict()))
    fp.chmod(0o644)
    vol = public_tmp / "vol"
    vol.mkdir()
    os.chown(vol, 65534, 65534)
    r = cli("install", public_tmp / "art", "--to", vol, "--fingerprint", fp, user=65534)
    assert r.returncode == 0, r.stderr
    assert (vol / "triton" / KEY / "k.cubin").is_file()


# -- 8. structure refused before any write ---------------------------------------------------------
@pytest.mark.parametrize("case", ["dir_then_file", "long_component", "long_path", "too_deep",
                                  "case_collision", "unicode_collision"])
def test_8_structure_is_refused_before_any_write(site, case):
    k = f"triton/{KEY}"
    entries = {
        "dir_then_file": [Entry(f"{k}/x/y", data=b"1"), Entry(f"{k}/x", data=b"2")],
        "long_component": [Entry(f"{k}/" + "c" * 300, data=b"1")],
        "long_path": [Entry(f"{k}/" + "/".join(["d" * 200] * 21) + "/f", data=b"1")],
        "too_deep": [Entry(f"{k}/" + "/".join("d" * 40) + "/f", data=b"1")],
        "case_collision": [Entry(f"{k}/Kernel.cubin", data=b"1"), Entry(f"{k}/kernel.cubin", data=b"2")],
        "unicode_collision": [Entry(f"{k}/caf\u00e9", data=b"1"), Entry(f"{k}/cafe\u0301", data=b"2")],
    }[case]
    message = {"dir_then_file": "where earlier entries put a directory", "long_component": "NAME_MAX",
               "long_path": "PATH_MAX", "too_deep": "levels deep", "case_collision": "collides with",
               "unicode_collision": "collides with"}[case]
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD + entries, site.fp)
    site.refused(art, ExitCode.UNSAFE, message)


# -- 9. malformed JSON shapes: one line naming document and field, never a traceback ---------------
def _edit_label(art: Path, edit) -> None:
    """Rewrite the bake manifest in the config label (and every digest above it)."""
    man = json.loads((art / "cachebake.json").read_text())["bakes"]["cuda:90"]
    man.pop("image_manifest_digest")
    edit(man)
    compressed = badlayers.layer_blob(art).read_bytes()
    for p in (art / "blobs" / "sha256").iterdir():
        p.unlink()
    badlayers.write_artifact(art, compressed, man)


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    doc = edit(doc) or doc
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("case", ["index_list", "manifests_object", "index_annotations_list", "roles_string",
                                  "role_traversal", "role_state_dir", "layer_size_string", "deep_label",
                                  "duplicate_key", "nan", "deep_group_file"])
def test_9_malformed_documents_name_the_document_and_field(site, case):
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD, site.fp)
    expect = {
        "index_list": "index.json: (top level): must be an object",
        "manifests_object": "index.json: manifests: must be an array",
        "index_annotations_list": "index.json: manifests[0].annotations: must be an object",
        "roles_string": "label dev.cachebake.manifest: roles: must be an array",
        "role_traversal": "roles[0]: '../x' is not a cache role",
        "role_state_dir": "roles[0]: '.cachebake' is not a cache role",
        "layer_size_string": "layer.tar_size: must be an integer, not a string",
        "deep_label": "nests deeper than 32 levels",
        "duplicate_key": "index.json: schemaVersion: appears twice",
        "nan": "holds NaN",
        "deep_group_file": "nests deeper than 32 levels",
    }[case]
    index = art / "index.json"
    if case == "index_list":
        index.write_text("[]")
    elif case == "manifests_object":
        _edit_json(index, lambda d: d.update(manifests={}))
    elif case == "index_annotations_list":
        _edit_json(index, lambda d: d["manifests"][0].update(annotations=["x"]))
    elif case == "roles_string":
        _edit_label(art, lambda m: m.update(roles="triton"))
    elif case == "role_traversal":
        _edit_label(art, lambda m: m.update(roles=["../x"]))
    elif case == "role_state_dir":
        _edit_label(art, lambda m: m.update(roles=[".cachebake"]))
    elif case == "layer_size_string":
        _edit_label(art, lambda m: m["layer"].update(tar_size="10240"))
    elif case == "deep_label":
        deep: dict = {}
        for _ in range(200):
            deep = {"x": deep}
        _edit_label(art, lambda m: m.update(bake=deep))
    elif case == "duplicate_key":
        index.write_text(index.read_text().replace('"schemaVersion": 2', '"schemaVersion": 2, "schemaVersion": 3'))
    elif case == "nan":
        _edit_label(art, lambda m: m["inventory"].update(kernels=[{"name": "k", "key_dir": "k", "target": "t",
                                                                   "num_warps": float("nan")}]))
    else:
        group = "[" * 100000 + "]" * 100000
        art = badlayers.artifact_from_entries(site.tmp / "art2", GOOD + [
            Entry(f"triton/{KEY}/__grp__k.json", data=('{"child_paths": ' + group + "}").encode())], site.fp)
    site.refused(art, ExitCode.CORRUPT, expect)


def test_9_bare_layer_with_a_malformed_summary(site):
    layer = site.tmp / "bake.tar.zst"
    shutil.copy(badlayers.layer_blob(site.good), layer)
    (site.tmp / "cachebake.json").write_text(json.dumps([{"format_version": 1}]))
    site.refused(layer, ExitCode.CORRUPT, "cachebake.json: (top level): must be an object")
    (site.tmp / "cachebake.json").write_text(json.dumps({"format_version": 1, "bakes": []}))
    site.refused(layer, ExitCode.CORRUPT, "cachebake.json: bakes: must be an object")


# -- 10. lies that used to install -----------------------------------------------------------------
def test_10_a_role_that_is_a_regular_file_is_refused(site):
    art = badlayers.artifact_from_entries(site.tmp / "art", [Entry("triton", data=b"not a cache")], site.fp)
    site.refused(art, ExitCode.UNSAFE, "is a cache role but a regular file")
    assert (site.to / "triton" / KEY / "k.cubin").is_file()


def test_10_a_declared_role_with_no_entries_is_refused(site):
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD, site.fp, roles=("triton", "vllm"))
    site.refused(art, ExitCode.CORRUPT, "declares role 'vllm' but the layer holds nothing")
    art = badlayers.artifact_from_entries(site.tmp / "art2", GOOD + [Entry("vllm", tarfile.DIRTYPE)], site.fp,
                                          roles=("triton", "vllm"))
    site.refused(art, ExitCode.CORRUPT, "declares role 'vllm' but the layer holds an empty directory")


@pytest.mark.parametrize("value,code,message", [(True, ExitCode.CORRUPT, "format_version: must be an integer, not a boolean"),
                                                ("1", ExitCode.CORRUPT, "format_version: must be an integer, not a string"),
                                                (2, ExitCode.UNSUPPORTED, "format version 2 is not supported")])
def test_10_format_version_is_an_integer(site, value, code, message):
    art = badlayers.artifact_from_entries(site.tmp / "art", GOOD, site.fp, manifest_overrides={"format_version": value})
    site.refused(art, code, message)


def _tmpfs_run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env_with())


def _can_mount_tmpfs() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return _tmpfs_run("mount -t tmpfs -o size=1m tmpfs /mnt").returncode == 0


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs root and unshare -m to mount a small tmpfs")
def test_10_many_empty_files_are_checked_against_free_inodes(site):
    """Thousands of empty files compress to almost nothing; a real small-inode tmpfs refuses."""
    entries = GOOD + [Entry(f"triton/{KEY}/e{i:05d}") for i in range(3000)]
    art = badlayers.artifact_from_entries(site.tmp / "art", entries, site.fp)
    mnt = site.tmp / "mnt"
    mnt.mkdir()
    r = _tmpfs_run(f"mount -t tmpfs -o nr_inodes=1000,size=64m tmpfs {mnt} && "
                   f"{INSTALL_PYTHON} -m cachebake.cli install {art} --to {mnt}/dir --fingerprint {site.fp_file}; "
                   f"echo rc=$?; ls -A {mnt}")
    assert "rc=3" in r.stdout, r.stdout + r.stderr
    assert "free inodes, the bake needs 3004 files and directories" in r.stderr
    assert r.stdout.strip().endswith("rc=3"), "something was written to the volume"


# -- 11. damage is repaired; --check-only reports it -----------------------------------------------
@pytest.mark.parametrize("damage", ["deleted", "truncated", "rewritten", "chmod", "renamed_over", "dir_removed",
                                    "marker_garbled"])
def test_11_a_damaged_tree_is_reported_then_repaired(site, damage):
    view = resolved_view(site.to / "triton")
    victim = site.to / "triton" / KEY / "k.cubin"
    if damage == "deleted":
        victim.unlink()
    elif damage == "truncated":
        victim.write_bytes(b"")
    elif damage == "rewritten":
        victim.write_bytes(b"\x7fELF" + b"y" * 100)  # same size
    elif damage == "chmod":
        victim.chmod(0o600)
    elif damage == "renamed_over":  # same size and mtime, another inode
        twin = victim.with_name("twin")
        shutil.copy2(victim, twin)
        twin.rename(victim)
    elif damage == "dir_removed":
        shutil.rmtree(site.to / "triton" / KEY)
    else:
        marker = site.to / ".cachebake" / "current" / "install.json"
        marker.write_text("{")
    state = tree_state(site.to)
    r = cli("install", site.good, "--to", site.to, "--fingerprint", site.fp_file, "--check-only", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["status"] in ("would repair", "would replace") and tree_state(site.to) == state
    if damage != "marker_garbled":
        assert report["status"] == "would repair" and report["damage"], report
    r = cli("install", site.good, "--to", site.to, "--fingerprint", site.fp_file, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] in ("repaired", "replaced")
    assert resolved_view(site.to / "triton") == view
    again = cli("install", site.good, "--to", site.to, "--fingerprint", site.fp_file)
    assert again.returncode == 0 and again.stdout.startswith("already installed"), again.stdout
    from cachebake.install.atomic import InstallDir
    assert InstallDir(site.to).installed().layer_digest == json.loads(r.stdout)["layer_digest"]


def test_11_check_only_writes_nothing_and_refuses_what_install_refuses(site):
    fresh = site.tmp / "new"
    r = cli("install", site.good, "--to", fresh, "--fingerprint", site.fp_file, "--check-only", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "would install"
    assert not fresh.exists()
    bad = badlayers.artifact_from_entries(site.tmp / "bad", GOOD + [Entry(f"triton/{KEY}/../../x", data=b"x")], site.fp)
    r = cli("install", bad, "--to", fresh, "--fingerprint", site.fp_file, "--check-only")
    assert r.returncode == ExitCode.UNSAFE and "climbs out" in r.stderr and not fresh.exists()


# -- 12. Ctrl-C and Pythons without tarfile.data_filter --------------------------------------------
@pytest.mark.parametrize("when", ["before_switch", "after_switch"])
def test_12_sigint_exits_130_and_says_whether_the_switch_happened(site, when, tmp_path):
    new = badlayers.artifact_from_entries(site.tmp / "art", GOOD + [Entry(f"triton/{KEY}/new", data=b"n")], site.fp)
    old_view = resolved_view(site.to / "triton")
    # count the checkpoints of an install of `new` into a copy, to find the switch's
    from cachebake.install import install_artifact

    probe = tmp_path / "probe"
    shutil.copytree(site.to, probe, symlinks=True)
    steps = Checkpoints()
    install_artifact(new, probe, fingerprint_file=str(site.fp_file), checkpoint=steps)
    total = steps.passed
    new_view = resolved_view(probe / "triton")
    at = 2 if when == "before_switch" else total  # "locked" is first, "switched" is last
    p = spawn_install(new, "--to", site.to, "--fingerprint", site.fp_file, kill_at=at, signal="INT")
    _, stderr = p.communicate()
    r = subprocess.CompletedProcess(p.args, p.returncode, "", stderr)
    assert r.returncode == 130, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    if when == "before_switch":
        assert "nothing was installed" in r.stderr
        assert resolved_view(site.to / "triton") == old_view
        assert not any((site.to / ".cachebake" / "staging").iterdir())
    else:
        assert "the new bake was switched in" in r.stderr
        assert resolved_view(site.to / "triton") == new_view


def test_12_python_without_tarfile_data_filter(site):
    """Debian 12's 3.11.2 has no tarfile.data_filter: install must not need it."""
    prog = ("import sys, tarfile\n"
            "for name in ('data_filter', 'tar_filter', 'fully_trusted_filter', 'FilterError'):\n"
            "    if hasattr(tarfile, name): delattr(tarfile, name)\n"
            "from cachebake.cli import main\nsys.exit(main())\n")
    bad = badlayers.artifact_from_entries(site.tmp / "bad", GOOD + [Entry(f"triton/{KEY}/../../x", data=b"x")], site.fp)
    new = badlayers.artifact_from_entries(site.tmp / "new", GOOD + [Entry(f"triton/{KEY}/new", data=b"n")], site.fp)
    base = [INSTALL_PYTHON, "-c", prog, "install"]
    r = subprocess.run(base + [str(bad), "--to", str(site.to), "--fingerprint", str(site.fp_file)],
                       capture_output=True, text=True, env=env_with(), cwd="/")
    assert r.returncode == ExitCode.UNSAFE and "climbs out" in r.stderr, r.stderr
    r = subprocess.run(base + [str(new), "--to", str(site.to), "--fingerprint", str(site.fp_file)],
                       capture_output=True, text=True, env=env_with(), cwd="/")
    assert r.returncode == 0, r.stderr
    assert (site.to / "triton" / KEY / "new").read_bytes() == b"n"

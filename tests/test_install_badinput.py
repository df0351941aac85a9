"""The bad-input corpus: each crafted artifact is refused with its own message and exit code,
and DIR (holding a good install) is left exactly as it was."""

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

import badlayers
from badlayers import Entry
from installkit import baked, cli, current_fingerprint_dict, tree_state  # noqa: F401

from cachebake.errors import ExitCode

KEY = "A" * 52
GOOD = [Entry("triton", tarfile.DIRTYPE), Entry(f"triton/{KEY}", tarfile.DIRTYPE),
        Entry(f"triton/{KEY}/k.cubin", data=b"\x7fELF" + b"x" * 100),
        Entry(f"triton/{KEY}/k.json", data=b'{"name": "k"}')]


def _rewrite_layer(art: Path, compressed: bytes) -> None:
    """Swap the layer blob for ``compressed`` with every digest and size made consistent, so
    only the stream itself is bad."""
    man = json.loads((art / "cachebake.json").read_text())["bakes"]["cuda:90"]
    man.pop("image_manifest_digest")
    for p in (art / "blobs" / "sha256").iterdir():
        p.unlink()
    badlayers.write_artifact(art, compressed, man)


def flipped_byte(art):
    blob = badlayers.layer_blob(art)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))


def truncated(art):
    _rewrite_layer(art, badlayers.layer_blob(art).read_bytes()[:-40])


def not_zstd(art):
    _rewrite_layer(art, bytes(range(256)) * 2)


def truncated_blob(art):
    blob = badlayers.layer_blob(art)
    blob.write_bytes(blob.read_bytes()[:-40])


def wrong_digest(art):
    """The image manifest names another layer digest than the bake manifest it carries."""
    blob = badlayers.layer_blob(art)
    blob.rename(blob.with_name("0" * 64))
    idx = json.loads((art / "index.json").read_text())
    img_path = art / "blobs" / "sha256" / idx["manifests"][0]["digest"].split(":")[1]
    img = json.loads(img_path.read_text())
    img["layers"][0]["digest"] = "sha256:" + "0" * 64
    data = json.dumps(img, sort_keys=True).encode()
    d = hashlib.sha256(data).hexdigest()
    (art / "blobs" / "sha256" / d).write_bytes(data)
    idx["manifests"][0].update(digest="sha256:" + d, size=len(data))
    (art / "index.json").write_text(json.dumps(idx))


def zero_bomb():
    # 64 MiB of zeros: ~2 KB compressed, honest manifest; refused from the declared ratio
    return [Entry("triton", tarfile.DIRTYPE), Entry("triton/bomb", data=bytes(64 << 20))]


# name -> (entries, artifact kwargs, post-write tamper, extra CLI args, exit code, message part)
CORPUS = {
    "traversal": (GOOD + [Entry("triton/../../evil", data=b"x")], {}, None, [], ExitCode.UNSAFE, "climbs out"),
    "absolute": (GOOD + [Entry("/etc/evil", data=b"x")], {}, None, [], ExitCode.UNSAFE, "absolute path"),
    "symlink_escape": (GOOD + [Entry(f"triton/{KEY}/l", tarfile.SYMTYPE, linkname="/etc/passwd")], {}, None, [],
                       ExitCode.UNSAFE, "is a symlink"),
    "hardlink_escape": (GOOD + [Entry(f"triton/{KEY}/h", tarfile.LNKTYPE, linkname="../../../etc/passwd")], {},
                        None, [], ExitCode.UNSAFE, "is a hard link"),
    "device": (GOOD + [Entry(f"triton/{KEY}/dev", tarfile.CHRTYPE)], {}, None, [], ExitCode.UNSAFE, "device node"),
    "fifo": (GOOD + [Entry(f"triton/{KEY}/fifo", tarfile.FIFOTYPE)], {}, None, [], ExitCode.UNSAFE, "is a fifo"),
    "setuid": (GOOD + [Entry(f"triton/{KEY}/suid", data=b"x", mode=0o4755)], {}, None, [], ExitCode.UNSAFE, "setuid"),
    "outside_roles": (GOOD + [Entry("evil", tarfile.DIRTYPE), Entry("evil/x", data=b"x")], {}, None, [],
                      ExitCode.UNSAFE, "outside the roles"),
    "duplicate": (GOOD + [Entry(f"triton/{KEY}/k.json", data=b"{}")], {}, None, [], ExitCode.UNSAFE, "appears twice"),
    "size_over_manifest": (GOOD, {"layer_overrides": {"uncompressed_size": 50}}, None, [], ExitCode.UNSAFE,
                           "more file data than"),
    "entries_over_manifest": (GOOD, {"layer_overrides": {"entries": 2}}, None, [], ExitCode.UNSAFE, "more entries than"),
    "stream_bomb": (GOOD, {"layer_overrides": {"tar_size": 2048}}, None, [], ExitCode.UNSAFE, "decompresses past"),
    "ratio_bomb": (zero_bomb(), {}, None, [], ExitCode.UNSAFE, "decompression bomb"),
    "truncated_stream": (GOOD, {}, truncated, [], ExitCode.CORRUPT, "damaged or truncated"),
    "flipped_byte": (GOOD, {}, flipped_byte, [], ExitCode.CORRUPT, "does not match its digest"),
    "wrong_digest": (GOOD, {}, wrong_digest, [], ExitCode.CORRUPT, "disagrees with the cachebake manifest"),
    "truncated_blob": (GOOD, {}, truncated_blob, [], ExitCode.CORRUPT, "is truncated"),
    "not_zstd": (GOOD, {}, not_zstd, [], ExitCode.CORRUPT, "Unknown frame descriptor"),
    "below_a_file": (GOOD + [Entry(f"triton/{KEY}/k.json/x", data=b"x")], {}, None, [], ExitCode.UNSAFE,
                     "below a regular file"),
    "fewer_entries_than_declared": (GOOD, {"layer_overrides": {"entries": 9}}, None, [], ExitCode.CORRUPT,
                                    "the manifest declares 9"),
    "unknown_version": (GOOD, {"manifest_overrides": {"format_version": 99}}, None, [], ExitCode.UNSUPPORTED,
                        "version 99 is not supported"),
    "group_child_escape": (GOOD + [Entry(f"triton/{KEY}/__grp__k.json",
                                         data=b'{"child_paths": {"../../../etc/passwd": "/etc/passwd"}}')],
                           {}, None, [], ExitCode.UNSAFE, "not a plain file name"),
    "group_not_json": (GOOD + [Entry(f"triton/{KEY}/__grp__k.json", data=b"{nope")], {}, None, [],
                       ExitCode.CORRUPT, "not valid Triton group JSON"),
    "no_bake_for_target": (GOOD, {}, None, ["--target", "sm_120"], ExitCode.UNSUPPORTED, "no bake for"),
    "fingerprint_mismatch": (GOOD, {"manifest_overrides": {}}, None, ["--fingerprint", "{other_fp}"],
                             ExitCode.PREFLIGHT, "made for another environment"),
}


@pytest.fixture(scope="module")
def good_install(baked, tmp_path_factory):
    """A DIR already holding a good install: a refusal must not touch any of it."""
    to = tmp_path_factory.mktemp("dest") / "cache"
    cli("install", baked["artifact"], "--to", to, "--target", "sm_90", check=True)
    return to


@pytest.mark.parametrize("case", sorted(CORPUS))
def test_bad_input_is_refused_and_dir_untouched(case, good_install, tmp_path):
    entries, kwargs, tamper, extra, code, message = CORPUS[case]
    fp = current_fingerprint_dict()
    art = badlayers.artifact_from_entries(tmp_path / "art", entries, fp, **kwargs)
    if tamper:
        tamper(art)
    other_fp = tmp_path / "fp.json"
    other_fp.write_text(json.dumps(dict(fp, triton_version="9.9.9", python_tag="cp399")))
    extra = [a.replace("{other_fp}", str(other_fp)) for a in extra]
    if "--target" not in extra:
        extra = [*extra, "--target", "sm_90"]

    before = tree_state(good_install)
    r = cli("install", art, "--to", good_install, *extra)
    assert r.returncode == code, (r.returncode, r.stderr)
    assert r.stderr.startswith("cachebake: error: ") and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert tree_state(good_install) == before
    # and a fresh DIR is not even created
    fresh = tmp_path / "fresh"
    assert cli("install", art, "--to", fresh, *extra).returncode == code
    assert not fresh.exists()


def test_every_corpus_message_is_distinct():
    assert len({c[5] for c in CORPUS.values()}) == len(CORPUS) >= 12


def test_preflight_lines_and_allow_mismatch(baked, tmp_path):
    fp = current_fingerprint_dict()
    other = tmp_path / "fp.json"
    other.write_text(json.dumps(dict(fp, triton_version="9.9.9", python_tag="cp399")))
    r = cli("install", baked["artifact"], "--to", tmp_path / "c", "--fingerprint", other)
    assert r.returncode == ExitCode.PREFLIGHT
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  ")]
    assert len(lines) == 2 and all("recompiles" in ln for ln in lines), r.stderr
    assert not (tmp_path / "c").exists()
    r = cli("install", baked["artifact"], "--to", tmp_path / "c", "--fingerprint", other,
            "--allow-mismatch", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("cachebake: warning:") == 2
    assert len(json.loads(r.stdout)["mismatches"]) == 2


def test_fingerprint_file_from_the_serving_image(baked, tmp_path):
    """`cachebake fingerprint --out` in the serving image; install checks against that file."""
    fp = tmp_path / "serving-fingerprint.json"
    cli("fingerprint", "--target", "sm_90", "--out", fp, check=True)
    r = cli("install", baked["artifact"], "--to", tmp_path / "c", "--fingerprint", fp, "--json", check=True)
    report = json.loads(r.stdout)
    assert report["target"] == "cuda:90" and report["status"] == "installed"


def test_dir_in_the_way_is_bad_input(baked, tmp_path):
    to = tmp_path / "c"
    (to / "triton").mkdir(parents=True)
    (to / "triton" / "mine").write_text("not yours")
    before = tree_state(to)
    r = cli("install", baked["artifact"], "--to", to, "--target", "sm_90")
    assert r.returncode == ExitCode.BAD_INPUT and "not managed by cachebake" in r.stderr
    assert tree_state(to) == before


def test_a_cache_invalidating_variable_set_here_is_a_preflight_difference(baked, tmp_path):
    """The real environment, no file: TRITON_DEFAULT_FP_FUSION enters every Triton key."""
    from installkit import env_with

    r = cli("install", baked["artifact"], "--to", tmp_path / "c", "--target", "sm_90",
            env=env_with(TRITON_DEFAULT_FP_FUSION="0"))
    assert r.returncode == ExitCode.PREFLIGHT
    assert "TRITON_DEFAULT_FP_FUSION" in r.stderr and "--fingerprint FILE" in r.stderr
    assert not (tmp_path / "c").exists()

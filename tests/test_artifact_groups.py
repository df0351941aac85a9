"""cachebake.artifact.groups: the canonical-form shortcut gives exactly what the strict path
gives, on real Triton group files and on every near miss, and refuses nothing differently."""

import json

import pytest

from cachebake.artifact.groups import InvalidGroup, _canonical_children, _relocated_strict, relocated_group

KEY_DIR = "/srv/cache/triton/25PP2WW266AJ54HAYN5ZY5TPKJHFOOTUW4TWIB5BEBW2ORZBPC4Q"


def _outcome(fn, data):
    try:
        return fn(data, KEY_DIR, None)
    except InvalidGroup as e:
        return ("refused", e.unsafe, e.field)


def _group(children: dict) -> bytes:
    return json.dumps({"child_paths": children}).encode()


def test_real_triton_group_files_take_the_shortcut_and_match_the_strict_path(triton_cache):
    groups = sorted(triton_cache.glob("*/__grp__*.json"))
    assert groups
    for grp in groups:
        data = grp.read_bytes()
        assert _canonical_children(data) is not None, data[:200]
        new = relocated_group(data, KEY_DIR)
        assert new == _relocated_strict(data, KEY_DIR, None)
        assert all(p == f"{KEY_DIR}/{n}" for n, p in json.loads(new)["child_paths"].items())


GOOD = {"k.cubin": "/a/b/k.cubin", "k.json": "/a/b, c/k.json", "k.ptx": "/a/b/k.ptx"}

NEAR_MISSES = {
    "canonical": _group(GOOD),
    "other separators": json.dumps({"child_paths": GOOD}, separators=(",", ":")).encode(),
    "escaped slash": _group(GOOD).replace(b"/a/b/k.ptx", b"\\/a\\/b\\/k.ptx"),
    "non-ascii name": _group({**GOOD, "k\u00e9.bin": "/a/b/k\u00e9.bin"}),
    "raw utf-8 path": _group(GOOD).replace(b"/a/b/k.ptx", "/a/\u00e9/k.ptx".encode()),
    "invalid utf-8 path": _group(GOOD).replace(b"/a/b/k.ptx", b"/a/\xff/k.ptx"),
    "duplicate name": _group(GOOD)[:-2] + b', "k.cubin": "/x"}}',
    "dot name": _group({**GOOD, ".": "/a/b/."}),
    "dot-dot name": _group({**GOOD, "..": "/a/b/.."}),
    "slash in name": _group({**GOOD, "../etc": "/etc/passwd"}),
    "empty name": _group({**GOOD, "": "/a/b/"}),
    "empty children": _group({}),
    "extra key": json.dumps({"child_paths": GOOD, "x": 1}).encode(),
    "path not a string": _group({**GOOD, "k.bin": 7}),
    "long path": _group({**GOOD, "k.bin": "/" + "p" * 5000}),
    "trailing junk": _group(GOOD) + b" ",
    "nested": b'{"child_paths": {"k": {"x": "y"}}}',
    "nan": b'{"child_paths": {"k": NaN}}',
    "quote in path": _group({**GOOD, "k.bin": '/a/"b'}),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_every_near_miss_gets_what_the_strict_path_gives(case):
    data = NEAR_MISSES[case]
    assert _outcome(relocated_group, data) == _outcome(_relocated_strict, data)


@pytest.mark.parametrize("case", ["canonical", "other separators"])
def test_a_key_dir_with_characters_to_escape_takes_the_strict_path(case):
    for key_dir in ('/srv/"quoted"', "/srv/caf\u00e9", "/srv/back\\slash"):
        data = NEAR_MISSES[case]
        assert relocated_group(data, key_dir) == _relocated_strict(data, key_dir, None)


def test_the_shortcut_takes_only_the_exact_form():
    assert _canonical_children(NEAR_MISSES["canonical"]) == [b"k.cubin", b"k.json", b"k.ptx"]
    for case in ("other separators", "escaped slash", "non-ascii name", "duplicate name", "dot name",
                 "dot-dot name", "slash in name", "empty children", "extra key", "trailing junk"):
        assert _canonical_children(NEAR_MISSES[case]) is None, case

"""Moving vLLM's torch.compile cache: real files from an H200 bake, rewritten without torch.

tests/data/vllm-0.24-h200-compile-cache-excerpt.tar.zst is part of the ``vllm`` role of a real
``cachebake build --model nemotron-h --driver vllm`` on an H200 (vLLM 0.24.0, torch 2.11.0,
bake root /var/cache/cachebake): ``vllm_compile_cache.py``, one ``artifact_compile_range_*``
container and the FX-graph pickle, output code, AOTAutograd entry and autotune results it
holds (tests/data/README.md).  Which fields name the root, and which of them torch reads back,
is in cachebake/artifact/torch_paths.py; these tests check the rewrite field by field.
"""

from __future__ import annotations

import ast
import base64
import io
import shutil
import subprocess
import tarfile
import zlib
from pathlib import Path

import pytest
import zstandard

import torchpickle
from cachebake.artifact.torch_paths import (NotRelocatable, PathMap, elf_debug_only,
                                            relocate_compile_cache, relocate_file)

EXCERPT = Path(__file__).parent / "data" / "vllm-0.24-h200-compile-cache-excerpt.tar.zst"
BAKE_ROOT = "/var/cache/cachebake"
OLD = b"/var/cache/cachebake/"
NEW_ROOT = "/srv/models/a-longer-serving-root"  # another length: every string changes size
BACKBONE = "vllm/torch_compile_cache/b5f17cf9b9/rank_0_0/backbone"
CONTAINER = f"{BACKBONE}/artifact_compile_range_1_8192_subgraph_4"


def excerpt() -> dict[str, bytes]:
    raw = zstandard.ZstdDecompressor().stream_reader(EXCERPT.open("rb")).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def moved(root: str = NEW_ROOT) -> PathMap:
    return PathMap({f"{BAKE_ROOT}/{r}": f"{root}/{r}" for r in ("vllm", "triton")})


def relocate_all(files: dict[str, bytes], pm: PathMap, root: str = NEW_ROOT) -> dict[str, bytes]:
    return {name: relocate_file(name.split("/", 1)[1], data, pm,
                                f"{root}/{name.rsplit('/', 1)[0]}")[0]
            for name, data in files.items()}


def read_container(data: bytes) -> tuple[bytes, dict[str, list[tuple[str, bytes]]]]:
    """torch's CacheCompiledArtifact file, read independently of the code under test:
    CRC32 | len+header | len+torch_key | len+b64(key) | len+[CRC32 | u64 version | (b64 type,
    u64 n, n x (b64 key, len+content))...]."""

    def fields(blob):
        assert zlib.crc32(blob[4:]).to_bytes(4, "big") == blob[:4], "CRC32 does not match"
        i = 4

        def u64():
            nonlocal i
            i += 8
            return int.from_bytes(blob[i - 8:i], "big")

        def field():
            nonlocal i
            n = u64()
            i += n
            return blob[i - n:i]

        return u64, field, lambda: i == len(blob)

    u64, field, done = fields(data)
    header, _torch_key, _key, inner = field(), field(), field(), field()
    assert done() and header == b"CacheCompiledArtifact"
    u64, field, done = fields(inner)
    assert u64() == 1
    out: dict[str, list] = {}
    while not done():
        kind = base64.b64decode(field()).decode()
        out[kind] = [(base64.b64decode(field()).decode(), field()) for _ in range(u64())]
    return header, out


def test_excerpt_names_the_bake_root_where_torch_paths_says():
    """The premise, on the real H200 files: the FX-graph pickle names the root in the fields
    torch reads back (static autotuners' filename and autotune cache path) and in logged text."""
    files = excerpt()
    _, inner = read_container(files[CONTAINER])
    (_, graph), = inner["inductor"]
    found = torchpickle.fields(graph, OLD)
    assert any(p.endswith("<CachingAutotuner>.filename") for p, _ in found)
    assert any("<AutotuneCache>.local_cache" in p for p, _ in found)
    assert ("<CompiledFxGraph>.source_code", "str") in found
    handles = ast.literal_eval(files[f"{BACKBONE}/vllm_compile_cache.py"].decode())
    assert all(v["graph_handle"][1].startswith(BAKE_ROOT + "/vllm/") for v in handles.values())


def test_moved_every_read_field_names_the_new_root():
    files = excerpt()
    out = relocate_all(files, moved())
    new = (NEW_ROOT + "/").encode()
    _, inner = read_container(out[CONTAINER])  # CRCs and lengths recomputed: it reads back
    (_, graph), = inner["inductor"]
    torchpickle.load(graph, strict=True)  # frames rebuilt: the pure-Python unpickler agrees
    left = torchpickle.fields(graph, OLD)
    # What still names the old root: Triton's IR and cubin debug locations, bundled as bytes.
    assert left and all(p.endswith("<TritonKernelArtifact>.payload") and kind == "bytes"
                        for p, kind in left)
    assert set(torchpickle.payload_files(graph, OLD)) <= {"cubin", "ptx", "llir", "ttir",
                                                          "ttgir", "source"}
    now = torchpickle.fields(graph, new)
    for read_back in ("<CachingAutotuner>.filename", "<AutotuneCache>.local_cache[*]",
                      "<CompiledFxGraph>.source_code", "<CompiledFxGraph>.runnable_graph_str"):
        assert any(p.endswith(read_back) for p, _ in now), read_back
    # The FX-graph cache entry on disk holds the same graph: rewritten alike.
    (fx_name,) = [n for n in files if "/fxgraph/" in n]
    assert not [p for p, _ in torchpickle.fields(out[fx_name], OLD)
                if not p.endswith("<TritonKernelArtifact>.payload")]
    handles = ast.literal_eval(out[f"{BACKBONE}/vllm_compile_cache.py"].decode())
    assert {v["graph_handle"][1] for v in handles.values()} == {
        f"{NEW_ROOT}/{BACKBONE}/{v['graph_handle'][0]}" for v in handles.values()}
    (code,) = [n for n in files if n.endswith("csq4ved45adrwt53hvaur5tfwq5xuja6oz26bncvknsmk7oapotl.py")]
    assert OLD not in out[code] and new in out[code]


def test_there_and_back_gives_the_original_bytes():
    """Rewriting to another root and back is the identity, byte for byte: lengths, frames and
    checksums are recomputed exactly as torch and CPython wrote them."""
    files = excerpt()
    there = relocate_all(files, moved())
    back = relocate_all(there, PathMap({f"{NEW_ROOT}/{r}": f"{BAKE_ROOT}/{r}" for r in ("vllm", "triton")}),
                        BAKE_ROOT)
    changed = {n.rsplit("/", 1)[-1][:24] for n in files if there[n] != files[n]}
    assert changed == {"vllm_compile_cache.py", "artifact_compile_range_1", "fahhoih3rmvyhg4zrzqjro4t",
                       "csq4ved45adrwt53hvaur5tf"}
    assert back == files


def test_nothing_to_move_leaves_every_file_untouched():
    files = excerpt()
    same = PathMap({f"{BAKE_ROOT}/vllm": f"{BAKE_ROOT}/vllm"})
    for name, data in files.items():
        assert relocate_file(name.split("/", 1)[1], data, same,
                             f"{BAKE_ROOT}/{name.rsplit('/', 1)[0]}")[0] is data


def test_a_root_the_bake_does_not_record_is_refused():
    """Packed from a copy: the files name a root no manifest entry accounts for."""
    files = excerpt()
    elsewhere = PathMap({"/tmp/copied/vllm": f"{NEW_ROOT}/vllm"})
    with pytest.raises(NotRelocatable, match="/var/cache/cachebake/vllm, a root this bake"):
        relocate_file(CONTAINER.split("/", 1)[1], files[CONTAINER], elsewhere, NEW_ROOT)


def test_refusals():
    files = excerpt()
    compile_cache = files[f"{BACKBONE}/vllm_compile_cache.py"]
    with pytest.raises(NotRelocatable, match="not a plain file name"):
        relocate_compile_cache(compile_cache.replace(b"'artifact_compile_range_1_8192_subgraph_0'",
                                                     b"'../../etc/passwd'"), moved(), "/srv/x")
    with pytest.raises(NotRelocatable, match="not the Python literal"):
        relocate_compile_cache(b"__import__('os')", moved(), "/srv/x")
    with pytest.raises(NotRelocatable, match="quotes"):
        PathMap({f"{BAKE_ROOT}/vllm": "/srv/it's/vllm"})
    damaged = bytearray(files[CONTAINER])
    damaged[100] ^= 1  # CRC no longer matches, and it is no pickle: unknown binary
    with pytest.raises(NotRelocatable, match="binary file of unknown format"):
        relocate_file(CONTAINER.split("/", 1)[1], bytes(damaged), moved(), NEW_ROOT)
    (fx_name,) = [n for n in files if "/fxgraph/" in n]
    with pytest.raises(NotRelocatable, match="pickle"):
        relocate_file(fx_name, files[fx_name][:-1000], moved(), NEW_ROOT)  # truncated


def test_roots_match_whole_path_components_only():
    pm = PathMap({"/a/vllm": "/b/vllm"})
    assert pm.sub("/a/vllm /a/vllm/x '/a/vllm' /a/vllm2 /x/a/vllm /a/vllm.bak")[0] == \
        "/b/vllm /b/vllm/x '/b/vllm' /a/vllm2 /x/a/vllm /a/vllm.bak"


@pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc to build real shared objects")
def test_shared_objects_only_in_their_debug_info(tmp_path):
    """Inductor's C++ kernels (.so, on CPU) name their source in DWARF: accepted.  A path the
    loader would use (an RPATH in .dynstr) is refused."""
    src = tmp_path / "k.c"
    src.write_text("int kernel(int x) { return x + 1; }\n")
    old = f"{BAKE_ROOT}/vllm/torch_compile_cache/torch_aot_compile/h/inductor_cache/ab"
    debug, rpath = tmp_path / "debug.so", tmp_path / "rpath.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-g", f"-fdebug-prefix-map={tmp_path}={old}",
                    "-o", debug, src], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-rpath,{old}", "-o", rpath, src], check=True)
    pm = moved()
    data = debug.read_bytes()
    assert OLD in data and elf_debug_only(data, [OLD])
    assert relocate_file("vllm/x/k.so", data, pm, NEW_ROOT)[0] is data
    with pytest.raises(NotRelocatable, match="outside its debug sections"):
        relocate_file("vllm/x/k.so", rpath.read_bytes(), pm, NEW_ROOT)

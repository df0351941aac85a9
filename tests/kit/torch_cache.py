"""A real vLLM-style torch.compile cache on CPU, and a loader that counts what it compiles.

Run by the vllm venv's interpreter (torch + vLLM), never imported by the main suite:

    python tests/kit/torch_cache.py generate ROOT    # fills ROOT/vllm like vLLM 0.24 does
    python tests/kit/torch_cache.py load ROOT --handle {0.24,0.33}   # prints one JSON line

``generate`` compiles a small graph with Inductor (``standalone_compile`` under Dynamo, as
vLLM's InductorStandaloneAdaptor does), saves it with ``CompiledArtifact.save(format=
"binary")`` at ``torch_compile_cache/<hash>/rank_0_0/backbone/artifact_compile_range_1_64_
subgraph_0`` and writes ``vllm_compile_cache.py`` with vLLM's own ``CompilerManager``; the
Inductor cache goes where vLLM 0.24's AOT mode puts it
(``torch_compile_cache/torch_aot_compile/<hash>/inductor_cache``).  TORCH_TRACE is set so that
Inductor records its repro script (``runnable_graph_str``, which names
``TORCHINDUCTOR_CACHE_DIR``) in the pickled graph, as torch 2.11 always does: on CPU that is
the path-bearing string (Triton's kernel paths need a GPU).

``load`` reads the handle as vLLM 0.24 does (the absolute path) or as 0.33 does (cache dir +
name), loads it with ``CompiledArtifact.load``, runs it and reports Inductor's counters, the C++
kernels it built into the cache (``CppBuilder.build`` calls) and whether the output matches
eager.
"""

from __future__ import annotations

import json
import os
import sys

HASH = "b5f17cf9b9"
AOT_HASH = "a81caeba2363250f00754b85433a6af692f9977a61d73995655567320d0b0d0c"
ARTIFACT = "artifact_compile_range_1_64_subgraph_0"


def backbone(root: str) -> str:
    return os.path.join(root, "vllm", "torch_compile_cache", HASH, "rank_0_0", "backbone")


def inductor_cache(root: str) -> str:
    return os.path.join(root, "vllm", "torch_compile_cache", "torch_aot_compile", AOT_HASH,
                        "inductor_cache")


def _env(root: str) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache(root)
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # as vLLM sets it
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def model(x, y):
    import torch

    return torch.nn.functional.silu(x @ y + 1.0).sum(dim=-1)


def inputs():
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g), torch.randn(16, 4, generator=g)


def generate(root: str) -> None:
    _env(root)
    # outside the root: its path lands in the repro script too
    os.environ.setdefault("TORCH_TRACE", os.path.join(os.path.dirname(root), "torch-trace"))
    import torch
    from torch._inductor import standalone_compile

    out_dir = backbone(root)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ARTIFACT)

    def backend(gm, example_inputs):
        art = standalone_compile(gm, example_inputs, dynamic_shapes="from_tracing_context",
                                 options={})
        art.save(path=path, format="binary")
        return art

    torch.compile(model, backend=backend, dynamic=False)(*inputs())
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig
    from vllm.config.utils import Range

    cm = CompilerManager(CompilationConfig(), use_aot_compile=True)
    cm.initialize_cache(out_dir, disable_cache=False, prefix="backbone")
    cm.cache[(Range(start=1, end=64), 0, cm.compiler.name)] = {
        "graph_handle": (ARTIFACT, path), "cache_key": "generated-by-tests-torch-cache"}
    cm.is_cache_updated = True
    cm.save_to_file()


def load(root: str, handle_mode: str) -> dict:
    _env(root)
    import torch
    import torch._inductor.cpp_builder as cpp_builder
    from torch._dynamo.utils import counters
    from vllm.compilation.backends import CompilerManager
    from vllm.config import CompilationConfig

    builds = []
    original_build = cpp_builder.CppBuilder.build

    def counting_build(self, *a, **k):
        builds.append(str(self.get_target_file_path()))
        return original_build(self, *a, **k)

    cpp_builder.CppBuilder.build = counting_build
    cm = CompilerManager(CompilationConfig(), use_aot_compile=True)
    cm.initialize_cache(backbone(root), disable_cache=False, prefix="backbone")  # vLLM's parser
    (name, abs_path), = [v["graph_handle"] for v in cm.cache.values()]
    # vLLM 0.24 InductorStandaloneAdaptor.load: path = handle[1]; 0.33: join(cache_dir, handle[0])
    path = abs_path if handle_mode == "0.24" else os.path.join(backbone(root), name)
    report = {"path": path}
    try:
        art = torch._inductor.CompiledArtifact.load(path=path, format="binary")
        got = art(*inputs())
        got = got[0] if isinstance(got, (tuple, list)) else got
        report["matches_eager"] = bool(torch.allclose(got, model(*inputs())))
    except Exception as e:  # reported, the test decides
        report["error"] = f"{type(e).__name__}: {e}"
    report["counters"] = {k: v for k, v in counters["inductor"].items() if "cache" in k}
    # Builds of kernels into the cache; torch also preprocesses a header in a temp dir to
    # hash it (every process does that, hit or miss).
    report["kernel_builds"] = [b for b in builds if b.startswith(inductor_cache(root))]
    report["other_builds"] = len(builds) - len(report["kernel_builds"])
    return report


if __name__ == "__main__":
    cmd, root = sys.argv[1], sys.argv[2]
    if cmd == "generate":
        generate(root)
    elif cmd == "load":
        print("RESULT " + json.dumps(load(root, sys.argv[sys.argv.index("--handle") + 1])))
    else:
        sys.exit(f"unknown command {cmd}")

"""Run by the vllm venv's interpreter (CACHEBAKE_VLLM_PYTHON) for tests/test_vllm_identity.py;
prints one ``RESULT {json}`` line.

    compile ROOT    a tiny model under vLLM's own @support_torch_compile, VLLM_CACHE_ROOT=ROOT, with
                    cachebake's probe on ($CACHEBAKE_VLLM_PROBE): real Dynamo, vLLM's backend, Inductor
                    (C++ on CPU) and vLLM's AOT save/load; RESULT: the probe's records
    identity DIR    vLLM's engine config for the nemotron-h recipe at DIR (config.json written there),
                    and the bake identity cachebake records from it
    check FILE JSON ``compile_check.check_serving`` of the identity in FILE (a bake section) for
                    each scenario in JSON (environment changes, model, server argv), here

On a CPU machine vLLM's platform is CUDA's only with a GPU (vLLM 0.24's CUDA platform imports
libcuda), so the engine config is built on vLLM's CPU platform: the hashes differ from a GPU's,
what is compared is how they are computed.  One vLLM pass needs vLLM's CUDA ops
(FixFunctionalizationPass looks up torch.ops._C.rotary_embedding): it is a no-op here, the only
thing of vLLM's that is stood in for.
"""

from __future__ import annotations

import json
import os
import sys


def cpu_platform() -> None:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()


def compile_tiny(root: str) -> dict:
    os.environ["VLLM_CACHE_ROOT"] = root
    cpu_platform()
    import torch
    from vllm.plugins import load_general_plugins

    from cachebake.vllm import identity as vi

    load_general_plugins()  # the cachebake plugin installs the probe when its entry point is here
    via_plugin = vi._installed
    vi.install_probe()
    from vllm.compilation.passes.utility.fix_functionalization import FixFunctionalizationPass

    FixFunctionalizationPass.__call__ = lambda self, graph: None  # needs vLLM's CUDA ops
    from vllm.compilation.decorators import support_torch_compile
    from vllm.config import CompilationConfig, CompilationMode, VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context

    @support_torch_compile(dynamic_arg_dims={"x": 0})
    class Tiny(torch.nn.Module):
        def __init__(self, *, vllm_config, prefix="", **kwargs):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(16, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ self.w) + 1

    cfg = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE,
                                                          backend="inductor"))
    cfg.compilation_config.mode = CompilationMode.VLLM_COMPILE  # the CPU platform lowers it
    cfg.compilation_config.compile_sizes = []
    with set_current_vllm_config(cfg):
        model = Tiny(vllm_config=cfg)
        with set_forward_context({}, cfg):
            out = model(torch.ones(8, 16))
    events = vi.read_probe(os.environ[vi.PROBE_ENV])
    import vllm.envs as envs

    import vllm

    from cachebake.vllm.versions import aot_hash_of_reprs

    # the AOT dir rebuilt as ``verify --check-only`` does it: the recorded reprs, with Inductor's
    # factors computed again here (the mega AOT hash holds them), the system info as recorded
    rebuilt = None
    aot = next((e for e in events if e.get("event") == "aot_load"), None)
    if aot and len(aot.get("aot_factor_reprs") or []) > 3:
        reprs = aot["aot_factor_reprs"]
        here = [repr(f) for f in vi.scheme_for(vllm.__version__).inductor_factors(True)]
        rebuilt = aot_hash_of_reprs([reprs[0]["repr"], reprs[1]["repr"], reprs[2]["repr"],
                                     *here[1:], reprs[-1]["repr"]])
    return {"events": events, "outcome": vi.torch_compile_outcome(events), "vllm": vllm.__version__,
            "aot_rebuilt": rebuilt,
            "path_factors": vi.path_factors(envs.compile_factors),
            "via_plugin": via_plugin, "sum": float(out.sum())}


def identity(model_dir: str) -> dict:
    cpu_platform()
    from vllm.engine.arg_utils import EngineArgs

    from cachebake.vllm import identity as vi
    from cachebake.vllm.engine import bake_record, engine_kwargs, write_model_dir
    from cachebake.recipes import load_recipe

    start_env = dict(os.environ)
    recipe = load_recipe("nemotron-h")
    ref = write_model_dir(recipe, model_dir)
    kwargs = engine_kwargs(ref, recipe.serve_args)
    ea = EngineArgs(**kwargs)
    cfg = ea.create_engine_config()
    ident = vi.bake_identity(cfg, kwargs, [], EngineArgs(**kwargs), start_env=start_env)
    import vllm.config.utils as cu
    import vllm.envs as envs

    record = bake_record(recipe, recipe.serve_args, ref, {})
    record["compile_identity"] = ident
    with vi._only_environ(start_env):
        env_hash = cu.hash_factors(envs.compile_factors())
    from cachebake.vllm.versions import installed_scheme

    return {"bake": record, "vllm_env_hash": env_hash,
            "config_hash": installed_scheme().config_hash(cfg)}


def check(path: str, scenarios_json: str) -> list:
    """Each scenario ({"env": {...}, "unset": [...], "model": ..., "argv": [...]}) in this one
    process: vLLM's getters read os.environ at every call."""
    cpu_platform()
    from cachebake.vllm.identity import _environ
    from cachebake.vllm.compile_check import check_serving

    bake = json.load(open(path))
    out = []
    for sc in json.loads(scenarios_json):
        changes = {k: None for k in sc.get("unset", [])}
        changes.update(sc.get("env", {}))
        with _environ(changes):
            report = check_serving(bake["compile_identity"], source=path, model=sc.get("model"),
                                   server_argv=sc.get("argv"), baked_serve_args=bake["serve_args"],
                                   baked_config_sha256=bake["model"]["config_sha256"])
        out.append(report.to_dict())
    return out


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    result = {"compile": lambda: compile_tiny(rest[0]), "identity": lambda: identity(rest[0]),
              "check": lambda: check(rest[0], rest[1])}[cmd]()
    from cachebake import jsonio

    print("RESULT " + jsonio.dumps(result))

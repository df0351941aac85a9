"""What a record entry may name before anything is imported or compiled: modules, launch
options, cache-invalidating variables (cachebake.capture.keys).  Real Triton 3.6 options and
a real module on sys.path whose import would leave a file; no compiles here."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from cachebake.capture.keys import (DEFAULT_KERNEL_PACKAGES, OPTION_RULES, ModuleAllowlist,
                                    ReplayProblem, entry_problems, env_problem, module_name_problem,
                                    option_problems, resolve_kernel)
from cachebake.capture.record import TARGET_DERIVED_OPTIONS, CompileSpec, KernelRef, launch_options


def real_launch_options(**launch) -> dict:
    """The options a launch records, as the recorder derives them (Triton's own parse)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    opts = make_backend(GPUTarget("cuda", 90, 32)).parse_options(launch)
    return launch_options(dict(opts.__dict__), type(opts)().extern_libs)


def entry(module="vllm.ops", options=None, env=None, constexprs=None) -> CompileSpec:
    return CompileSpec(kernel=KernelRef(module, "kern", "kern", "a" * 64),
                       signature=[["x", "*fp32"], ["B", "constexpr"]],
                       constexprs=constexprs if constexprs is not None else [[[1], 128]],
                       attrs=[], options=options if options is not None else real_launch_options(),
                       env_vars=env or {}, target="cuda:90", hash="0" * 64)


def test_every_field_of_tritons_cuda_options_has_a_rule():
    """A Triton upgrade that adds a compile option fails here until it is judged."""
    from triton.backends.nvidia.compiler import CUDAOptions

    fields = {f.name for f in dataclasses.fields(CUDAOptions)}
    assert fields == set(OPTION_RULES) | set(TARGET_DERIVED_OPTIONS)


@pytest.mark.parametrize("launch", [{}, {"num_warps": 8, "num_stages": 2}, {"num_ctas": 2, "maxnreg": 128},
                                    {"debug": True, "launch_pdl": True}])
def test_what_real_launches_record_passes(launch):
    assert option_problems(real_launch_options(**launch)) == []


@pytest.mark.parametrize("name, value, why", [
    ("ir_override", "/etc/passwd", "names a file of IR"),
    ("extern_libs", [["libdevice", "/tmp/evil.bc"]], "names library files"),
    ("ptx_options", "--output-file /etc/x", "passed to ptxas"),
    ("num_warps", 3, "not a power of 2"),
    ("num_warps", True, "not an integer"),
    ("num_warps", 4096, "outside 1..32"),
    ("num_stages", "3", "not an integer"),
    ("maxnreg", 10_000, "outside 1..255"),
    ("debug", "yes", "not true or false"),
    ("default_dot_input_precision", "[/x]\x1b[2J", "not one of"),
    ("allowed_dot_input_precisions", ["tf32", {"a": 1}], "is not a list of"),
    ("instrumentation_mode", "plugin", "not one of"),
    ("arch", "sm100", "derived from the target"),
    ("dump_dir", "/tmp/x", "not one of Triton 3.6's compile options"),
])
def test_options_off_the_allowlist_are_refused(name, value, why):
    options = {**real_launch_options(), name: value}
    (problem,) = option_problems(options)
    assert problem.startswith(f"option {name} ") and why in problem
    assert "\x1b" not in problem and "\n" not in problem


@pytest.mark.parametrize("name, why", [
    ("os", "not on the allowlist"),
    ("__main__", "__main__"),
    ("pip.__main__", "__main__"),
    ("vllmx.ops", "not on the allowlist"),
    ("a.<locals>.b", "not a dotted Python identifier"),
    ("os; rm -rf /", "not a dotted Python identifier"),
    ("\x1b[2J[/x]", "not a dotted Python identifier"),
    ("", "not a module name"),
])
def test_module_rules(name, why):
    (problem,) = entry_problems(entry(module=name), ModuleAllowlist())
    assert why in problem and "refused, not imported" in problem
    assert "\x1b" not in problem


def test_the_allowlist_holds_the_kernel_packages_and_what_the_user_adds():
    allowed = ModuleAllowlist(["aot"])
    assert allowed.names == tuple(sorted({*DEFAULT_KERNEL_PACKAGES, "aot"}))
    for name in ("vllm", "vllm.model_executor.layers.mamba.ops.ssd_combined", "triton.language", "aot"):
        assert allowed.problem(name) is None
    assert allowed.problem("aot_kernels") is not None  # a prefix of the text is not a package
    with pytest.raises(ValueError, match="__main__"):
        ModuleAllowlist(["pkg.__main__"])
    assert module_name_problem("vllm.ops") is None


def test_a_constexpr_jit_function_from_an_unlisted_module_is_refused():
    jit = {"jit": {"module": "evil", "qualname": "f", "name": "f", "source_hash": "b" * 64}}
    problems = entry_problems(entry(constexprs=[[[1], jit]]), ModuleAllowlist())
    assert len(problems) == 1 and "a constexpr names" in problems[0] and "evil" in problems[0]


@pytest.fixture
def canary_module(tmp_path, monkeypatch):
    """A module on sys.path whose import writes a file: proof of whether it was imported."""
    mark = tmp_path / "imported"
    (tmp_path / "canary_kernels.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "canary_kernels", mark
    sys.modules.pop("canary_kernels", None)


def test_a_module_off_the_allowlist_is_never_imported(canary_module):
    name, mark = canary_module
    ref = KernelRef(name, "k", "k", "a" * 64)
    with pytest.raises(ReplayProblem, match="not on the allowlist"):
        resolve_kernel(ref, ModuleAllowlist())
    with pytest.raises(ReplayProblem, match="not loaded in this process"):
        resolve_kernel(ref)  # the recorder's rule: only what is already imported
    assert not mark.exists() and name not in sys.modules
    # the same name, listed: imported (the test above could have failed), then refused as no kernel
    with pytest.raises(ReplayProblem, match="has no k"):
        resolve_kernel(ref, ModuleAllowlist([name]))
    assert mark.exists()


def test_variables_are_compared_and_the_difference_listed():
    assert env_problem({"TRITON_DEFAULT_FP_FUSION": "true"}, {"TRITON_DEFAULT_FP_FUSION": "true"}) is None
    problem = env_problem({"LD_PRELOAD": "/tmp/x.so", "MLIR_ENABLE_TIMING": "true"},
                          {"TRITON_DEFAULT_FP_FUSION": "false", "MLIR_ENABLE_TIMING": "true"})
    assert "LD_PRELOAD (recorded '/tmp/x.so', here unset)" in problem
    assert "TRITON_DEFAULT_FP_FUSION (recorded unset, here 'false')" in problem
    assert "MLIR_ENABLE_TIMING" not in problem and "never applied" in problem
    assert "\n" not in env_problem({"X": "a\nb\x1b"}, {})

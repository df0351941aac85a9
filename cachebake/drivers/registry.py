"""The driver registry: which drivers exist, what each needs on this machine, which one a bare
``--model`` gets, and the driver object the CLI options ask for (``make_driver``).

A driver is a round producer (``cachebake.bake.rounds.Driver``): it knows how to start ONE
warmup round as a fresh process, what it needs to run, and what it records.  A round runs in
its own process so that Triton's in-memory caches start empty: a kernel a previous round
compiled must come back from the file cache (a ``cache_hit``), which is what a freshly started
server will see.

- ``CommandDriver`` (cachebake.drivers.command): any command line (``build -- CMD...``).
- ``InProcessDriver`` (here): a Python function ``module:function(**kwargs)`` that runs one
  round in-process (the ``kernels`` and ``vllm`` drivers), started through
  ``python -m cachebake.drivers.child module:function JSON_KWARGS``, the round child's error
  boundary.

Everything a driver needs is checked before round 1 (``preflight``), without importing it:
the packages are located with ``importlib.util.find_spec`` and a file or two inside them, the
GPU through nvidia-smi/NVML (cachebake.gpu.visible_gpu), never torch.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.drivers.command import CommandDriver
from cachebake.errors import BadInput, CachebakeError, Unsupported, UsageError

@dataclass(frozen=True)
class DriverSpec:
    """One in-process driver, everything the registry knows of it in one place.

    ``function``: "module:function", what runs one round in the round child;
    ``needs``: what the driver needs on this machine (requirement names, see INSTALL_HINTS);
    ``record``: the file its round writes beside the monitor's log, merged into the manifest's
    bake section (vllm: model identity and path, the exact serve args, the limits vLLM resolved,
    the request plan; kernels: the engine plan and each step's label)."""

    name: str
    function: str
    needs: tuple[str, ...]
    record: str


# --driver NAME -> its driver.  (`command`, the `-- CMD` form, is CommandDriver, not in-process.)
DRIVERS: dict[str, DriverSpec] = {
    "kernels": DriverSpec("kernels", "cachebake.vllm.kernels.driver:run_sweep",
                          ("triton", "torch", "vllm-mamba-ops", "gpu", "c-compiler"), "kernels-bake.json"),
    "vllm": DriverSpec("vllm", "cachebake.vllm.engine:run_warmup",
                       ("triton", "vllm", "gpu", "c-compiler"), "vllm-bake.json"),
}
# What the machine must have rather than the interpreter: never what picks the default driver.
MACHINE_NEEDS = ("gpu", "c-compiler")
MAX_DRIVER_RECORD = 64 << 20  # a driver's record of its round (the vllm driver's: tens of KB)

# Files that tell a full vLLM (its engine) from the ops-only slice that
# bench/vllm_ops/make_vllm_ops.py builds, located without importing vllm (seconds, and torch).
_VLLM_ENGINE_FILE = ("entrypoints", "llm.py")
_VLLM_MAMBA_OPS_FILE = ("model_executor", "layers", "mamba", "ops", "ssd_combined.py")
INSTALL_HINTS = {
    "triton": "Triton (pip install triton)",
    "torch": "torch (pip install torch)",
    "vllm": "vLLM (pip install vllm)",
    "vllm-mamba-ops": "vLLM's Mamba2 ops (pip install vllm, or bench/vllm_ops/make_vllm_ops.py)",
    "gpu": "a visible GPU (nvidia-smi and NVML found none)",
    "c-compiler": "a C toolchain for Triton's launcher helpers",
}


def _package_dir(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _has(requirement: str) -> bool:
    if requirement == "c-compiler":
        from cachebake.toolchain import c_toolchain_problem

        return c_toolchain_problem() is None
    if requirement == "gpu":
        from cachebake.gpu import visible_gpu

        return visible_gpu() is not None
    if requirement == "vllm":
        d = _package_dir("vllm")
        return d is not None and d.joinpath(*_VLLM_ENGINE_FILE).is_file()
    if requirement == "vllm-mamba-ops":
        d = _package_dir("vllm")
        return d is not None and d.joinpath(*_VLLM_MAMBA_OPS_FILE).is_file()
    return _package_dir(requirement) is not None


def missing(driver: str) -> list[str]:
    """The requirements of ``driver`` this machine lacks (``gpu`` last: packages first)."""
    spec = DRIVERS.get(driver)
    return [r for r in (spec.needs if spec else ()) if not _has(r)]


def default_driver() -> str:
    """``vllm`` where vLLM and a GPU are, else ``kernels`` where torch and vLLM's Mamba2 ops
    are (its GPU check comes in preflight), else one line naming what to install."""
    if not missing("vllm"):
        return "vllm"
    if not [r for r in missing("kernels") if r not in MACHINE_NEEDS]:
        return "kernels"
    lacking = sorted((set(missing("vllm")) | set(missing("kernels"))) - {"c-compiler"},
                     key=list(INSTALL_HINTS).index)
    raise Unsupported(
        f"no bake driver can run here (missing: {', '.join(INSTALL_HINTS[r].split(' (')[0] for r in lacking)}): "
        "install vLLM (pip install vllm; it brings torch and its Mamba2 ops) where a GPU is "
        "visible, or give the warmup command after --")


def _hint(requirement: str) -> str:
    if requirement == "c-compiler":
        from cachebake.toolchain import c_toolchain_problem

        return f"{INSTALL_HINTS[requirement]} ({c_toolchain_problem()})"
    return INSTALL_HINTS.get(requirement, requirement)


@dataclass
class InProcessDriver:
    spec: DriverSpec
    kwargs: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def function(self) -> str:  # "module:function"
        return self.spec.function

    @property
    def runs_on_gpu(self) -> bool:
        """It runs kernels on the GPU here, so it compiles for that GPU only."""
        return "gpu" in self.spec.needs

    def round_argv(self) -> list[str]:
        return [sys.executable, "-m", "cachebake.drivers.child", self.function,
                json.dumps(self.kwargs, sort_keys=True)]

    def label(self) -> str:
        return f"driver {self.name} ({self.function}, {json.dumps(self.kwargs, sort_keys=True)})"

    def describe(self) -> dict:
        return {"driver": self.name, "function": self.function, **self.kwargs}

    def preflight(self) -> None:
        """Refuse before a round starts when what the driver needs is not here.  find_spec
        imports the parent package only, not the driver: its heavy imports belong in the
        round's own process."""
        module = self.function.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise Unsupported(f"--driver {self.name}: {module} is not available in this cachebake")
        lacking = [r for r in self.spec.needs if not _has(r)]
        if lacking:
            raise Unsupported(f"--driver {self.name} cannot run here: it needs "
                              + "; ".join(_hint(r) for r in lacking))

    def recorded(self, work_dir: Path) -> dict:
        path = Path(work_dir) / self.spec.record
        if not path.is_file():
            return {}
        from cachebake.jsonio import load_document

        try:  # written by the round's process: bounded and strict like any document read
            data = load_document(path, f"the {self.name} driver's record {path}", MAX_DRIVER_RECORD,
                                 missing=None)
        except OSError as e:
            raise CachebakeError(f"the {self.name} driver's record {path} is unreadable: {e}") from None
        return data if isinstance(data, dict) else {}


def default_out(model: str | None) -> str:
    """``--out`` when none is given: a directory named after the model, in the working dir."""
    if not model:
        return "cachebake-artifact"
    slug = os.path.basename(os.path.normpath(model)) if os.sep in model else model
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in slug.replace(":", "-"))
    return f"cachebake-{slug.strip('-.') or 'artifact'}"


def make_driver(driver: str | None, cmd: list[str] | tuple[str, ...] | None, *,
                model: str | None = None, tp: int | None = None,
                serve_args: dict | str | None = None, model_dir: str | None = None,
                plan: str | None = None):
    """The driver the CLI options ask for: ``-- CMD`` wins; else ``--driver`` (default:
    ``default_driver()``) with ``--model``, which must name a recipe or a model config.
    ``plan``: an engine plan file (`cachebake plan --json`), kernels driver only."""
    # What the command line asks for does not make a warmup: usage errors (exit 2), as a
    # missing argument is; a model that is not there is bad input (exit 3, load_recipe).
    if cmd:
        if driver not in (None, "command"):
            raise UsageError(f"give either --driver {driver} or -- CMD, not both")
        return CommandDriver(list(cmd), model=model)
    if driver == "command":
        raise UsageError("--driver command runs the command after --: give -- CMD...")
    if driver is not None and driver not in DRIVERS:
        raise UsageError(f"unknown driver {driver!r} (known: command, {', '.join(DRIVERS)})")
    if not model:
        raise UsageError("nothing to run: give --model MODEL (a recipe, see `cachebake recipes`, "
                         "or a model directory) or the warmup command after --")
    from cachebake.recipes import load_recipe

    load_recipe(model)  # a mistyped model is refused here, not in round 1
    if serve_args is not None:
        from cachebake.vllm.serveargs import parse_serve_args, validate_serve_args

        parsed = parse_serve_args(serve_args) if isinstance(serve_args, str) else dict(serve_args)
        serve_args = validate_serve_args(parsed)
    driver = driver or default_driver()
    kwargs: dict = {"model": model}
    if tp is not None:
        kwargs["tp"] = tp
    if serve_args is not None:
        kwargs["serve_args"] = serve_args
    if model_dir is not None:
        if driver != "vllm":
            raise UsageError("--model-dir is for --driver vllm")
        from cachebake.vllm.serveargs import model_reference

        kwargs["model_dir"] = model_reference(model_dir)[1]  # a path made absolute, or a hub id
    if plan is not None:  # an engine plan file (`cachebake plan --json`): kernels driver only
        if driver != "kernels":
            raise UsageError("an engine plan file is for --driver kernels")
        if not os.path.isfile(plan):
            raise BadInput(f"{plan}: no such engine plan file")
        kwargs["plan"] = os.path.abspath(plan)
    return InProcessDriver(DRIVERS[driver], kwargs)


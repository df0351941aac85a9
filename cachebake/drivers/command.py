"""Drivers as round producers: each knows how to start ONE warmup round as a fresh process.

A round runs in its own process so that Triton's in-memory caches start empty: a kernel a
previous round compiled must come back from the file cache (a ``cache_hit``), which is what a
freshly started server will see.  ``build`` runs rounds until one does no work; ``verify`` runs
one round against an installed cache.

- ``CommandDriver``: any command line (``cachebake build -- CMD...``).
- ``InProcessDriver``: a Python function ``module:function(**kwargs)`` that runs one round
  in-process (the ``kernels`` and ``vllm`` drivers), started through
  ``python -m cachebake.drivers.command module:function JSON_KWARGS``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shlex
import sys
from dataclasses import dataclass, field

from cachebake.errors import BadInput, Unsupported

# --driver NAME -> the function that runs one round in-process.  Each takes (model, tp).
DRIVER_FUNCTIONS: dict[str, str] = {
    "kernels": "cachebake.drivers.kernels:run_sweep",
    "vllm": "cachebake.drivers.vllm_engine:run_warmup",
}


@dataclass
class CommandDriver:
    argv: list[str]
    model: str | None = None  # recorded only: which model the command serves

    def round_argv(self) -> list[str]:
        return list(self.argv)

    def label(self) -> str:
        return shlex.join(self.argv)

    def describe(self) -> dict:
        d = {"driver": "command", "command": list(self.argv), "command_line": shlex.join(self.argv)}
        if self.model:
            d["model"] = self.model
        return d


@dataclass
class InProcessDriver:
    name: str
    function: str  # "module:function"
    kwargs: dict = field(default_factory=dict)

    def round_argv(self) -> list[str]:
        return [sys.executable, "-m", "cachebake.drivers.command", self.function,
                json.dumps(self.kwargs, sort_keys=True)]

    def label(self) -> str:
        return f"driver {self.name} ({self.function}, {json.dumps(self.kwargs, sort_keys=True)})"

    def describe(self) -> dict:
        return {"driver": self.name, "function": self.function, **self.kwargs}


def make_driver(driver: str | None, cmd: list[str] | tuple[str, ...] | None, *,
                model: str | None = None, tp: int | None = None, serve_args: str | None = None,
                model_dir: str | None = None, plan: str | None = None):
    """The driver the CLI options ask for: ``-- CMD`` wins; else ``--driver`` with ``--model``."""
    if cmd:
        if driver not in (None, "command"):
            raise BadInput(f"give either --driver {driver} or -- CMD, not both")
        return CommandDriver(list(cmd), model=model)
    if driver in (None, "command"):
        raise BadInput("nothing to run: give -- CMD... or --driver kernels|vllm --model MODEL")
    if driver not in DRIVER_FUNCTIONS:
        raise BadInput(f"unknown driver {driver!r} (known: command, {', '.join(DRIVER_FUNCTIONS)})")
    if not model:
        raise BadInput(f"--driver {driver} needs --model")
    function = DRIVER_FUNCTIONS[driver]
    # Refuse before a round starts (find_spec imports the parent package only, not the driver:
    # the driver's heavy imports belong in the round's own process).
    if importlib.util.find_spec(function.partition(":")[0]) is None:
        raise Unsupported(f"--driver {driver}: {function.partition(':')[0]} is not available "
                          "in this cachebake")
    kwargs: dict = {"model": model}
    if tp is not None:
        kwargs["tp"] = tp
    if serve_args is not None:
        kwargs["serve_args"] = serve_args
    if model_dir is not None:
        if driver != "vllm":
            raise BadInput("--model-dir is for --driver vllm")
        kwargs["model_dir"] = os.path.abspath(model_dir)
    if plan is not None:  # an engine plan file (`cachebake plan --json`): kernels driver only
        if driver != "kernels":
            raise BadInput("an engine plan file is for --driver kernels")
        if not os.path.isfile(plan):
            raise BadInput(f"{plan}: no such engine plan file")
        kwargs["plan"] = os.path.abspath(plan)
    return InProcessDriver(driver, function, kwargs)


def _run_function(target: str, kwargs: dict) -> None:
    module_name, _, func_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            raise Unsupported(f"driver module {module_name} is not available: {e}") from e
        raise
    getattr(module, func_name)(**kwargs)


def main(argv: list[str] | None = None) -> int:
    """Child side of an InProcessDriver round: monitor on (from the env), then the function."""
    import cachebake.capture.activate  # noqa: F401  (before any kernel module is imported)
    from cachebake.errors import CachebakeError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m cachebake.drivers.command MODULE:FUNCTION JSON_KWARGS",
              file=sys.stderr)
        return 2
    try:
        _run_function(args[0], json.loads(args[1]))
    except CachebakeError as e:
        print(f"cachebake: error: {e}", file=sys.stderr)
        return int(e.code)
    return 0


if __name__ == "__main__":
    sys.exit(main())

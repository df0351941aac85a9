"""The build's hook into replay: seed a bake from a record, bake for another target, and
collect this bake's own record.

``build`` calls ``prepare_bake`` once before its rounds and ``BakePrep.finish`` once before
packing; everything else about seeding and cross-target bakes lives here.

Seeding (``build --seed ART --jobs N``): the record's launches compile in N processes into
the bake's Triton cache before round 1, so the rounds that follow (which run as always, and
decide the fixed point as always) mostly hit.  Recorded autotune results are carried when the
record was measured on the target being baked, unless ``--retune`` asks for fresh timings; the
candidates are compiled either way, so retuning only benchmarks.

Cross-target (``build --target sm_120`` where the visible GPU is another arch): the rounds run
with ``CACHEBAKE_CROSS_TARGET`` set (see cachebake.capture.cross for what that does and where it
breaks); autotune results are dropped before packing (their timings are of skipped launches),
and the bake is marked unverified on its target.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cachebake.capture.cross import CROSS_TARGET_ENV, GPU_NAME_ENV
from cachebake.capture.env import MONITOR_LOG_ENV
from cachebake.capture.record import CompileRecord
from cachebake.capture.recorder import load_record_log, record_log_path
from cachebake.errors import BadInput


@dataclass
class BakePrep:
    triton_dir: str | None
    record_log: str
    cross_target: str | None = None  # "cuda:120" when the rounds compile for another GPU
    built_on: str | None = None  # the visible GPU's target
    gpu_name: str | None = None
    seed: dict | None = None  # the seeding's CompileResult, as a dict
    notes: list[str] = field(default_factory=list)

    def finish(self, bake: dict) -> CompileRecord:
        """After the rounds: this bake's record; cross bakes drop their autotune results.
        Adds what happened to ``bake`` (the manifest's bake section)."""
        record = load_record_log(self.record_log)
        if self.seed is not None:
            bake["seed"] = self.seed
        if self.cross_target:
            dropped = _drop_autotune_results(self.triton_dir)
            bake["cross_target"] = {"target": self.cross_target, "built_on": self.built_on,
                                    "gpu_name": self.gpu_name, "autotune_results_dropped": dropped}
            bake["unverified_on_target"] = {"how": "cross-bake", "built_on": self.built_on}
        return record


def prepare_bake(benv, *, seed: os.PathLike | str | None = None, jobs: int | None = None,
                 target: str | None = None, gpu_name: str | None = None, retune: bool = False,
                 visible: Callable | None = None, allow_modules=(),
                 progress: Callable[[str], None] | None = None) -> BakePrep:
    """Before round 1: reset this bake's record log, decide whether the bake is cross-target
    (``--target`` differs from the visible GPU) and set its env, and seed from ``seed``
    (its record is data: modules beyond vLLM's and Triton's only from ``allow_modules``, its
    variables compared with this process's, never applied; cachebake.replay.engine)."""
    from cachebake.gpu import GPUTargetSpec, visible_gpu

    events = benv.pinned.get(MONITOR_LOG_ENV)
    if not events:
        raise BadInput("the bake env has no monitor log (bake_env(monitor_log=...))")
    log = record_log_path(events)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    open(log, "wb").close()  # this build's compiles only
    triton_dir = benv.role_dirs().get("triton")
    prep = BakePrep(triton_dir=triton_dir, record_log=log, gpu_name=gpu_name)

    seen = (visible or visible_gpu)()
    here = seen[0].key if seen else None
    want = GPUTargetSpec.parse(target).key if target else here
    prep.built_on = here
    if want and here and want != here:
        prep.cross_target = want
        benv.env[CROSS_TARGET_ENV] = want
        if gpu_name:
            benv.env[GPU_NAME_ENV] = gpu_name
    elif gpu_name:
        raise BadInput("--gpu-name is for cross-target bakes (a --target other than this GPU's)")

    if seed is not None:
        from cachebake.replay.engine import compile_record, load_record

        if not want:
            raise BadInput("--seed: no GPU is visible here to compile for: pass --target")
        if triton_dir is None:
            raise BadInput("--seed needs the triton role in the bake")
        loaded = load_record(seed)
        carry = not retune and not prep.cross_target
        result = compile_record(loaded.record, want, triton_dir, jobs=jobs, carry_autotune=carry,
                                progress=progress, allow_modules=allow_modules)
        prep.seed = {"from": loaded.source, "retune": retune, **result.to_dict()}
        for problem in result.problems:  # the rounds compile what seeding could not
            prep.notes.append(f"seed: {problem}")
    return prep


def _drop_autotune_results(triton_dir: str | None) -> int:
    if not triton_dir or not os.path.isdir(triton_dir):
        return 0
    dropped = 0
    for entry in os.scandir(triton_dir):
        if not entry.is_dir():
            continue
        for name in os.listdir(entry.path):
            if name.endswith(".autotune.json"):
                os.unlink(os.path.join(entry.path, name))
                dropped += 1
        if not os.listdir(entry.path):
            os.rmdir(entry.path)
    return dropped

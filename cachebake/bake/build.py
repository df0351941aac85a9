"""``cachebake build``: check everything, run a warmup under the compile monitor until the
caches stop growing, then pack what the rounds filled.

Order matters to a user who waits minutes per round: every check that can fail runs before
round 1 (``preflight``): the driver's packages and GPU, the GPU target, ``--out`` (not in the
way, writable), ``--root`` (writable, and empty unless ``--reuse-root``: an earlier bake's
kernels would silently end up in this artifact), the round options.  Then the rounds
(cachebake.bake.rounds) until enough consecutive quiet rounds prove the fixed point, then pack
(cachebake.artifact.pack) with the bake section: what ran, the env, every round, and what the
driver recorded.

Then the root is emptied again (``clear_root``), unless ``--keep-root`` or ``--reuse-root``:
everything the rounds wrote under it is in the artifact now, and a root left full makes the
next ``build`` refuse (an unclean ``--root``) and the documented ``install ART --to ROOT`` on
the same machine refuse too (a cache that is not an install is in the way).  The artifact is
what serves; ``install`` puts it at ROOT with its checks.  Nothing is removed when the bake
fails or is stopped (the caches are what ``--reuse-root`` continues from), nor with
``--reuse-root`` (the root held caches this bake did not make).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cachebake.artifact.pack import (CacheRoot, PackReport, check_out, check_triton, check_writable,
                                     pack_artifact)
from cachebake.bake.rounds import (DEFAULT_MAX_ROUNDS, DEFAULT_QUIET_ROUNDS, Driver, RoundProgress,
                                   Rounds, check_round_options, run_rounds)
from cachebake.capture.env import ALL_ROLES, InvalidatingEnvWarning, bake_env
from cachebake.vllm.identity import outcome_problem
from cachebake.errors import BadInput, CommandFailed, Interrupted
from cachebake.gpu import GPUTargetSpec, visible_gpu


@dataclass
class BuildPlan:
    """What preflight settled: where the artifact goes, where the bake runs, for which GPU."""

    out: Path
    root: Path
    target: str  # "cuda:90"
    # what was there before the bake (clear_root removes only what the bake made)
    root_existed: bool = True
    roles_existed: tuple[str, ...] = ()


@dataclass
class BuildReport:
    plan: BuildPlan
    rounds: Rounds
    bake: dict  # the manifest's bake section
    pack: PackReport
    root_cleared: bool = False  # the caches under the root were removed after packing

    @property
    def stable(self) -> bool:
        return self.rounds.stable

    def to_dict(self) -> dict:
        return {"status": self.pack.status, "out": str(self.plan.out), "target": self.pack.target,
                "targets": self.pack.targets, "manifest_digest": self.pack.manifest_digest,
                "layer_digest": self.pack.layer_digest, "layer_size": self.pack.manifest.layer.size,
                "root": str(self.plan.root), "root_cleared": self.root_cleared, "stable": self.stable, "rounds": len(self.rounds.rounds),
                "record": self.pack.manifest.record, "bake": self.bake}


def torch_compile_note(bake: dict) -> str | None:
    """A warning when the bake's last round (the vllm driver's) did not run torch.compile from
    what the earlier rounds left: a server set up like the rounds would compile again too, so
    the packed vllm role spares it nothing.  None for one round (it must compile), for the
    other drivers, and when it loaded."""
    if not isinstance(bake.get("rounds"), int) or bake["rounds"] < 2:
        return None
    outcome = bake.get("torch_compile")
    problem = outcome_problem(outcome) if isinstance(outcome, dict) else None
    if problem is None:
        return None
    return (f"the last round did not load torch.compile's artifact: {problem}; the vllm role is "
            "packed, but a server like the rounds would recompile (~9 s at every start)")


def _bake_target(target: str | None) -> str:
    """``--target``, else the visible GPU.  A ``--target`` other than the visible GPU's makes a
    cross-target bake (cachebake.bake.seed: Triton compiles for it, launches are skipped)."""
    if target:
        return GPUTargetSpec.parse(target).key
    seen = visible_gpu()
    if seen is None:
        raise BadInput("no GPU is visible here: pass --target, the GPU the warmup compiles for "
                       "(e.g. --target sm_90)")
    return seen[0].key


def _check_root(root: os.PathLike | str, roles: tuple[str, ...], reuse_root: bool) -> Path:
    root = Path(os.path.abspath(os.fspath(root)))
    check_writable(root, "--root")
    used = []
    for role in roles:
        d = root / role
        try:
            if d.exists() and not d.is_dir():
                raise BadInput(f"--root {root}: {d} is not a directory")
            n = len(os.listdir(d)) if d.is_dir() else 0
        except OSError as e:
            raise BadInput(f"--root {root}: cannot read {d}: {e.strerror}") from None
        if n:
            used.append(f"{role}/ {n} entries")
    if used and not reuse_root:
        raise BadInput(f"--root {root} already holds caches ({', '.join(used)}) that would be "
                       "packed into this artifact: remove them, give an empty --root, or pass "
                       "--reuse-root to bake on top of them")
    return root


def preflight(driver: Driver, *, out: os.PathLike | str, root: os.PathLike | str,
              target: str | None = None, reuse_root: bool = False,
              roles: tuple[str, ...] = ALL_ROLES, max_rounds: int = DEFAULT_MAX_ROUNDS,
              quiet_rounds: int = DEFAULT_QUIET_ROUNDS, until_stable: bool = True) -> BuildPlan:
    """Every check ``build`` can make before round 1; raises the first failure."""
    check_round_options(max_rounds, quiet_rounds, until_stable)
    driver.preflight()
    check_triton()  # pack, at the end, records this interpreter's Triton in the fingerprint
    checked = _check_root(root, roles, reuse_root)
    return BuildPlan(out=check_out(out), root=checked, target=_bake_target(target),
                     root_existed=checked.is_dir(),
                     roles_existed=tuple(r for r in roles if os.path.lexists(checked / r)))


def clear_root(plan: BuildPlan, roles: tuple[str, ...]) -> list[str]:
    """Remove what the bake wrote under ``plan.root`` (see the module docstring): each role
    directory the bake created, the entries of one that was there (empty) before, and the
    root itself if the bake created it and it is empty now.  A role that is a symlink is left
    alone (it leads out of the root).  Returns what could not be removed, as warnings: the
    artifact is made, so a leftover is not a failed build."""
    problems = []
    for role in roles:
        d = plan.root / role
        if os.path.islink(d) or not d.is_dir():
            continue
        try:
            if role in plan.roles_existed:
                for entry in os.scandir(d):
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
            else:
                shutil.rmtree(d)
        except OSError as e:
            problems.append(f"could not remove the baked caches under {d}: {e.strerror or e} "
                            f"({e.filename}); remove them before the next build into {plan.root}")
    if not plan.root_existed:
        try:
            plan.root.rmdir()
        except OSError:
            pass  # not empty: something else lives there now, not ours to remove
    return problems


@dataclass(frozen=True)
class BuildOptions:
    """What a bake is asked to do (``cachebake build``'s options), in one value.

    ``out``: the artifact dir; ``root``: the bake root the rounds fill; ``roles``: the cache roles
    pinned under it (default: all); ``target``: the GPU target (default: the visible GPU's;
    another one is a cross-target bake); ``max_rounds``/``quiet_rounds``/``until_stable``: when
    the rounds stop; ``reuse_root``: bake on top of caches already under the root;
    ``keep_root``: leave the packed caches there; ``allow_invalidating``: cache-invalidating
    variables set on purpose; ``work_dir``: keep the round logs there (default: a temp dir,
    removed); ``seed``/``jobs``/``gpu_name``/``retune``/``allow_modules``: seeding from a record
    (cachebake.bake.seed); ``layer_root`` (default: the bake root) and ``prune_ir``: as for pack."""

    out: os.PathLike | str
    root: os.PathLike | str
    roles: tuple[str, ...] = ALL_ROLES
    target: str | None = None
    max_rounds: int = DEFAULT_MAX_ROUNDS
    quiet_rounds: int = DEFAULT_QUIET_ROUNDS
    until_stable: bool = True
    reuse_root: bool = False
    keep_root: bool = False
    allow_invalidating: bool = False
    work_dir: os.PathLike | str | None = None
    seed: os.PathLike | str | None = None
    jobs: int | None = None
    gpu_name: str | None = None
    retune: bool = False
    allow_modules: tuple[str, ...] = ()
    layer_root: str | None = None
    prune_ir: bool = False


def build(driver: Driver, options: BuildOptions, *, progress: RoundProgress | None = None,
          warn: Callable[[str], None] | None = None, pack_progress=None) -> BuildReport:
    """The whole of ``cachebake build``: preflight, rounds to the fixed point, pack, then the
    root emptied unless ``keep_root`` or ``reuse_root`` (``clear_root``).

    ``layer_root`` defaults to the bake root (group files then already point where a server
    using the same root finds them).  A temp work dir (no ``work_dir``) is removed at the end,
    whatever happens.  ``progress``, ``warn`` and ``pack_progress`` are how the caller shows
    what happens (the CLI's bars and warning lines); the bake does not depend on them."""
    o = options
    def say(note: str, category: type[Warning] = UserWarning) -> None:
        if warn is not None:
            warn(note)
        else:
            warnings.warn(note, category, stacklevel=3)

    roles = tuple(o.roles) if o.roles else ALL_ROLES
    plan = preflight(driver, out=o.out, root=o.root, target=o.target, reuse_root=o.reuse_root,
                     roles=roles, max_rounds=o.max_rounds, quiet_rounds=o.quiet_rounds,
                     until_stable=o.until_stable)
    if driver.name == "command":  # the other drivers refuse in their preflight
        from cachebake.gpu import visible_gpu
        from cachebake.toolchain import c_toolchain_problem

        # Only where a kernel can launch: with no GPU visible nothing launches (a warmup that
        # compiles ahead of time, as README's CPU quick start does, needs no C compiler)
        problem = c_toolchain_problem() if visible_gpu() is not None else None
        if problem:
            note = (f"Triton cannot build its launcher helpers here ({problem}): a warmup that "
                    "launches kernels will fail at its first launch")
            say(note)
    work = Path(o.work_dir) if o.work_dir else Path(tempfile.mkdtemp(prefix="cachebake-build-"))
    packed = None
    try:
        work.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():  # shown once, below, through ``warn``
            warnings.simplefilter("ignore", InvalidatingEnvWarning)
            benv = bake_env(plan.root, roles, monitor_log=work / "events.jsonl",
                            allow_invalidating=o.allow_invalidating)
        for note in benv.warnings:
            say(note, InvalidatingEnvWarning)
        from cachebake.bake.seed import prepare_bake  # seed, cross-target, this bake's record

        prep = prepare_bake(benv, seed=o.seed, jobs=o.jobs, target=o.target, gpu_name=o.gpu_name,
                            retune=o.retune, allow_modules=o.allow_modules)
        for note in prep.notes:  # what seeding could not compile: the rounds do
            say(note)
        try:
            rounds = run_rounds(driver, benv, max_rounds=o.max_rounds, quiet_rounds=o.quiet_rounds,
                                until_stable=o.until_stable, work_dir=work,
                                keep_logs=o.work_dir is not None, progress=progress)
        except KeyboardInterrupt:
            raise Interrupted(f"the bake was stopped; nothing was packed and {plan.out} is as it "
                              f"was; the caches under {plan.root} keep what the rounds compiled "
                              "(--reuse-root continues from them)") from None
        cache_roots = [CacheRoot(role, Path(d)) for role, d in benv.role_dirs().items()
                       if os.path.isdir(d) and any(os.scandir(d))]
        if not cache_roots:
            raise CommandFailed(f"the warmup left every cache under {plan.root} empty: "
                                "nothing to bake (does it use Triton at all?)")
        bake = {**driver.describe(), "env": benv.to_dict(), **rounds.to_dict(),
                # what the driver recorded (the vllm driver: model path, the exact serve args,
                # the limits vLLM resolved, the request plan): `serve-args` and `inspect` read it
                **driver.recorded(work)}
        record = prep.finish(bake)  # this bake's compile record; notes seed/cross-target in bake
        note = torch_compile_note(bake)
        if note is not None:
            say(note)
        packed = pack_artifact(cache_roots, plan.out, target=plan.target, bake=bake,
                               layer_root=o.layer_root or str(plan.root), prune_ir=o.prune_ir,
                               record=record, progress=pack_progress)
        cleared = not (o.keep_root or o.reuse_root)
        if cleared:
            for note in clear_root(plan, roles):
                cleared = False
                say(note)
        return BuildReport(plan=plan, rounds=rounds, bake=bake, pack=packed, root_cleared=cleared)
    finally:
        if not o.work_dir:
            try:
                shutil.rmtree(work, ignore_errors=True)
            except KeyboardInterrupt:  # after the pack: say it is there
                if packed is None:
                    raise
                raise Interrupted(f"the bake is packed in {plan.out}; its work dir {work} may be left") from None

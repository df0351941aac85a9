"""``cachebake verify``: run one warmup round against an installed cache and prove the server
would not compile.

The round runs exactly as a server would: the installed cache's roles handed over through the
same variables install uses (``capture.env.bake_env`` -> ``roles.serving_env``), a fresh
process, and the compile monitor on.  Any real compile, autotune benchmark or helper build
means the bake missed something (another shape, another path, another env): verify lists each
one and fails with ``CompilesSeen``.  With ``--driver vllm`` so does a round whose torch.compile
did not load the baked artifact (the probe's record, cachebake.vllm.identity, or vLLM's
own log lines): Dynamo and Inductor running again is a miss even when every Triton kernel hits.

``check_only`` (``verify --check-only``) runs no round: it asks, in the serving environment and
without a GPU, whether vLLM would compute the bake's torch.compile hashes for the server's
model string and flags (cachebake.vllm.compile_check).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.bake.rounds import (Driver, RoundProgress, RoundReport, check_round, run_round,
                                   work_events)
from cachebake.capture.env import ALL_ROLES, bake_env
from cachebake.capture.events import Event
from cachebake.vllm.identity import outcome_from_log, outcome_problem
from cachebake.errors import BadInput, CompilesSeen, Interrupted, InvalidDocument, Unsupported, UnsafeArtifact
from cachebake.install.atomic import InstallDir
from cachebake.roles import overlay_env
from cachebake.serve import READS_ENV


@dataclass
class VerifyReport:
    cache: str
    roles: list[str]
    round: RoundReport
    work: list[Event] = field(default_factory=list)  # every compile / autotune / helper build
    invalidating: dict[str, str] = field(default_factory=dict)  # set here; must match the bake
    left_out: dict[str, str] = field(default_factory=dict)  # roles install could not relocate here
    torch_compile: dict | None = None  # vllm driver: what torch.compile did in the round

    @property
    def torch_compile_problem(self) -> str | None:
        return outcome_problem(self.torch_compile)

    @property
    def ok(self) -> bool:
        return self.round.exit_code == 0 and not self.work and self.torch_compile_problem is None

    def warnings(self) -> list[str]:
        """Roles the install left out: the round ran without them, as the server will."""
        return [f"the {role} role was left out at install ({why}): this round ran without it"
                for role, why in sorted(self.left_out.items())]

    def lines(self) -> list[str]:
        """One line per piece of work the server would have done."""
        lines = [f"{e.kind:<12} {e.label()}  ({e.seconds:.2f} s, key {e.key or '-'}"
                 f"{', step ' + e.step if e.step else ''})" for e in self.work]
        if self.torch_compile_problem:
            lines.append(f"torch.compile: {self.torch_compile_problem}")
        return lines

    def to_dict(self) -> dict:
        return {"cache": self.cache, "roles": self.roles,
                "invalidating_env_vars": self.invalidating, "left_out": self.left_out,
                "torch_compile": self.torch_compile,
                **self.round.to_dict(),
                "work": [{k: v for k, v in vars(e).items() if v not in (None, {}, [])}
                         for e in self.work]}

    def check(self) -> None:
        """Raise CompilesSeen when the round did any work."""
        if self.work:
            s = self.round.summary
            raise CompilesSeen(
                f"the cache at {self.cache} is incomplete: {s.compiles} real compiles, "
                f"{s.autotunes} autotune benchmarks, {s.helper_builds} helper builds "
                f"({', '.join(s.kernels[:5]) or 'helpers'})"
                + (f"; note: {', '.join(sorted(self.invalidating))} set here enter every key"
                   if self.invalidating else ""))
        if self.torch_compile_problem:
            raise CompilesSeen(f"the cache at {self.cache} did not give vLLM its torch.compile "
                               f"artifact: {self.torch_compile_problem}")


def installed_roles(cache: os.PathLike | str) -> list[str]:
    """The roles present under an installed cache root (a directory per role)."""
    found = [r for r in ALL_ROLES if os.path.isdir(os.path.join(cache, r))]
    role, parent = os.path.basename(os.path.normpath(cache)), os.path.dirname(os.path.normpath(cache))
    if not found and role in ALL_ROLES and os.path.isdir(os.path.join(parent, role)):
        # DIR/triton is what TRITON_CACHE_DIR says, so a natural thing to give; verify sets
        # every role's variable itself, from the root
        raise BadInput(f"{cache} is the {role} role of a cache root: give the install dir "
                       f"{parent}, not {cache} (verify --cache takes install's --to DIR)")
    if not found:
        raise BadInput(f"{cache}: no cache roles here (expected one of "
                       f"{', '.join(r + '/' for r in ALL_ROLES)})")
    return found


def installed_warmup(cache: os.PathLike | str) -> dict:
    """The warmup of the bake installed at ``cache`` (install.json's ``warmup``: driver, model,
    tp, serve_args, model_dir), which `verify` runs when given neither --model nor a command;
    {} where the install recorded none (a command bake, a bake root, an older install)."""
    cache = os.path.abspath(os.fspath(cache))
    if not os.path.isdir(cache):
        return {}
    marker = InstallDir(cache).installed()
    warmup = dict(marker.warmup) if marker else {}
    if warmup.get("serve_args") is not None:  # the artifact's, and verify runs vLLM with them
        from cachebake.vllm.serveargs import carried_serve_args

        warmup["serve_args"] = carried_serve_args(warmup["serve_args"], os.path.join(cache, ".cachebake/install.json"),
                                                  "warmup.serve_args")
    if warmup.get("driver") == "vllm":  # the driver writes the model's config.json there
        from cachebake.vllm.serveargs import carried_model_dir_problem

        problem = carried_model_dir_problem(warmup.get("model_dir"))
        if problem is not None:
            raise UnsafeArtifact(f"{os.path.join(cache, '.cachebake/install.json')}: warmup.{problem}",
                                 hint="give --model and --model-dir yourself")
    return warmup


def verify(driver: Driver, cache: os.PathLike | str, *, work_dir: os.PathLike | str | None = None,
           progress: RoundProgress | None = None) -> VerifyReport:
    """Run one round of ``driver`` against ``cache``.  Every check (the cache, the driver's
    requirements) runs before the round.  Raises CommandFailed if the round fails; returns
    the report otherwise (``.check()`` raises on work seen).  A temp work dir (no
    ``work_dir``) is removed before returning."""
    cache = os.path.abspath(os.fspath(cache))
    if not os.path.isdir(cache):
        raise BadInput(f"{cache}: no such directory")
    roles = installed_roles(cache)
    driver.preflight()
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cachebake-verify-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        events_path = work / "events.jsonl"
        open(events_path, "wb").close()
        # allow_invalidating: verify reports what is set; the build's warning already covered it
        benv = bake_env(cache, roles, monitor_log=events_path, allow_invalidating=True)
        env = dict(benv.env)
        if "triton" in roles:
            # Never write into the cache being checked: Triton's misses go to a scratch overlay
            # (the layered cache manager), so a read-only installed cache gets a verdict (exit 8
            # and the list), not a PermissionError, and a writable one is left as installed.
            # Reads stay Triton's own (READS_ENV), so the verdict is what a server gets.
            env.update(overlay_env(work / "overlay"))
            env[READS_ENV] = "triton"
        if progress is not None:
            progress.start_round(1, 1)
        try:
            rnd = run_round(driver, env, events_path, 1, work, progress)
        except KeyboardInterrupt:
            raise Interrupted("the verify round was stopped; nothing was changed") from None
        if progress is not None:
            progress.end_round(rnd)
        check_round(rnd, driver, progress, keep_logs=work_dir is not None, what="verify round")
        marker = InstallDir(cache).installed()
        return VerifyReport(cache=cache, roles=roles, round=rnd, work=work_events(events_path),
                            invalidating=benv.invalidating,
                            left_out=dict(marker.left_out) if marker else {},
                            torch_compile=_torch_compile(driver, work, rnd))
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)


def _torch_compile(driver: Driver, work: Path, rnd: RoundReport) -> dict | None:
    """The vllm driver's round: what torch.compile did, from its record (the probe), else from
    vLLM's own log lines in the round's output; None for the other drivers."""
    if getattr(driver, "name", None) != "vllm":
        return None
    outcome = (driver.recorded(work) or {}).get("torch_compile")
    if outcome:
        return outcome
    try:
        with open(rnd.log, errors="replace") as f:
            return outcome_from_log(f.read(64 << 20))
    except OSError:
        return None


def check_only(cache: os.PathLike | str, *, artifact: str | None = None, target: str | None = None,
               model_ref: str | None = None, server_argv: list[str] | None = None):
    """``verify --check-only``: would the server's vLLM load the bake's torch.compile artifact
    from ``cache`` (the installed root as the server sees it), with ``model_ref`` and
    ``server_argv`` (its ``vllm serve`` arguments; default: the bake's)?  The bake's identity
    comes from ``artifact``'s manifest, else from what vLLM wrote into the installed tree.
    Returns the report (``.check()`` raises PreflightMismatch)."""
    from cachebake.roles import role_dir
    from cachebake.vllm import compile_check

    cache = os.path.abspath(os.fspath(cache))
    vllm_root = role_dir(cache, "vllm")
    if not os.path.isdir(vllm_root):
        raise BadInput(f"{cache}: no vllm role here (the bake has none, or install left it out): "
                       "nothing for torch.compile to load")
    baked_args = config_sha = plan = None
    if artifact is not None:
        from cachebake.serve.command import read_manifest

        bake = read_manifest(artifact, target).get("bake") or {}
        identity = compile_check.identity_from_bake(bake)
        baked_args = bake.get("serve_args") if isinstance(bake.get("serve_args"), dict) else None
        if baked_args is not None:  # vLLM parses them as the server's flags (compile_check)
            from cachebake.vllm.serveargs import carried_serve_args

            baked_args = carried_serve_args(baked_args, f"{artifact}: bake manifest", "bake.serve_args")
        model = bake.get("model") if isinstance(bake.get("model"), dict) else {}
        config_sha = model.get("config_sha256") if isinstance(model.get("config_sha256"), str) else None
        plan = bake.get("startup_plan") if isinstance(bake.get("startup_plan"), dict) else None
        source = f"the bake record in {artifact}"
    else:
        identity = compile_check.identity_from_tree(vllm_root)
        source = f"vLLM's own files in {vllm_root}"
    check_identity_shape(identity, "bake manifest" if artifact is not None else "cache_key_factors.json")
    try:
        return compile_check.check_serving(identity, source=source, model=model_ref,
                                           server_argv=server_argv, baked_serve_args=baked_args,
                                           cache_root=vllm_root, baked_config_sha256=config_sha,
                                           startup_plan=plan)
    except ModuleNotFoundError as e:  # the check runs vLLM's own code: no vLLM, no check
        top = (e.name or "").partition(".")[0]
        if top not in SERVING_MODULES:
            raise
        raise Unsupported(f"verify --check-only needs vllm in this interpreter ({sys.executable}): "
                          f"{top} is not installed",
                          hint="run it in the serving image, with the server's vLLM") from None


# What ``--check-only`` imports from the serving environment (vLLM and what vLLM imports).
SERVING_MODULES = frozenset({"vllm", "torch", "transformers", "huggingface_hub"})

# The compile identity's fields ``compile_check`` reads, by the JSON type each must have: a
# record is data from an artifact, and a list where an object belongs is a malformed record
# (exit 5), not a crash of the comparison.
_IDENTITY_FIELDS = {
    dict: ("env_factors", "path_factors", "set_factors", "roots", "model", "engine_args",
           "config_parts", "compiler_factors", "engine"),
    list: ("traced_files", "aot", "backend_dirs"),
    str: ("vllm_version", "env_hash", "config_hash", "code_hash", "compiler_hash"),
}
_JSON_TYPE = {dict: "an object", list: "a list", str: "a string"}


def check_identity_shape(identity: dict, document: str) -> None:
    """InvalidDocument (exit 5) naming the first field of ``identity`` whose JSON type is not
    the one ``compile_check`` reads it as (absent and null fields are fine)."""
    from cachebake.vllm.serveargs import IDENTITY_KEY

    where = f"bake.{IDENTITY_KEY}"
    for kind, names in _IDENTITY_FIELDS.items():
        for name in names:
            value = identity.get(name)
            if value is not None and not isinstance(value, kind):
                raise InvalidDocument(document, f"{where}.{name}", f"is not {_JSON_TYPE[kind]}")
    for key, root in (identity.get("roots") or {}).items():
        if not isinstance(root, str):
            raise InvalidDocument(document, f"{where}.roots.{key}", "is not a string")
    for part, entry in (identity.get("config_parts") or {}).items():
        if entry is not None and not isinstance(entry, dict):
            raise InvalidDocument(document, f"{where}.config_parts.{part}", "is not an object")

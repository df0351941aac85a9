"""``cachebake verify``: run one warmup round against an installed cache and prove the server
would not compile.

The round runs exactly as a server would: the installed cache's roles handed over through the
same variables install uses (``capture.env.bake_env`` -> ``roles.serving_env``), a fresh
process, and the compile monitor on.  Any real compile, autotune benchmark or helper build
means the bake missed something (another shape, another path, another env): verify lists each
one and fails with ``CompilesSeen``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.bake.rounds import (Driver, RoundProgress, RoundReport, check_round, run_round,
                                   work_events)
from cachebake.capture.env import ALL_ROLES, bake_env
from cachebake.capture.events import Event
from cachebake.errors import BadInput, CompilesSeen, Interrupted
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

    @property
    def ok(self) -> bool:
        return self.round.exit_code == 0 and not self.work

    def warnings(self) -> list[str]:
        """Roles the install left out: the round ran without them, as the server will."""
        return [f"the {role} role was left out at install ({why}): this round ran without it"
                for role, why in sorted(self.left_out.items())]

    def lines(self) -> list[str]:
        """One line per piece of work the server would have done."""
        return [f"{e.kind:<12} {e.label()}  ({e.seconds:.2f} s, key {e.key or '-'}"
                f"{', step ' + e.step if e.step else ''})" for e in self.work]

    def to_dict(self) -> dict:
        return {"cache": self.cache, "roles": self.roles,
                "invalidating_env_vars": self.invalidating, "left_out": self.left_out,
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
        marker = InstallDir(cache).installed() or {}
        return VerifyReport(cache=cache, roles=roles, round=rnd, work=work_events(events_path),
                            invalidating=benv.invalidating,
                            left_out=dict(marker.get("left_out") or {}))
    finally:
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)

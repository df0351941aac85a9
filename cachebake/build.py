"""``cachebake build``: run a warmup under the compile monitor until nothing new compiles, then
pack the caches it filled.

Each round is a fresh process (a driver's ``round_argv``) in the bake env, with every process
of it appending compile events to one log.  A round that does no work -- no real compile, no
autotune benchmark, no helper build -- proves that a server starting from these caches would
not either: that is the fixed point.  Until it is reached the caches are incomplete, so a
command still compiling after ``max_rounds`` is a failure (``NotStable``) unless the caller
accepts an incomplete bake.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cachebake.capture.env import ROUND_ENV, BakeEnv, InvalidatingEnvWarning, bake_env
from cachebake.capture.events import WORK_KINDS, Event, EventSummary, EventTail, read_events
from cachebake.errors import BadInput, CommandFailed, NotStable
from cachebake.progress import RoundProgress

DEFAULT_MAX_ROUNDS = 4


@dataclass
class RoundReport:
    index: int  # 1-based
    exit_code: int
    seconds: float
    summary: EventSummary
    log: str  # the round's stdout+stderr

    @property
    def stable(self) -> bool:
        return self.exit_code == 0 and self.summary.stable

    def to_dict(self) -> dict:
        return {"round": self.index, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 3), **self.summary.to_dict()}


@dataclass
class BuildReport:
    driver: dict  # what ran: the command line, or the driver and its model
    env: dict  # BakeEnv.to_dict(): root, roles, pinned variables, invalidating vars
    events_path: str
    rounds: list[RoundReport] = field(default_factory=list)
    stable: bool = False
    work_events: list[Event] = field(default_factory=list)  # compiles/autotunes/helper builds

    @property
    def total(self) -> EventSummary:
        return EventSummary.of(self.work_events)

    def to_dict(self) -> dict:
        """The manifest's ``bake`` section."""
        total = self.total
        inventory: dict[str, int] = {}
        for e in self.work_events:
            if e.kind == "compile":
                inventory[e.kernel] = inventory.get(e.kernel, 0) + 1
        return {
            **self.driver,
            "env": self.env,
            "stable": self.stable,
            "rounds": len(self.rounds),
            "per_round": [r.to_dict() for r in self.rounds],
            "compiles": total.compiles,
            "autotunes": total.autotunes,
            "helper_builds": total.helper_builds,
            # the time a server no longer spends: compiles + benchmarks + gcc, all rounds
            "compile_seconds_moved": total.compile_seconds,
            "autotune_seconds_moved": total.autotune_seconds,
            "helper_seconds_moved": total.helper_seconds,
            "kernels": dict(sorted(inventory.items())),
            "events": [_event_record(e) for e in self.work_events],
        }


def _event_record(e: Event) -> dict:
    d = {k: v for k, v in asdict(e).items() if v not in (None, {}, [])}
    d.pop("time", None)  # wall-clock and process ids are noise in a manifest
    d.pop("pid", None)
    return d


def run_round(driver, env: dict[str, str], events_path: str, index: int, log_dir: str,
              progress: RoundProgress | None = None) -> RoundReport:
    """Run one round of ``driver`` in ``env``; its events are the log lines tagged ``index``."""
    log_path = os.path.join(log_dir, f"round-{index}.log")
    argv = driver.round_argv()
    tail = EventTail(events_path)
    tail.offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
    start = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(argv, env={**env, ROUND_ENV: str(index)}, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as e:
            raise CommandFailed(f"could not start {argv[0]!r}: {e.strerror or e}") from e
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                if progress is not None:
                    progress.update(tail.new_events())
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait()
            raise
    if progress is not None:
        progress.update(tail.new_events())
    events = [e for e in read_events(events_path) if e.round == index]
    return RoundReport(index=index, exit_code=proc.returncode,
                       seconds=time.monotonic() - start, summary=EventSummary.of(events),
                       log=log_path)


def run_until_stable(driver, benv: BakeEnv, *, max_rounds: int = DEFAULT_MAX_ROUNDS,
                     until_stable: bool = True, work_dir: os.PathLike | str | None = None,
                     progress: RoundProgress | None = None) -> BuildReport:
    """Rounds until one does no work.  Raises CommandFailed if a round fails, and NotStable
    if ``until_stable`` and the last of ``max_rounds`` still did work."""
    if max_rounds < 1:
        raise BadInput("--max-rounds must be at least 1")
    events_path = benv.pinned.get("CACHEBAKE_MONITOR_LOG")
    if not events_path:
        raise BadInput("the bake env has no monitor log (bake_env(monitor_log=...))")
    work = Path(work_dir) if work_dir else Path(os.path.dirname(events_path))
    work.mkdir(parents=True, exist_ok=True)
    open(events_path, "wb").close()  # this build's rounds only: round numbers restart at 1
    benv.make_dirs()
    report = BuildReport(driver=driver.describe(), env=benv.to_dict(), events_path=events_path)
    for index in range(1, max_rounds + 1):
        if progress is not None:
            progress.start_round(index, max_rounds)
        rnd = run_round(driver, benv.env, events_path, index, str(work), progress)
        report.rounds.append(rnd)
        if progress is not None:
            progress.end_round(rnd)
            if rnd.exit_code != 0:
                progress.show_tail(rnd.log)
        if rnd.exit_code != 0:
            raise _with_report(CommandFailed, report,
                               f"round {index}: {driver.label()} exited with "
                               f"{_exit_text(rnd.exit_code)} (output: {rnd.log})")
        if rnd.summary.seen == 0:
            raise _with_report(CommandFailed, report, no_activity_message(index, rnd.log))
        if rnd.summary.stable:
            report.stable = True
            break
    report.work_events = work_events(events_path)
    if not report.stable and until_stable:
        last = report.rounds[-1].summary
        raise _with_report(
            NotStable,
            report,
            f"still compiling after {max_rounds} rounds (last round: {last.compiles} compiles, "
            f"{last.autotunes} autotune benchmarks, {last.helper_builds} helper builds: "
            f"{', '.join(last.kernels[:5]) or '-'}); the warmup is not deterministic -- "
            "raise --max-rounds or pass --no-until-stable to pack an incomplete bake")
    return report


def _with_report(error_class, report: BuildReport, message: str):
    """The error, carrying the report so far (callers may still want the rounds)."""
    report.work_events = work_events(report.events_path)
    err = error_class(message)
    err.report = report
    return err


def work_events(events_path: os.PathLike | str) -> list[Event]:
    """The compiles, autotune benchmarks and helper builds in a log."""
    return [e for e in read_events(events_path) if e.kind in WORK_KINDS]


def no_activity_message(index: int, log: str) -> str:
    return (f"round {index} ran, but the monitor saw no Triton compile or cache hit in any "
            f"process (output: {log}); the command must run Triton in Python processes that "
            "inherit the environment (PYTHONPATH, CACHEBAKE_MONITOR_LOG)")


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def build(driver, *, out: os.PathLike | str, root: os.PathLike | str, roles=None,
          target: str | None = None, max_rounds: int = DEFAULT_MAX_ROUNDS,
          until_stable: bool = True, allow_invalidating: bool = False,
          work_dir: os.PathLike | str | None = None, progress: RoundProgress | None = None,
          **pack_options):
    """The whole of ``cachebake build``: rounds to the fixed point, then pack.  Returns
    (BuildReport, PackReport).  ``pack_options`` (layer_root, prune_ir) go to pack_artifact
    when set; layer_root defaults to the bake root."""
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cachebake-build-"))
    work.mkdir(parents=True, exist_ok=True)
    kwargs = {"roles": tuple(roles)} if roles else {}
    with warnings.catch_warnings():  # shown once, below, as a plain line
        warnings.simplefilter("ignore", InvalidatingEnvWarning)
        benv = bake_env(root, monitor_log=work / "events.jsonl",
                        allow_invalidating=allow_invalidating, **kwargs)
    for note in benv.warnings:
        if progress is not None:
            progress.console.print(f"[yellow]warning:[/] {note}", highlight=False, soft_wrap=True)
        else:
            warnings.warn(note, InvalidatingEnvWarning, stacklevel=2)
    report = run_until_stable(driver, benv, max_rounds=max_rounds, until_stable=until_stable,
                              work_dir=work, progress=progress)
    from cachebake.artifact.pack import CacheRoot, pack_artifact  # the artifact half

    cache_roots = [CacheRoot(role, Path(d)) for role, d in benv.role_dirs().items()
                   if os.path.isdir(d) and any(os.scandir(d))]
    if not cache_roots:
        raise CommandFailed(f"the warmup left every cache under {benv.root} empty: "
                            "nothing to bake (does it use Triton at all?)")
    options = {k: v for k, v in pack_options.items() if v not in (None, False)}
    # Group files are written for the root the cache was baked at: an image mounted there (or
    # a server started with the same pinned env) hits without rewriting anything.
    options.setdefault("layer_root", str(benv.root))
    bake = report.to_dict()
    # A driver leaves its record beside the monitor's log (vllm: model identity and path, the
    # exact serve args, the limits vLLM resolved, the request plan; kernels: the engine plan
    # and steps): it becomes part of the bake section, where `serve-args` and `inspect` read it.
    for record in sorted(work.glob("*-bake.json")):
        bake.update(json.loads(record.read_text()))
    packed = pack_artifact(cache_roots, Path(out), target=target, bake=bake, **options)
    return report, packed

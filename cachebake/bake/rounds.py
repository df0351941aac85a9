"""Rounds: a driver's warmup, run as a fresh process under the compile monitor.

One round runner for ``build`` (rounds until the caches stop growing) and ``verify`` (one round
against an installed cache).  A round runs in its own process (its own session, so a Ctrl-C
stops every process of it) so that Triton's in-memory caches start empty: a kernel an earlier
round compiled must come back from the file cache, as it will for a freshly started server.
Every process of the round appends compile events to one log; the round's events are the
lines tagged with its number.

A round that does no work -- no real compile, no autotune benchmark, no helper build -- is
*quiet*.  One quiet round can be luck: a request plan whose batches land differently from run
to run (the scheduler's timing, async output processing, which requests share a step) can meet
a new specialization in the next round.  So a bake calls itself stable only on evidence:
``quiet_rounds`` consecutive quiet rounds (default 2).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from cachebake.capture.env import MONITOR_LOG_ENV, ROUND_ENV, BakeEnv
from cachebake.capture.events import WORK_KINDS, Event, EventSummary, EventTail, read_events
from cachebake.errors import BadInput, CommandFailed, NotStable, UsageError

DEFAULT_MAX_ROUNDS = 6
DEFAULT_QUIET_ROUNDS = 2
STOP_GRACE_S = 10.0  # after SIGTERM, how long a round's processes get before SIGKILL


class Driver(Protocol):
    """What runs one warmup round (cachebake.drivers.registry has the implementations)."""

    name: str  # "command", "kernels", "vllm"
    runs_on_gpu: bool  # runs kernels on this machine's GPU (so compiles for that GPU only)

    def round_argv(self) -> list[str]:
        """The command line of one round (a fresh process each time)."""

    def label(self) -> str:
        """A short human name for messages."""

    def describe(self) -> dict:
        """What ran, for the manifest's bake section (driver, model, command...)."""

    def preflight(self) -> None:
        """Raise a CachebakeError if this driver cannot run here (before any round)."""

    def recorded(self, work_dir: Path) -> dict:
        """What the driver itself recorded during its rounds (the vllm driver: model path,
        serve args, resolved limits, request plan), merged into the bake section."""


class RoundProgress(Protocol):  # cachebake.cli.progress.RoundProgress renders it
    def start_round(self, index: int, of: int) -> None: ...
    def update(self, events: list[Event]) -> None: ...
    def end_round(self, rnd: RoundReport) -> None: ...
    def show_tail(self, log_path: str) -> None: ...


@dataclass
class RoundReport:
    index: int  # 1-based
    exit_code: int
    seconds: float
    summary: EventSummary
    log: str  # the round's stdout+stderr

    @property
    def quiet(self) -> bool:
        return self.exit_code == 0 and self.summary.stable

    def to_dict(self) -> dict:
        return {"round": self.index, "exit_code": self.exit_code,
                "seconds": round(self.seconds, 3), **self.summary.to_dict()}


def run_round(driver: Driver, env: dict[str, str], events_path: os.PathLike | str, index: int,
              log_dir: os.PathLike | str, progress: RoundProgress | None = None) -> RoundReport:
    """Run round ``index`` of ``driver`` in ``env``.  Ctrl-C stops the round's whole process
    group (SIGTERM, then SIGKILL after STOP_GRACE_S) and re-raises KeyboardInterrupt."""
    log_path = os.path.join(os.fspath(log_dir), f"round-{index}.log")
    argv = driver.round_argv()
    tail = EventTail(events_path)
    tail.offset = os.path.getsize(events_path) if os.path.exists(events_path) else 0
    start = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            # A session of its own: the round's processes (vLLM's engine core, compile
            # workers) are one group we can stop together; a terminal's Ctrl-C reaches us.
            proc = subprocess.Popen(argv, env={**env, ROUND_ENV: str(index)}, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as e:
            raise CommandFailed(f"could not start {argv[0]!r}: {e.strerror or e}") from e
        try:
            while proc.poll() is None:
                time.sleep(0.25)
                if progress is not None:
                    progress.update(tail.new_events())
        except KeyboardInterrupt:
            _stop_group(proc)
            raise
    if progress is not None:
        progress.update(tail.new_events())
    events = [e for e in read_events(events_path) if e.round == index]
    return RoundReport(index=index, exit_code=proc.returncode,
                       seconds=time.monotonic() - start, summary=EventSummary.of(events),
                       log=log_path)


def _stop_group(proc: subprocess.Popen) -> None:
    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):  # stubborn, or a second Ctrl-C
        signal_group(signal.SIGKILL)
        proc.wait()


def check_round(rnd: RoundReport, driver: Driver, progress: RoundProgress | None = None, *,
                keep_logs: bool = True, what: str = "round") -> None:
    """Raise CommandFailed when the round failed, or when the monitor saw no Triton activity
    at all (that proves nothing).  ``keep_logs``: whether the round's log survives the
    command (a temp work dir does not), so the message names it or says how to keep it."""
    where = (f"output: {rnd.log}" if keep_logs
             else "its last lines are above; --work-dir DIR keeps the round logs")
    if rnd.exit_code != 0:
        if progress is not None:
            progress.show_tail(rnd.log)
        raise CommandFailed(f"{what} {rnd.index}: {driver.label()} exited with "
                            f"{_exit_text(rnd.exit_code)} ({where})")
    if rnd.summary.seen == 0:
        raise CommandFailed(
            f"{what} {rnd.index} ran, but the monitor saw no Triton compile or cache hit in any "
            f"process ({where}); the command must run Triton in Python processes that inherit "
            f"the environment (PYTHONPATH, {MONITOR_LOG_ENV})")


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"


def work_events(events_path: os.PathLike | str) -> list[Event]:
    """The compiles, autotune benchmarks and helper builds in a log."""
    return [e for e in read_events(events_path) if e.kind in WORK_KINDS]


@dataclass
class Rounds:
    """The rounds of one bake and what they did: the statistics part of the bake section."""

    rounds: list[RoundReport] = field(default_factory=list)
    stable: bool = False
    until_stable: bool = True
    quiet_rounds: int = DEFAULT_QUIET_ROUNDS
    max_rounds: int = DEFAULT_MAX_ROUNDS
    work_events: list[Event] = field(default_factory=list)  # compiles/autotunes/helper builds

    @property
    def total(self) -> EventSummary:
        return EventSummary.of(self.work_events)

    def to_dict(self) -> dict:
        total = self.total
        inventory: dict[str, int] = {}
        for e in self.work_events:
            if e.kind == "compile":
                inventory[e.kernel] = inventory.get(e.kernel, 0) + 1
        return {
            "stable": self.stable,
            # the evidence "stable" rests on: this many consecutive quiet rounds were required
            "until_stable": self.until_stable,
            "quiet_rounds": self.quiet_rounds,
            "max_rounds": self.max_rounds,
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


def check_round_options(max_rounds: int, quiet_rounds: int, until_stable: bool) -> None:
    if max_rounds < 1 or quiet_rounds < 1:
        raise UsageError("--max-rounds and --quiet-rounds must be at least 1")
    if until_stable and max_rounds < quiet_rounds:
        raise UsageError(f"--max-rounds {max_rounds} is less than --quiet-rounds {quiet_rounds}: "
                       "the bake could never be called stable")


def run_rounds(driver: Driver, benv: BakeEnv, *, max_rounds: int = DEFAULT_MAX_ROUNDS,
               quiet_rounds: int = DEFAULT_QUIET_ROUNDS, until_stable: bool = True,
               work_dir: os.PathLike | str | None = None, keep_logs: bool = True,
               progress: RoundProgress | None = None) -> Rounds:
    """Rounds until the last ``quiet_rounds`` were quiet (stable), or ``max_rounds`` ran.

    ``until_stable=False`` runs exactly one round and packs what it compiled (stable only if
    ``quiet_rounds`` is 1 and that round was quiet).  Raises CommandFailed if a round fails,
    NotStable if ``until_stable`` and the rounds ran out first."""
    check_round_options(max_rounds, quiet_rounds, until_stable)
    events_path = benv.pinned.get(MONITOR_LOG_ENV)
    if not events_path:
        raise BadInput("the bake env has no monitor log (bake_env(monitor_log=...))")
    work = Path(work_dir) if work_dir else Path(os.path.dirname(events_path))
    work.mkdir(parents=True, exist_ok=True)
    open(events_path, "wb").close()  # this build's rounds only: round numbers restart at 1
    benv.make_dirs()
    limit = max_rounds if until_stable else 1
    result = Rounds(until_stable=until_stable, quiet_rounds=quiet_rounds, max_rounds=max_rounds)
    quiet_streak = 0
    for index in range(1, limit + 1):
        if progress is not None:
            progress.start_round(index, limit)
        rnd = run_round(driver, benv.env, events_path, index, work, progress)
        result.rounds.append(rnd)
        if progress is not None:
            progress.end_round(rnd)
        check_round(rnd, driver, progress, keep_logs=keep_logs)
        quiet_streak = quiet_streak + 1 if rnd.quiet else 0
        if quiet_streak >= quiet_rounds:
            result.stable = True
            break
        if quiet_streak + (limit - index) < quiet_rounds:
            break  # the rounds left cannot give the evidence any more
    result.work_events = work_events(events_path)
    if not result.stable and until_stable:
        last = next((r.summary for r in reversed(result.rounds) if not r.quiet),
                    result.rounds[-1].summary)
        raise NotStable(
            f"not stable after {len(result.rounds)} of --max-rounds {max_rounds} rounds "
            f"({quiet_rounds} quiet rounds in a row needed, --quiet-rounds; the last round that "
            f"compiled: {last.compiles} compiles, "
            f"{last.autotunes} autotune benchmarks, {last.helper_builds} helper builds: "
            f"{', '.join(last.kernels[:5]) or '-'}); the warmup is not deterministic: "
            "raise --max-rounds, or --no-until-stable packs what one round compiles")
    return result

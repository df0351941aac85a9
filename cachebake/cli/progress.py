"""Live progress on stderr (rich): build and verify rounds, and pack's bytes.

Both draw on the command's Output's stderr console (cachebake.cli.output: the Output owns
stderr), so a warning printed mid-round lands above the live line, not through it.

A cold vLLM warmup compiles for minutes; the operator should see which round is running, how
many kernels compiled or hit so far, and the last kernel, rather than a silent terminal.  On a
non-terminal stderr (CI logs) only the one-line round summaries are printed.  Packing a large
cache takes seconds to minutes (zstd -19): a bar on a terminal, nothing elsewhere.
"""

from __future__ import annotations

import time

from rich.console import Console

from cachebake.capture.events import Event


class RoundProgress:
    def __init__(self, console: Console, verb: str = "bake"):
        self.console = console
        self.verb = verb
        self.status = None
        self.counts = {"compile": 0, "cache_hit": 0, "autotune": 0, "helper_build": 0}
        self.last = ""
        self.round = 0
        self.of = 0
        self.started = 0.0

    def start_round(self, index: int, of: int) -> None:
        self.round, self.of = index, of
        self.counts = dict.fromkeys(self.counts, 0)
        self.last = ""
        self.started = time.monotonic()
        if self.console.is_terminal:
            self.status = self.console.status(self._text())
            self.status.start()

    def update(self, events: list[Event]) -> None:
        for e in events:
            self.counts[e.kind] = self.counts.get(e.kind, 0) + 1
            if e.kind != "cache_hit":
                self.last = f"{e.kind} {e.label()}"
        if self.status is not None:
            self.status.update(self._text())

    def end_round(self, rnd) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None
        s = rnd.summary
        # "quiet", not "stable": one quiet round is not the evidence (--quiet-rounds in a row
        # are; the build's summary says when the bake is stable)
        state = ("[red]failed[/]" if rnd.exit_code != 0
                 else "[green]quiet[/]" if rnd.quiet else "[yellow]compiled[/]")
        self.console.print(
            f"{self.verb} round {rnd.index}: {state} -- {s.compiles} compiles "
            f"({s.compile_seconds:.1f} s), {s.cache_hits} hits, {s.autotunes} autotunes "
            f"({s.autotune_seconds:.1f} s), {s.helper_builds} helper builds, "
            f"{rnd.seconds:.1f} s", highlight=False, soft_wrap=True)

    def show_tail(self, log_path: str, lines: int = 20) -> None:
        """The end of a failed round's output, so the cause is on screen, not only in a file."""
        try:
            with open(log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 16384))
                tail = f.read().decode(errors="replace").splitlines()[-lines:]
        except OSError:
            return
        if tail:
            self.console.print(f"[dim]--- last lines of {log_path} ---[/]", highlight=False)
            for line in tail:
                self.console.print(line, markup=False, highlight=False, soft_wrap=True)

    def _text(self) -> str:
        c = self.counts
        text = (f"{self.verb} round {self.round}/{self.of}: {c['compile']} compiles, "
                f"{c['cache_hit']} hits, {c['autotune']} autotunes, "
                f"{time.monotonic() - self.started:.0f} s")
        return text + (f" -- {self.last[:80]}" if self.last else "")


class PackProgress:
    """A byte bar for ``pack_artifact(progress=...)`` on a terminal; ``factory`` is None
    elsewhere (a pipe, a log, TERM=dumb), so nothing is drawn there.  Use as a context manager: the bar is
    removed whatever happens."""

    def __init__(self, console: Console, label: str = "packing"):
        self.console = console
        self.label = label
        self._bar = None

    @property
    def factory(self):
        live = self.console.is_terminal and not self.console.is_dumb_terminal
        return self._start if live else None

    def _start(self, files: int, total_bytes: int):
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn(f"{self.label} {files} files"), BarColumn(),
                             DownloadColumn(), TimeElapsedColumn(), console=self.console,
                             transient=True)
        self._bar.start()
        task = self._bar.add_task(self.label, total=max(total_bytes, 1))
        return lambda n: self._bar.advance(task, n)

    def __enter__(self) -> PackProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

"""Text views of the command reports, for people (``Output.emit(report, render=...)``).

Reports are plain dataclasses built elsewhere; nothing here computes anything.  Digests are
printed in full (they are what people paste into other tools), and a value that was not
recorded prints as ``-``, never ``None``.  Tables fold their cells to the terminal's width.
"""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cachebake.errors import printable


def safe(value) -> str:
    """``printable(value)`` with rich markup escaped: a name like ``[/x]`` or ``[link=...]``
    from an artifact or a log prints as itself, never as markup."""
    return escape(printable(value))


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def _text(value) -> str:
    if value is None or value == "" or value == {} or value == []:
        return "-"
    return str(value)


class _Fields:
    """``label  value`` lines, printed without folding: digests and paths stay whole on one
    line (what people copy), the terminal wraps them if it must."""

    def __init__(self, title: str | None = None):
        self.title = title
        self.rows: list[tuple[str, str]] = []

    def add_row(self, label: str, value: str) -> None:
        self.rows.append((label, value))

    def print(self, console: Console) -> None:
        # labels are ours (and may hold markup); titles and values carry artifact text: safe()
        if self.title:
            console.print(f"[bold]{safe(self.title)}[/]")
        width = max((len(k) for k, _ in self.rows), default=0)
        for label, value in self.rows:
            console.print(f"  {label:<{width}}  {safe(value)}", soft_wrap=True)


def _items(value) -> list:
    """``value`` if it is a list, else empty: BakeRecord types the bake section's own fields
    (cachebake.artifact.manifest: a wrong type is refused, exit 5), not what a fold records
    inside each of its entries, so those are read defensively: absent, never a crash."""
    return value if isinstance(value, list) else []


def _objs(value) -> list[dict]:
    return [v for v in _items(value) if isinstance(v, dict)]


def _long(value, keep: int = 40) -> str:
    """A long non-digest value (Triton's key is ~1.3 kB): its start and its length."""
    text = _text(value)
    return text if len(text) <= keep + 20 else f"{text[:keep]}... ({len(text)} chars; --json has it all)"


# ---------------------------------------------------------------------------- pack / inspect

def render_bake(ref, console: Console, record: dict | None = None) -> None:
    m = ref.manifest
    fp = m.fingerprint
    t = _Fields(f"bake {m.target}")
    t.add_row("image manifest", _text(ref.manifest_digest or None))
    t.add_row("layer", f"{m.layer.digest}  {m.layer.media_type}")
    raw = m.layer.uncompressed_size
    t.add_row("size", f"{_mb(m.layer.size)} compressed / {_mb(raw)} raw"
              f" ({100 * m.layer.size / max(raw, 1):.1f}%), {m.layer.files} files, "
              f"{m.layer.compression}; every blob verified")
    t.add_row("roles", ", ".join(m.roles) + f"  (layer root {m.layer_root})")
    for key in ("triton_version", "python_tag", "gpu_name", "torch_version", "vllm_version"):
        t.add_row(key, _text(getattr(fp, key)))
    t.add_row("triton_key", _long(fp.triton_key))
    t.add_row("ptxas", _text(" ".join(str(fp.ptxas or "").split()) or None))
    t.add_row("env", ", ".join(f"{k}={v}" for k, v in fp.env.items()) or "(none set)")
    t.add_row("baked at", _text(", ".join(f"{k}={v}" for k, v in fp.bake_paths.items())))
    s = m.inventory.summary()
    t.add_row("inventory", f"{s['kernels']} kernels ({s['kernel_names']} names), {s['autotune']} "
              f"autotune results, {s['helpers']} helpers, {s['dropped']} dropped")
    bake = m.bake
    if bake.rounds is not None:
        t.add_row("rounds", f"{bake.rounds} ({'stable' if bake.stable else 'NOT stable'}"
                  + (f", {bake.quiet_rounds} quiet in a row required" if bake.quiet_rounds is not None else "")
                  + ")")
    for key in ("driver", "compiles", "compile_seconds_moved", "autotune_seconds_moved"):
        if getattr(bake, key) is not None:
            t.add_row(key, _text(getattr(bake, key)))
    if record:
        on = f"recorded on {', '.join(record['targets'])}" if record["targets"] else "no target recorded"
        t.add_row("compile record", f"{record['compiles']} launches of {record['kernels']} kernels, "
                  f"{record['autotune']} autotune keys ({record['autotune_candidates']} candidates), "
                  f"{on}; {record['unverified']} not verified")
    how = (bake.unverified_on_target or {}).get("how")
    if how:
        t.add_row("[yellow]unverified[/]", f"made by {how}, not on a {m.target} GPU: run `cachebake verify` there")
    for fold in bake.folded or ():  # serve-time misses compiled in (replay --misses)
        carried = sum(a.get("result") == "carried" for a in _objs(fold.get("autotune")))
        t.add_row("folded", f"{len(_items(fold.get('kernels')))} kernels and {carried} autotune results "
                  f"from {fold.get('logs')} miss logs at {fold.get('at')} onto layer "
                  f"{str(fold.get('base_layer_digest'))}; {len(_items(fold.get('failed')))} not folded")
    t.print(console)
    names: dict[str, int] = {}
    for k in m.inventory.kernels:
        names[k.name] = names.get(k.name, 0) + 1
    if names:
        kt = Table("kernel", "specializations", title="kernels", title_justify="left")
        for name, n in sorted(names.items(), key=lambda kv: (-kv[1], kv[0])):
            kt.add_row(safe(name), str(n))
        console.print(kt)
    # The bake record names the engine step that compiled each specialization (kernels driver).
    by_step = [(e.get("kernel", "?"), e["step"]) for e in m.bake.events or ()
               if e.get("kind") == "compile" and e.get("step")]
    if by_step:
        st = Table("kernel", "engine step that needs it", title="specializations by engine step")
        for kernel, step in by_step:
            st.add_row(safe(kernel), safe(step))
        console.print(st)
    for d in m.inventory.dropped:
        console.print(f"[yellow]dropped[/] {safe(d.get('path'))}: {safe(d.get('reason'))}")


def render_inspect(report, console: Console) -> None:
    """Every value from the artifact through ``safe``: names, paths, versions, env, steps."""
    console.print(f"[bold]{safe(report.artifact)}[/] ({safe(report.kind)}): targets "
                  f"{safe(', '.join(report.targets)) or '-'}")
    for ref in report.bakes:
        render_bake(ref, console, report.records.get(ref.target))


def render_pack(report, console: Console) -> None:
    where = f"[bold]{escape(str(report.out))}[/] (targets: {', '.join(report.targets)})"
    if report.status == "unchanged":  # packed again to the same bytes: nothing was replaced
        console.print(f"the {report.target} bake in {where} is unchanged: the same image digest")
    else:
        verb = {"created": "packed", "added": "added", "replaced": "replaced"}.get(report.status, report.status)
        console.print(f"{verb} the {report.target} bake in {where}")
    if report.replaced_manifest_digest:
        console.print(f"  replaced image {report.replaced_manifest_digest}")
    m = report.manifest
    console.print(f"  image {report.manifest_digest}")
    console.print(f"  layer {m.layer.digest}  {_mb(m.layer.size)} of {_mb(m.layer.uncompressed_size)} raw, "
                  f"{len(m.inventory.kernels)} kernels, {len(m.inventory.autotune)} autotune results")
    for d in m.inventory.dropped:
        console.print(f"  [yellow]dropped[/] {escape(d['path'])}: {escape(d['reason'])}")


# ---------------------------------------------------------------------------- build / verify

def render_build(report, console: Console) -> None:
    t = report.rounds.total
    state = ("stable" if report.stable
             else "NOT stable: one round, --no-until-stable" if not report.rounds.until_stable
             else "NOT stable")
    console.print(f"baked [bold]{escape(str(report.plan.out))}[/] ({report.pack.target}, "
                  f"{report.pack.status}): {len(report.rounds.rounds)} rounds ({state}), "
                  f"{t.compiles} compiles ({t.compile_seconds:.1f} s) and {t.autotunes} autotunes "
                  f"({t.autotune_seconds:.1f} s) moved to build time, {len(t.kernels)} kernels")
    console.print(f"  layer {report.pack.layer_digest}  {_mb(report.pack.manifest.layer.size)}")
    root = escape(str(report.plan.root))
    if report.root_cleared:
        console.print(f"  removed the baked caches under {root}: they are in the artifact "
                      f"(`cachebake install {escape(str(report.plan.out))} --to DIR` serves them; "
                      "--keep-root keeps them)")
    else:
        console.print(f"  kept the caches under {root} (the next build there needs --reuse-root "
                      "or an empty root)")


def render_verify(report, console: Console) -> None:
    for line in report.lines():
        console.print(line, markup=False)
    if report.ok:
        s = report.round.summary
        console.print(f"verified {escape(report.cache)}: 0 compiles, {s.cache_hits} cache hits")


def render_compile_check(report, console: Console) -> None:
    """``verify --check-only``: one line when it would hit; a mismatch is the error's to say
    (its line and one detail line per differing factor, on stderr, exit 4)."""
    if report.ok:
        console.print(printable(report.summary()), markup=False)


# ---------------------------------------------------------------------------- install

def render_install(report, console: Console) -> None:
    if report.status == "already installed" or report.status.startswith("would "):
        console.print(f"{report.status}: {report.layer_digest} ({report.target}) in "
                      f"{escape(report.to)}")
        for line in report.damage:
            console.print(f"  damaged: {line}", markup=False)
    else:
        console.print(f"{report.status}: {report.layer_digest} ({report.target}) in "
                      f"{escape(report.to)}: {report.files} files, {report.file_bytes / 1e6:.1f} MB, "
                      f"{report.groups_relocated} group files and {report.relocated.get('vllm', 0)} "
                      f"vllm cache files relocated, {report.seconds:.2f} s"
                      f"{'' if report.synced else ' (not synced to disk: --no-sync)'}")
    # shell words (as serve-args' export lines); the values come from the artifact (and its
    # compile identity): through printable, so no C0 or C1 control (U+009B, a CSI) reaches the
    # terminal; serve-args --env-file and --json keep them exact
    for k, v in report.env.items():
        console.print(printable(f"{k}={shlex.quote(v)}"), markup=False)


# ---------------------------------------------------------------------------- recipes etc.

WIDE = 140  # below this many columns, recipes are listed as blocks instead of a table


def flag_lines(flags: list[str], width: int) -> list[str]:
    """``vllm serve`` flags on lines of at most ``width`` characters, broken only between one
    flag (with its values) and the next: never inside a flag, never between a flag and its
    value (a flag longer than ``width`` gets a line of its own)."""
    groups: list[str] = []
    for word in flags:
        if word.startswith("--") or not groups:
            groups.append(word)
        else:
            groups[-1] += " " + word
    lines: list[str] = []
    for group in groups:
        if lines and len(lines[-1]) + 1 + len(group) <= width:
            lines[-1] += " " + group
        else:
            lines.append(group)
    return lines


def render_recipes(report, console: Console) -> None:
    """A table on a wide terminal; a block per recipe otherwise.  Serve args are what people
    copy into `--serve-args` or a `vllm serve` line: piped, each recipe's flags are one whole
    line (rich would fold them at 80 columns, mid-flag); on a terminal they are broken only
    between flags (``flag_lines``)."""
    from cachebake.vllm.serveargs import serve_args_to_flags

    rows = []
    for r in report.recipes:
        m = r.mamba_shapes()
        shapes = (f"{m.get('heads', '?')}x{m.get('head_dim', '?')} / {m.get('groups', '?')} / "
                  f"{m.get('d_state', '?')} / {m.get('conv', '?')} / {m.get('chunk', '?')} "
                  f"({m.get('mamba_layers', '?')} Mamba layers)")
        name = r.ref + (" *" if any("UNVERIFIED" in n for n in r.notes) else "")
        rows.append((name, r.model_id or "-", r.architecture, shapes, serve_args_to_flags(r.serve_args)))
    title = "cachebake recipes (--model NAME[:VARIANT])"
    if console.is_terminal and console.width >= WIDE:
        table = Table(title=title, title_justify="left")
        table.add_column("recipe", no_wrap=True)
        table.add_column("model", overflow="fold")
        table.add_column("architecture", overflow="fold")
        table.add_column("Mamba heads x dim / groups / state / conv / chunk", overflow="fold")
        table.add_column("default serve args", ratio=1)
        for *cells, flags in rows:
            # one line per flag group: the table folds between them, not inside a flag
            table.add_row(*map(escape, cells), escape("\n".join(flag_lines(flags, 0))) or "-")
        console.print(table)
    else:
        # soft_wrap: rich never folds these lines; the terminal (if any) wraps what it must
        console.print(f"[bold]{title}[/]", soft_wrap=True)
        indent = "    "
        for name, model, arch, shapes, flags in rows:
            console.print(f"[bold]{escape(name)}[/]  {escape(model)}  {escape(arch)}", soft_wrap=True)
            console.print(f"  Mamba heads x dim / groups / state / conv / chunk: {shapes}", soft_wrap=True)
            if not console.is_terminal:
                console.print(f"  serve args: {escape(' '.join(flags) or '-')}", soft_wrap=True)
                continue
            console.print("  serve args:", soft_wrap=True)
            for line in flag_lines(flags, max(console.width - len(indent), 20)) or ["-"]:
                console.print(indent + escape(line), soft_wrap=True)
    console.print("* some hyperparameters unverified: see the recipe's notes "
                  "(cachebake recipes --json)", soft_wrap=True)


def render_serve_command(cmd, console: Console) -> None:
    """The shell text, byte for byte where a program reads it (``eval "$(...)"``: rich would
    drop \\r and other characters from a quoted value); on a terminal, each line
    ``printable``, since a quoted value may still hold ESC."""
    text = cmd.shell()
    if console.is_terminal:
        text = "\n".join(printable(line) for line in text.split("\n"))
    console.file.write(text + "\n")
    console.file.flush()


def render_fingerprint(report, console: Console) -> None:
    fp = report.fingerprint
    if report.out:
        console.print(f"wrote {escape(report.out)}: {fp.target}, triton {_text(fp.triton_version)}, "
                      f"GPU {_text(fp.gpu_name)}")
        return
    t = _Fields(f"fingerprint {fp.target}")
    for key, value in fp.to_json().items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or None
        text = " ".join(str(value).split()) if value is not None else None
        t.add_row(key, _long(text) if key == "triton_key" else _text(text))
    t.print(console)


# ---------------------------------------------------------------------------- replay / misses
# Every value below that came from a record, a miss log or an artifact (kernel names, keys,
# specializations, replicas, times, problems) goes through ``safe`` (inside markup) or
# ``printable`` (markup=False): a log is written by serving pods, which may be compromised.

def render_replay(report, console: Console) -> None:
    r = report.result
    console.print(f"replayed {safe(report.source)} for {r.target} into {safe(report.out)}: "
                  f"{r.compiled} compiled ({r.already} already there, {r.derived} autotune "
                  f"candidates added), {r.helpers_built} launcher helpers, {r.autotune_carried} "
                  f"autotune results carried ({r.autotune_not_carried} measured on another target, "
                  f"not carried); {r.jobs} jobs, {r.seconds:.1f} s wall, {r.compile_seconds:.1f} s "
                  "compiling", highlight=False)
    for line in r.problems:
        console.print(f"  problem: {printable(line)}", markup=False, highlight=False)


def _render_vllm_rounds(report, console: Console) -> None:
    for c in report.vllm_in_base:
        console.print(f"  in base   {safe(c['dir'])}", highlight=False)
    for r in report.vllm:
        from cachebake.vllm.serveargs import serve_args_to_flags

        console.print(f"  vllm round ({safe(r['status'])}): {len(r['units'])} torch.compile dirs, "
                      f"logged flags {safe(' '.join(serve_args_to_flags(r['serve_args'])))}",
                      highlight=False)
        console.print(f"    {printable(' '.join(shlex.quote(a) for a in r['argv']))}", highlight=False,
                      markup=False)
        if r.get("left_out"):
            console.print(f"    left out (serving only, never applied): "
                          f"{safe(' '.join('--' + f.replace('_', '-') for f in r['left_out']))}", highlight=False)
        for u in r["units"]:
            state = ("packed" if u["dir"] in r["packed"] else "NOT reproduced by the round"
                     if r["status"] == "built" else "to regenerate")
            console.print(f"    {safe(u['dir'])}: {state}", highlight=False)


def render_fold(report, console: Console) -> None:
    if report.dry_run:
        console.print(f"plan (dry run, nothing written): {len(report.planned)} kernel misses to "
                      f"compile for {report.target}, {len(report.vllm)} vLLM build rounds, from "
                      f"{len(report.logs)} logs", highlight=False)
        for c in report.planned:
            console.print(f"  compile   {safe(c['kernel'])}  {safe(c['specialization'])}", highlight=False)
        _render_vllm_rounds(report, console)
        for f in report.failed:
            console.print(f"  [yellow]not folded[/] {safe(f['kernel'])} ({safe(str(f['key'])[:12])}): "
                          f"{safe(f['reason'])}", highlight=False)
        return
    carried = sum(a["result"] == "carried" for a in report.autotune)
    console.print(f"folded {len(report.compiled)} kernel misses and {carried} autotune results "
                  f"from {len(report.logs)} logs into [bold]{safe(report.out)}[/] ({report.target}, "
                  f"layer {report.layer_digest[:19]}; {report.helpers_built} launcher helpers "
                  f"built, {report.jobs} jobs)", highlight=False)
    skipped = [(report.log_lines.get(k, 0), k) for k in ("unreadable", "foreign", "malformed")]
    if any(n for n, _ in skipped):
        console.print("  lines skipped: " + ", ".join(f"{n} {k}" for n, k in skipped if n), highlight=False)
    for path in report.log_lines.get("skipped_files", []):
        console.print(f"  skipped   {safe(path)}", highlight=False)
    for c in report.compiled:
        console.print(f"  compiled  {safe(c['kernel'])}  {safe(c['specialization'])}  "
                      f"(missed {c['count']}x on {len(c['replicas'])} replicas)", highlight=False)
    for c in report.in_base:
        console.print(f"  in base   {safe(c['kernel'])}  {safe(c['specialization'])}", highlight=False)
    for a in report.autotune:
        what = ("result carried from serve time" if a["result"] == "carried"
                else "in the base" if a["result"] == "in base"
                else "NEEDS A BENCHMARK on the target")
        console.print(f"  autotune  {safe(a['kernel'])}  tuning key {safe(a['tuning_key'])}: {what}",
                      highlight=False)
    for h in report.helpers:
        where = "built here" if h["folded"] else "built by gcc at first launch on the target"
        console.print(f"  helper    {safe(h['file'])}: {where}", highlight=False)
    _render_vllm_rounds(report, console)
    for line in report.problems:
        console.print(f"  [yellow]problem[/] {safe(line)}", highlight=False)
    for f in report.failed:
        console.print(f"  [yellow]not folded[/] {safe(f['kernel'])} ({safe(str(f['key'])[:12])}): "
                      f"{safe(f['reason'])}", highlight=False)


def _short_time(iso: str) -> str:
    """``2026-11-30T20:02:12.920Z`` -> ``11-30 20:02:12`` for the list (JSON keeps it all)."""
    return iso[5:19].replace("T", " ") if len(iso) >= 19 else iso


def render_misses(report, console: Console) -> None:
    """One entry per group, two lines each: fits any terminal width."""
    skipped = [(report.unreadable, "unreadable"), (report.foreign, "foreign"),
               (report.malformed, "malformed")]
    notes = ", ".join(f"{n} {what}" for n, what in skipped if n)
    console.print(f"{report.misses} misses of {len(report.groups)} kernels/specializations from "
                  f"{len(report.replicas)} replicas in {len(report.logs)} logs"
                  + (f"; lines skipped: {notes}" if notes else ""), highlight=False)
    for path in report.skipped:
        console.print(f"  skipped {safe(path)}", highlight=False)
    if report.recorded is not None:
        r = report.recorded
        console.print(f"vLLM cache {safe(r['cache'])}: {len(r['logged'])} new torch.compile dirs logged "
                      f"to {safe(r['log'])} ({r['already']} already there, {r['baked']} baked, bake's "
                      f"dirs from {safe(r['inventory'])})", highlight=False)
    for g in report.groups:
        kind = "" if g.kind == "kernel" else f" ({safe(g.kind)})"
        console.print(f"{g.count:>5}x  [bold]{safe(g.kernel)}[/]{kind}  on {len(g.replicas)} "
                      f"replica{'s' * (len(g.replicas) != 1)}, {safe(_short_time(g.first_seen))} .. "
                      f"{safe(_short_time(g.last_seen))} UTC, {g.seconds:.2f} s", highlight=False)
        console.print(f"        {printable(g.specialization)}", highlight=False, markup=False)

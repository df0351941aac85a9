"""Human-readable rendering of reports with rich.  Reports are plain dataclasses built
elsewhere; nothing here computes anything."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

console = Console()


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def render_bake(ref) -> None:
    m = ref.manifest
    fp = m.fingerprint
    t = Table(title=f"bake {m.target}", show_header=False, box=None)
    t.add_row("image manifest", ref.manifest_digest)
    t.add_row("layer", f"{m.layer.digest}  {m.layer.media_type}")
    raw = m.layer.uncompressed_size
    t.add_row("size", f"{_mb(m.layer.size)} compressed / {_mb(raw)} raw"
              f" ({100 * m.layer.size / max(raw, 1):.1f}%), {m.layer.files} files, {m.layer.compression}")
    t.add_row("roles", ", ".join(m.roles) + f"  (layer root {m.layer_root})")
    for key in ("triton_version", "python_tag", "gpu_name", "torch_version", "vllm_version"):
        t.add_row(key, str(fp.get(key)))
    t.add_row("triton_key", str(fp.get("triton_key"))[:60] + "...")
    t.add_row("ptxas", " ".join(str(fp.get("ptxas")).split())[-70:])
    t.add_row("env", ", ".join(f"{k}={v}" for k, v in (fp.get("env") or {}).items()) or "(none set)")
    t.add_row("baked at", ", ".join(f"{k}={v}" for k, v in (fp.get("bake_paths") or {}).items()))
    s = m.inventory.summary()
    t.add_row("inventory", f"{s['kernels']} kernels ({s['kernel_names']} names), {s['autotune']} autotune results, "
              f"{s['helpers']} helpers, {s['dropped']} dropped")
    for key in ("rounds", "compiles", "compile_seconds", "autotune_seconds"):
        if key in m.bake:
            t.add_row(key, str(m.bake[key]))
    console.print(t)
    names: dict[str, int] = {}
    for k in m.inventory.kernels:
        names[k.name] = names.get(k.name, 0) + 1
    if names:
        kt = Table("kernel", "specializations", title="kernels")
        for name, n in sorted(names.items(), key=lambda kv: (-kv[1], kv[0])):
            kt.add_row(name, str(n))
        console.print(kt)
    # The bake record names the engine step that compiled each specialization (kernels driver).
    by_step = [(e.get("kernel", "?"), e["step"]) for e in m.bake.get("events", [])
               if e.get("kind") == "compile" and e.get("step")]
    if by_step:
        st = Table("kernel", "engine step that needs it", title="specializations by engine step")
        for kernel, step in by_step:
            st.add_row(kernel, step)
        console.print(st)
    for d in m.inventory.dropped:
        console.print(f"[yellow]dropped[/] {d['path']}: {d['reason']}")


def render_inspect(report) -> None:
    console.print(f"[bold]{report.path}[/]: targets {', '.join(report.targets)}")
    for ref in report.bakes:
        render_bake(ref)


def render_pack(report) -> None:
    console.print(f"packed {report.target} into [bold]{report.out}[/] (targets: {', '.join(report.targets)})")
    m = report.manifest
    console.print(f"  layer {m.layer.digest}  {_mb(m.layer.size)} of {_mb(m.layer.uncompressed_size)} raw, "
                  f"{len(m.inventory.kernels)} kernels, {len(m.inventory.autotune)} autotune results")
    for d in m.inventory.dropped:
        console.print(f"  [yellow]dropped[/] {d['path']}: {d['reason']}")

"""``cachebake`` diff, merge, bake-job: a fleet's bakes compared, combined, and baked on its cluster."""

from __future__ import annotations

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import GPU_TARGET, IMAGE_NAME, SECRET_NAME
from cachebake.cli.render import safe


@main.command()
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path())
@click.option("--target", type=GPU_TARGET, help="Compare only this GPU target's bakes.")
@click.option("--target-a", type=GPU_TARGET, help="Compare A's bake for this target ...")
@click.option("--target-b", type=GPU_TARGET, help="... with B's bake for this one.")
@JSON_OPTION
def diff(a, b, target, target_a, target_b, as_json):
    """Compare two artifacts' bakes, entry by entry, and say why.

    Per role: kernels (by name and specialization), autotune results (winner), helpers, vLLM's
    torch.compile dirs; and the key factors that differ (Triton key, ptxas, GPU, environment,
    vLLM compile factors, torch key, model, serve flags).  Exit 0: equal; 14: different;
    15: no pair of bakes to compare."""
    from cachebake.errors import Different
    from cachebake.install.diff import diff_artifacts

    report = diff_artifacts(a, b, target=target, target_a=target_a, target_b=target_b)
    output(as_json).emit(report, render=render_diff)
    if not report.equal:
        raise Different(report.summary())


@main.command()
@click.argument("artifacts", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(),
              help="The merged artifact (new, empty, or an artifact it replaces).")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="For docker:// sources: require HTTPS (default: yes, except loopback registries).")
@click.option("--authfile", type=click.Path(dir_okay=False), help="For docker:// sources: registry credentials.")
@JSON_OPTION
def merge(artifacts, out, tls_verify, authfile, as_json):
    """Merge artifacts into one: one bake per GPU target.

    ARTIFACTS: artifact dirs, or docker://HOST/REPO:sm_XX as the bake Jobs pushed them.  Every
    blob is verified; blobs the bakes share are stored once; two bakes for one target are
    refused (exit 3).  `install` picks the local GPU's bake; `push` writes one tag per target."""
    import shutil
    import tempfile
    from pathlib import Path

    from cachebake.artifact.merge import merge_artifacts
    from cachebake.distribute.registry import RegistryOptions, fetch, is_reference, parse_reference
    from cachebake.errors import BadInput

    tmp = None
    try:
        sources = []
        for i, src in enumerate(artifacts):
            if not is_reference(src):
                sources.append(src)
                continue
            ref = parse_reference(src)  # a pull names its target by the tag: REPO:sm_90
            if not ref.tag:
                raise BadInput(f"{src}: name the bake's tag (REPO:sm_90): merge takes every target given")
            tmp = tmp or Path(tempfile.mkdtemp(prefix="cachebake-merge-"))
            layout = tmp / str(i) / "layout"
            layout.parent.mkdir()
            fetch(src, layout, target=ref.tag, options=RegistryOptions(tls_verify, authfile))
            sources.append(layout)
        report = merge_artifacts(sources, out)
        for key, bake in report.bakes.items():  # the reference, not the removed temp layout
            i = next((n for n, s in enumerate(sources) if str(s) == bake["source"]), None)
            if i is not None:
                bake["source"] = artifacts[i]
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    output(as_json).emit(report)


def _gpu_node(_ctx, _param, values):
    from cachebake.distribute.bakejob import GPUNode

    try:
        return [GPUNode.parse(v) for v in values]
    except Exception as e:  # BadInput: click's own refusal, exit 2
        raise click.BadParameter(str(e)) from None


@main.command("bake-job", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--gpu", "gpus", multiple=True, required=True, callback=_gpu_node, metavar="PRODUCT=TARGET",
              help="A GPU of the fleet: its nvidia.com/gpu.product label (GPU Feature Discovery) and "
                   "target, e.g. NVIDIA-H200=sm_90.  Repeat for each GPU type.")
@click.option("--model", "models", multiple=True, required=True,
              help="A bundled recipe to bake (see `cachebake recipes`).  Repeat for each model.")
@click.option("--builder-image", required=True, type=IMAGE_NAME,
              help="An image with vLLM and cachebake (and skopeo, for the push).")
@click.option("--repository", required=True,
              help="docker://HOST/PATH: each recipe's bake is pushed to PATH/RECIPE:sm_XX.")
@click.option("--driver", type=click.Choice(["vllm", "kernels", "command"]), default="vllm", show_default=True,
              help="command: BUILD_ARGS hold the warmup after a second -- (-- [OPTIONS] -- CMD...).")
@click.option("--gpus-per-bake", type=click.IntRange(min=1), default=1, show_default=True,
              help="nvidia.com/gpu of each bake (its tensor parallel size).")
@click.option("--pull-secret", type=SECRET_NAME,
              help="dockerconfigjson Secret: the builder image's pull and the push's credentials.")
@click.option("--tls-verify/--no-tls-verify", default=None, help="The push's registry TLS.")
@click.option("--deadline", type=click.IntRange(min=60), default=4 * 3600, show_default=True,
              help="activeDeadlineSeconds of each Job.")
@click.option("--name-prefix", default="cachebake-bake", show_default=True, help="Job names' prefix.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
              help="yaml (a multi-document stream; default where PyYAML is installed) or json (a v1 List).")
@JSON_OPTION
@click.argument("build_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- BUILD_ARGS...]")
def bake_job(gpus, models, builder_image, repository, driver, gpus_per_bake, pull_secret, tls_verify,
             deadline, name_prefix, fmt, as_json, build_args):
    """Write Kubernetes Jobs that bake each GPU x recipe.

    Each Job runs `cachebake build` on a node of its GPU (nodeSelector nvidia.com/gpu.product)
    and pushes the bake to REPOSITORY/RECIPE:sm_XX.  BUILD_ARGS after -- go to `cachebake
    build` as they are (e.g. --max-rounds 4); with --driver command, the warmup command follows
    a second -- (`-- --max-rounds 2 -- python3 warmup.py`).  Then `cachebake merge` the tags into one
    artifact, or install docker://REPOSITORY/RECIPE (its GPU's tag)."""
    from cachebake.distribute.bakejob import BakeJobPlan, BakeJobsReport, bake_jobs, render_jobs
    from cachebake.distribute.k8s import default_format
    from cachebake.serve.command import one_line

    plan = BakeJobPlan(builder_image=builder_image, repository=repository, gpus=list(gpus),
                       recipes=list(models), driver=driver, gpu_count=gpus_per_bake,
                       build_args=list(build_args), pull_secret=pull_secret, tls_verify=tls_verify,
                       deadline=deadline, prefix=name_prefix)
    jobs, notes = bake_jobs(plan)
    if fmt is None:
        fmt, why = default_format()
        if why:
            notes.append(why)
    out = output(as_json)
    out.emit(BakeJobsReport(render_jobs(jobs, notes, fmt), jobs, notes))
    for note in notes:
        out.note(one_line(note))

# ---------------------------------------------------------------------------- diff

def _val(value, limit: int = 70) -> str:
    """One value, one line; a long one cut, with a hash of the whole so two that share a
    prefix (Triton keys) still show as different."""
    import hashlib

    text = value if isinstance(value, str) else "-" if value is None else repr(value)
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = f"{text[:limit - 24]}... (sha256 {hashlib.sha256(text.encode()).hexdigest()[:10]})"
    return safe(text)


MAX_FACTORS_SHOWN = 20  # in text; --json has them all


def _entry(e) -> str:
    from cachebake.install.diff import short_spec

    spec = short_spec(e.detail.get("specialization")) if e.kind == "kernel" else ""
    key = e.detail.get("tuning_key") if e.kind == "autotune" else None
    return (f"{safe(e.role)} {safe(e.kind)} {safe(e.name)}" + (f" [{safe(spec)}]" if spec else "")
            + (f" {_val(key, 50)}" if key is not None else ""))


def render_diff(report, console) -> None:
    """Factors first (the why), then each role's entries; every value from the artifacts
    through ``safe``."""
    if report.equal:
        console.print(f"[green]equal[/]: {safe(report.a)} and {safe(report.b)} hold the same bakes")
        return
    for t in report.only_a:
        console.print(f"[red]- bake {safe(t)}[/] only in A")
    for t in report.only_b:
        console.print(f"[green]+ bake {safe(t)}[/] only in B")
    for d in report.bakes:
        pair = safe(d.target_a) + ("" if d.target_a == d.target_b else f" vs {safe(d.target_b)}")
        if d.equal:
            console.print(f"[bold]{pair}[/]: equal")
            continue
        same = ("; every entry the same (one layer)" if d.same_layer else
                "".join(f", {n} {safe(r)} same" for r, n in sorted(d.same.items())))
        console.print(f"[bold]{pair}[/]: {len(d.added)} added, {len(d.removed)} removed, "
                      f"{len(d.changed)} changed{same}")
        if d.factors:
            console.print("  key factors that differ:")
        for f in d.factors[:MAX_FACTORS_SHOWN]:
            name = safe(f.factor) if f.factor == f.category else f"{safe(f.category)}: {safe(f.factor)}"
            console.print(f"    {name}: {_val(f.a)} -> {_val(f.b)}")
        if len(d.factors) > MAX_FACTORS_SHOWN:
            console.print(f"    ... {len(d.factors) - MAX_FACTORS_SHOWN} more (--json lists them all)")
        for c in d.changed:
            console.print(f"  [yellow]~ {_entry(c.a)}[/] "
                          f"({safe(', '.join(c.what))}): {safe(c.a.key[:24])} -> {safe(c.b.key[:24])}, "
                          f"{c.a.bytes} -> {c.b.bytes} B; why: {safe(', '.join(c.why[:6]))}"
                          + (" ..." if len(c.why) > 6 else ""))
            if "winner" in c.what:
                console.print(f"      winner {_val(c.a.detail.get('winner'))} -> {_val(c.b.detail.get('winner'))}")
        for e in d.removed:
            console.print(f"  [red]- {_entry(e)}[/] {safe(e.key[:24])} {e.bytes} B")
        for e in d.added:
            console.print(f"  [green]+ {_entry(e)}[/] {safe(e.key[:24])} {e.bytes} B")

"""``cachebake`` pack, inspect, fingerprint: make an artifact, look inside one, and describe the serving side."""

from __future__ import annotations

import os

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET, ROLE_DIR
from cachebake.errors import Interrupted


@main.command()
@click.argument("roots", nargs=-1, required=True, type=ROLE_DIR, metavar="[ROLE=]CACHE_DIR...")
@click.option("--out", "out", required=True, type=click.Path(),
              help="Artifact directory (an OCI image layout); an existing artifact gains this "
                   "target, or has this target's bake replaced.")
@click.option("--target", type=GPU_TARGET,
              help="GPU target, e.g. sm_90; must match the cache's kernels (default: theirs, "
                   "else the visible GPU).")
@click.option("--layer-root", type=ABSOLUTE_PATH,
              help="Absolute path the server mounts the cache at (default /var/cache/cachebake).")
@click.option("--prune-ir", is_flag=True, help="Drop .ttir/.ttgir/.llir/.ptx: ~3x smaller, kernels still hit.")
@JSON_OPTION
def pack(roots, out, target, layer_root, prune_ir, as_json):
    """Pack cache directories into an artifact.

    Roles: triton=, vllm=, flashinfer=, inductor= (a bare DIR is triton)."""
    out_ = output(as_json)
    report = None
    try:
        from cachebake.artifact.pack import pack_artifact
        from cachebake.cli.progress import PackProgress
        from cachebake.cli.render import render_pack

        with PackProgress(out_.err_console) as bar:
            report = pack_artifact(list(roots), out, target=target, layer_root=layer_root,
                                   prune_ir=prune_ir, progress=bar.factory)
        out_.emit(report, render=render_pack)
    except KeyboardInterrupt:  # outside pack_artifact, which says what it left itself
        if report is None:
            raise Interrupted(f"nothing written: {os.path.abspath(out)} is as it was") from None
        raise Interrupted(f"{report.out} holds the new artifact; only its report was cut short") from None


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--target", type=GPU_TARGET, help="Show (and verify) only this GPU target's bake.")
@JSON_OPTION
def inspect(artifact, target, as_json):
    """Verify an artifact and show what it holds.

    Verify every blob of ARTIFACT and show its fingerprint, kernel inventory, sizes and
    digests.  ARTIFACT: an artifact dir, an OCI layout, or a .tar.zst layer with its
    cachebake.json beside it."""
    from cachebake.cli.inspect import inspect_artifact
    from cachebake.cli.render import render_inspect

    output(as_json).emit(inspect_artifact(artifact, target), render=render_inspect)


@main.command()
@click.option("--target", type=GPU_TARGET, help="GPU target, e.g. sm_90 (default: the visible GPU).")
@click.option("--out", type=click.Path(dir_okay=False),
              help="Also write the fingerprint (what `install --fingerprint` reads) to this file.")
@click.option("--gpu-from-torch", is_flag=True,
              help="When nvidia-smi and NVML find no GPU, ask torch (through Triton's driver); "
                   "imports torch, seconds.")
@JSON_OPTION
def fingerprint(target, out, gpu_from_torch, as_json):
    """Show or write this environment's fingerprint.

    Write it (--out) in the serving image at build time
    and give the file to `cachebake install --fingerprint` (an init container is not the server)."""
    from cachebake.artifact.fingerprint import current_fingerprint
    from cachebake.cli.render import render_fingerprint
    from cachebake.cli.reports import FingerprintReport

    report = FingerprintReport(current_fingerprint(target, allow_torch=gpu_from_torch))
    if out is not None:
        report.out = os.path.abspath(out)
        report.fingerprint.write(report.out)
    output(as_json).emit(report, render=render_fingerprint)

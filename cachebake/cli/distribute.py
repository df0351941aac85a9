"""``cachebake`` push, image, k8s: ship a bake through registries, Docker images and Kubernetes."""

from __future__ import annotations

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET, IMAGE_NAME, K8S_NAME, QUANTITY, SECRET_NAME


@main.command("image")
@click.argument("artifact", type=click.Path())
@click.option("--tag", required=True, help="Image name to build, e.g. registry.example/bakes/nemotron:sm_90.")
@click.option("--target", type=GPU_TARGET, help="The GPU target's bake to use (default: the only one).")
@click.option("--root", type=ABSOLUTE_PATH, help="Where the tree sits in the image (default: the bake's serving root).")
@click.option("--push", is_flag=True, help="Push the image through the daemon after building it.")
@JSON_OPTION
def image_cmd(artifact, tag, target, root, push, as_json):
    """Build the cache image (FROM scratch) in a Docker daemon.

    FROM scratch, ARTIFACT installed at the serving
    root, for `COPY --from=TAG /var/cache/cachebake /var/cache/cachebake` in a serving Dockerfile."""
    from cachebake.distribute.image import build_cache_image

    output(as_json).emit(build_cache_image(artifact, tag, target=target, root=root, push=push))


@main.command()
@click.argument("artifact", type=click.Path())
@click.argument("reference")
@click.option("--target", type=GPU_TARGET, help="Push only this GPU target's bake (needed when REFERENCE has a tag "
              "and the artifact holds several).")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="Require HTTPS (default: yes, except loopback registries).")
@click.option("--authfile", type=click.Path(dir_okay=False),
              help="Registry credentials (docker config.json format; default: skopeo's search).")
@JSON_OPTION
def push(artifact, reference, target, tls_verify, authfile, as_json):
    """Push an artifact's bakes to a registry.

    REFERENCE is docker://HOST/REPO[:TAG] (no tag: one
    tag per GPU target, e.g. :sm_90)."""
    from cachebake.distribute.registry import RegistryOptions, push_artifact

    report = push_artifact(artifact, reference, target=target,
                           options=RegistryOptions(tls_verify, authfile))
    output(as_json).emit(report)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--artifact", required=True,
              help="The bake: docker://HOST/REPO[:TAG|@DIGEST] as `cachebake push` printed it "
                   "(init: also a path inside the installer image).")
@click.option("--serving-image", required=True, type=IMAGE_NAME, help="The vLLM serving image.")
@click.option("--pattern", type=click.Choice(["init", "image-volume"]), default="init", show_default=True)
@click.option("--target", type=GPU_TARGET, required=True, help="GPU target of the bake, e.g. sm_90.")
@click.option("--installer-image", type=IMAGE_NAME, help="init: the installer image (docker/installer.Dockerfile).")
@click.option("--install-in-serving-image", is_flag=True,
              help="init: run the install in the serving image (needs cachebake there).")
@click.option("--model", help="Serve this recipe with `vllm serve` and the recipe's flags.")
@click.option("--name", default="vllm", show_default=True, type=K8S_NAME, help="Deployment/Pod and container name.")
@click.option("--root", type=ABSOLUTE_PATH, default=None, help="Where the server reads the cache (default /var/cache/cachebake).")
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="nvidia.com/gpu limit of the server.")
@click.option("--kind", type=click.Choice(["deployment", "pod"]), default="deployment", show_default=True)
@click.option("--pull-secret", type=SECRET_NAME,
              help="dockerconfigjson Secret: image pulls and the installer's registry login.")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="init: the installer's registry TLS (default: yes, except loopback registries).")
@click.option("--vllm-role/--no-vllm-role", default=True, show_default=True,
              help="image-volume: the bake has a vllm role, copied to a writable emptyDir at ROOT/vllm "
                   "(the image's roles are not visible here; `cachebake inspect` lists them).")
@click.option("--tmp-size", type=QUANTITY,
              help="init: sizeLimit of the installer's /tmp emptyDir, where the registry pull lands "
                   "(default: from --size-from, else 2Gi).")
@click.option("--size-from", type=click.Path(exists=True, file_okay=False),
              help="init: a local copy of the bake REF names (the artifact pushed): /tmp's sizeLimit "
                   "is its declared blob sizes plus 64 MiB.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def k8s(artifact, serving_image, pattern, target, installer_image, install_in_serving_image, model,
        name, root, gpus, kind, pull_secret, tls_verify, vllm_role, tmp_size, size_from, fmt, as_json, cmd):
    """Write Kubernetes manifests that give a server its bake.

    An init container filling an
    emptyDir, or (Kubernetes >= 1.35) the bake image mounted as a read-only image volume."""
    from cachebake.distribute.k8s import (ManifestReport, PodPlan, declared_bytes, manifest, render,
                                          server_command)
    from cachebake.distribute.registry import is_reference, parse_reference
    from cachebake.roles import DEFAULT_ROOT
    from cachebake.serve.command import one_line

    declared = None
    if size_from:
        pinned = parse_reference(artifact).digest if is_reference(artifact) else None
        declared = declared_bytes(size_from, target, pinned)
    plan = PodPlan(artifact=artifact, serving_image=serving_image, pattern=pattern, target=target,
                   installer_image=installer_image, install_in_serving_image=install_in_serving_image,
                   name=name, root=str(root or DEFAULT_ROOT), command=server_command(model, cmd),
                   gpus=gpus, kind=kind, pull_secret=pull_secret, tls_verify=tls_verify,
                   vllm_role=vllm_role, tmp_size=tmp_size, declared_bytes=declared)
    doc, notes = manifest(plan)
    output(as_json).emit(ManifestReport(render(doc, notes, fmt), doc, notes))
    for note in notes:
        click.echo(f"cachebake: note: {one_line(note)}", err=True)  # as the YAML comment has it

"""``cachebake`` push, image, k8s: ship a bake through registries, Docker images and Kubernetes."""

from __future__ import annotations

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import (ABSOLUTE_PATH, CLAIM_NAME, GPU_TARGET, IMAGE_NAME, K8S_NAME, QUANTITY,
                                  SECRET_NAME)


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
@click.option("--sign-key", type=click.Path(dir_okay=False),
              help="Sign each pushed image with this key (PEM, ECDSA P-256), as `cachebake sign`.")
@JSON_OPTION
def push(artifact, reference, target, tls_verify, authfile, sign_key, as_json):
    """Push an artifact's bakes to a registry.

    REFERENCE is docker://HOST/REPO[:TAG] (no tag: one
    tag per GPU target, e.g. :sm_90)."""
    from cachebake.distribute.registry import RegistryOptions, push_artifact

    options = RegistryOptions(tls_verify, authfile)
    if sign_key:  # a bad key fails before anything is pushed
        from cachebake.distribute.keys import load_private_key

        load_private_key(sign_key)
    report = push_artifact(artifact, reference, target=target, options=options)
    if sign_key:
        from cachebake.distribute.sign import sign_reference

        # by the digest pushed: what is signed is what was pushed, whatever the tag says now
        report.signed = [sign_reference(p.pinned, sign_key, options).to_dict() for p in report.pushed]
    output(as_json).emit(report)


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--artifact", required=True,
              help="The bake: docker://HOST/REPO[:TAG|@DIGEST] as `cachebake push` printed it "
                   "(init: also a path inside the installer image).")
@click.option("--serving-image", required=True, type=IMAGE_NAME, help="The vLLM serving image.")
@click.option("--pattern", type=click.Choice(["init", "image-volume"]), default="init", show_default=True)
@click.option("--target", type=GPU_TARGET, required=True, help="GPU target of the bake, e.g. sm_90.")
@click.option("--installer-image", type=IMAGE_NAME,
              help="The installer image (docker/installer.Dockerfile). init: it installs the bake; "
                   "image-volume: it copies cachebake onto the server's PYTHONPATH.")
@click.option("--install-in-serving-image", is_flag=True,
              help="init: run the install in the serving image (needs cachebake there).")
@click.option("--serving-image-has-cachebake", is_flag=True,
              help="image-volume: the serving image has cachebake (the layered cache manager), e.g. "
                   "the Dockerfile's serving-cachebake stage: no copy onto PYTHONPATH.")
@click.option("--bake", "local_bake", type=click.Path(exists=True, file_okay=False),
              help="A local copy of the bake --artifact names (the artifact pushed): the server "
                   "runs its own `vllm serve` command and environment (a --driver vllm bake); "
                   "init: /tmp's sizeLimit is its declared blob sizes plus 64 MiB.")
@click.option("--model", help="Serve this recipe with `vllm serve` and the recipe's flags.")
@click.option("--model-pvc", type=CLAIM_NAME,
              help="PersistentVolumeClaim holding the model: mounted read-only at the path "
                   "`vllm serve` reads.")
@click.option("--model-in-image", is_flag=True,
              help="The serving image has the model at the path `vllm serve` reads.")
@click.option("--model-mount", type=ABSOLUTE_PATH, default=None,
              help="A dir of yours the model volume may be mounted under, besides /models (the "
                   "only one otherwise: a --bake's model path outside both is refused, exit 5).")
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
                   "(default: from --bake, else 2Gi).")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
              help="Output format (default: yaml, or json where PyYAML is not installed).")
@click.option("--verify-key", "verify_keys", multiple=True,
              help="init: a trusted public key (PEM file) the installer verifies the bake's "
                   "signature with before installing (exit 13); image-volume: see k8s-policy.")
@click.option("--bake-job", "bake_job", is_flag=True,
              help="Write the bake matrix's Jobs instead: `cachebake bake-job`, whose options then "
                   "apply (see `cachebake bake-job --help`).")
@JSON_OPTION
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD...]")
def k8s(artifact, serving_image, pattern, target, installer_image, install_in_serving_image,
        serving_image_has_cachebake, local_bake, model, model_pvc, model_in_image, name, root, gpus,
        kind, pull_secret, tls_verify, vllm_role, tmp_size, fmt, verify_keys, as_json, cmd, model_mount=None,
        bake_job=False):
    """Write Kubernetes manifests that give a server its bake.

    An init container filling an emptyDir, or (Kubernetes >= 1.35) the bake image mounted as a
    read-only image volume.  `k8s --bake-job ...` is `cachebake bake-job ...`."""
    if bake_job:  # the command line takes it to bake-job first (cli.app.bake_job_alias)
        raise click.UsageError("--bake-job: give it before any `--` (it makes this `cachebake bake-job`)")
    from cachebake.distribute.k8s import (ManifestReport, PodPlan, default_format, manifest,
                                          read_local_bake, render, server_command)
    from cachebake.distribute.registry import is_reference, parse_reference
    from cachebake.errors import BadInput
    from cachebake.roles import DEFAULT_ROOT
    from cachebake.serve.command import one_line

    root = str(root or DEFAULT_ROOT)
    bake = None
    if local_bake:
        pinned = parse_reference(artifact).digest if is_reference(artifact) else None
        bake = read_local_bake(local_bake, target, pinned)
        layer_root = bake.facts.layer_root
        if pattern == "image-volume" and layer_root and layer_root != root:
            raise BadInput(f"--bake {one_line(local_bake)} was packed for {one_line(layer_root)} (its "
                           f"group files name it): the image volume must be mounted there, --root "
                           f"{one_line(layer_root)}")
    facts = bake.facts if bake else None
    if facts is not None and pattern == "image-volume" and vllm_role \
            and "vllm" not in (facts.recorded_roles() or ("vllm",)):
        vllm_role = False  # the image has no vllm/ to mount over: the server cannot start otherwise
    pems = ()
    if verify_keys:
        from cachebake.distribute.keys import load_public_key

        if pattern != "init":
            raise BadInput("--verify-key: the image-volume pattern has no installer to verify with; "
                           "admit signed bakes with an admission policy (cachebake k8s-policy)")
        pems = tuple(load_public_key(k).pem for k in verify_keys)
    command, notes, from_bake = server_command(model, cmd, facts)
    plan = PodPlan(artifact=artifact, serving_image=serving_image, pattern=pattern, target=target,
                   installer_image=installer_image, install_in_serving_image=install_in_serving_image,
                   name=name, root=root, command=command, gpus=gpus, kind=kind,
                   pull_secret=pull_secret, tls_verify=tls_verify, vllm_role=vllm_role,
                   tmp_size=tmp_size, declared_bytes=bake.declared_bytes if bake else None,
                   model_pvc=model_pvc, model_in_image=model_in_image,
                   serving_image_has_cachebake=serving_image_has_cachebake, bake=facts,
                   command_from_bake=from_bake, model_mount=model_mount,
                   verify_keys=pems)
    doc, more = manifest(plan)
    notes += more
    if fmt is None:
        fmt, why = default_format()
        if why:
            notes.append(why)
    out = output(as_json)
    out.emit(ManifestReport(render(doc, notes, fmt), doc, notes))
    for note in notes:
        out.note(one_line(note))  # as the YAML comment has it

"""``cachebake`` install: put a bake where the server reads it, checked and atomically."""

from __future__ import annotations

import os

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import ABSOLUTE_PATH, GPU_TARGET, NON_NEGATIVE_SECONDS, POSITIVE_SECONDS
from cachebake.distribute.registry import STALL_MIN_BYTES, STALL_TIMEOUT_S
from cachebake.errors import BadInput, Interrupted


@main.command()
@click.argument("artifact", type=click.Path())
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Directory to install into (created if missing; usually a volume).")
@click.option("--target", type=GPU_TARGET, help="GPU target, e.g. sm_90 (default: the serving GPU's).")
@click.option("--fingerprint", "fingerprint_file", type=click.Path(dir_okay=False),
              help="The serving environment's fingerprint (`cachebake fingerprint --out`), "
                   "checked instead of this process's.")
@click.option("--serve-at", type=ABSOLUTE_PATH,
              help="Absolute path the server sees DIR at, if the volume is mounted elsewhere there.")
@click.option("--allow-mismatch", is_flag=True, help="Install despite preflight differences (warns).")
@click.option("--lock-timeout", default=600.0, show_default=True, type=NON_NEGATIVE_SECONDS,
              help="Seconds to wait for another install into DIR before giving up (exit 11).")
@click.option("--overlay", type=ABSOLUTE_PATH, default=None,
              help="Writable dir in the server (emptyDir, /tmp) for kernels the bake lacks: the env "
                   "turns on the layered cache manager and the miss log there.")
@click.option("--tls-verify/--no-tls-verify", default=None,
              help="ARTIFACT docker://...: require HTTPS (default: yes, except loopback registries).")
@click.option("--authfile", type=click.Path(dir_okay=False),
              help="ARTIFACT docker://...: registry credentials (docker config.json format).")
@click.option("--stall-timeout", default=STALL_TIMEOUT_S, show_default=True, type=POSITIVE_SECONDS,
              help=f"ARTIFACT docker://...: give up (exit 12) when the registry sends less than "
                   f"{STALL_MIN_BYTES >> 10} KiB in this many seconds.")
@click.option("--check-only", is_flag=True,
              help="Run every check (the whole layer too) and report what an install would do; write nothing.")
@click.option("--sync/--no-sync", default=True, show_default=True,
              help="Flush the new tree to disk before switching to it. --no-sync where DIR dies with a "
                   "crash of its machine or install runs before every start (an init container's "
                   "emptyDir, a Dockerfile RUN): a crash's damage is repaired by the next install.")
@click.option("--verify-key", "verify_keys", multiple=True,
              help="ARTIFACT docker://...: a trusted public key (PEM file, or the PEM text); the "
                   "image's digest must carry its signature before anything is pulled (exit 13). "
                   "Repeatable: any one is enough.")
@click.option("--verify-policy", type=click.Path(dir_okay=False),
              help='ARTIFACT docker://...: trusted keys from a JSON policy file '
                   '({"keys": [{"name": ..., "pem": ...}]}), as --verify-key.')
@JSON_OPTION
def install(artifact, to, target, fingerprint_file, serve_at, allow_mismatch, lock_timeout, overlay,
            tls_verify, authfile, stall_timeout, check_only, sync, verify_keys, verify_policy, as_json):
    """Check a bake and install it into DIR, atomically.

    Preflight, verify and safely, atomically install ARTIFACT into DIR; idempotent.
    ARTIFACT may be a registry reference, docker://HOST/REPO[:TAG] (or oci://...)."""
    out = output(as_json)
    report = None
    try:
        from cachebake.cli.render import render_install
        from cachebake.distribute import registry
        from cachebake.install import install_artifact

        options = dict(target=target, fingerprint_file=fingerprint_file, allow_mismatch=allow_mismatch,
                       serve_at=serve_at, lock_timeout=lock_timeout, overlay=overlay,
                       check_only=check_only, sync=sync)
        verify = None
        reg_options = registry.RegistryOptions(tls_verify, authfile, stall_timeout)
        if verify_keys or verify_policy:
            from cachebake.distribute.sign import trusted_keys, verify_reference

            if not registry.is_reference(artifact):
                raise BadInput(f"{artifact}: --verify-key checks a registry image's signatures: "
                               "install docker://HOST/REPO[:TAG|@DIGEST]")
            trusted = trusted_keys(verify_keys, verify_policy)

            def verify(reference):
                return verify_reference(reference, trusted, reg_options)
        if registry.is_reference(artifact):
            report = registry.install_reference(artifact, to, options=reg_options, verify=verify, **options)
        else:
            report = install_artifact(artifact, to, **options)
        for line in report.mismatches:
            out.warn(f"{line} (installed anyway: --allow-mismatch)")
        for line in report.warnings:
            out.warn(line)
        out.emit(report, render=render_install)
    except KeyboardInterrupt:  # outside install_artifact, which says what it left itself
        if report is None:
            raise Interrupted(f"nothing was installed; {os.path.abspath(to)} holds what it held before") from None
        raise Interrupted(f"{report.status}: {report.to}; only its report was cut short") from None

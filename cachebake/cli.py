"""The ``cachebake`` command line: thin; parses, calls one function, prints."""

from __future__ import annotations

import json
import sys

import click

from cachebake.errors import CachebakeError


class _Group(click.Group):
    """Maps every CachebakeError to ``cachebake: error: <msg>`` and its exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CachebakeError as e:
            click.echo(f"cachebake: error: {e}", err=True)
            ctx.exit(int(e.code))


@click.group(cls=_Group)
def main() -> None:
    """Bake Triton JIT and autotune caches at image-build time; install them anywhere."""


@main.command()
@click.argument("artifact")
@click.option("--to", "to", required=True, type=click.Path(file_okay=False),
              help="Directory to install into (created if missing; usually a volume).")
@click.option("--target", default=None, help="GPU target (sm_90); default: the serving GPU's.")
@click.option("--fingerprint", "fingerprint_file", default=None, type=click.Path(dir_okay=False),
              help="Serving environment's fingerprint (`cachebake fingerprint --out`), "
                   "instead of this process's.")
@click.option("--serve-at", default=None,
              help="Path the server sees DIR at, if the volume is mounted elsewhere there.")
@click.option("--allow-mismatch", is_flag=True, help="Install despite preflight differences.")
@click.option("--lock-timeout", default=600.0, show_default=True, type=float,
              help="Seconds to wait for another install into DIR before giving up (exit 11).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
def install(artifact, to, target, fingerprint_file, serve_at, allow_mismatch, lock_timeout,
            as_json) -> None:
    """Preflight, verify and safely, atomically install ARTIFACT into DIR."""
    from cachebake.install import install_artifact

    report = install_artifact(artifact, to, target=target, fingerprint_file=fingerprint_file,
                              allow_mismatch=allow_mismatch, serve_at=serve_at,
                              lock_timeout=lock_timeout)
    for line in report.mismatches:
        click.echo(f"cachebake: warning: {line} (installed anyway: --allow-mismatch)", err=True)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
        return
    if report.status == "already installed":
        click.echo(f"already installed: {report.layer_digest[:19]} ({report.target}) in {report.to}")
    else:
        click.echo(f"{report.status}: {report.layer_digest[:19]} ({report.target}) in {report.to}: "
                   f"{report.files} files, {report.file_bytes / 1e6:.1f} MB, "
                   f"{report.groups_relocated} group files relocated, {report.seconds:.2f} s")
    for k, v in report.env.items():
        click.echo(f"{k}={v}")


@main.command()
@click.option("--target", default=None, help="GPU target (sm_90); default: the visible GPU.")
@click.option("--out", default=None, type=click.Path(dir_okay=False), help="Write here, not stdout.")
def fingerprint(target, out) -> None:
    """Write this environment's fingerprint (run it in the serving image at build time)."""
    from cachebake.artifact.fingerprint import current_fingerprint

    text = json.dumps(current_fingerprint(target).to_dict(), indent=2, sort_keys=True) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

"""Preflight: would this bake hit in the environment the server runs in?

Compares the fingerprint stored in the artifact with the serving environment's: read from a
file that ``cachebake fingerprint`` wrote into the serving image at build time (an init
container is often not the serving image), or else from this process.  Each difference is one
line saying what differs, both values, and what it costs.  Nothing is written before this
passes.
"""

from __future__ import annotations

import json
from pathlib import Path

from cachebake.errors import BadInput, CorruptArtifact, PreflightMismatch


def _fingerprint_api():
    from cachebake.artifact import fingerprint
    return fingerprint


def load_serving_fingerprint(fingerprint_file: str | None, target: str | None):
    """The fingerprint to check against: ``fingerprint_file`` if given, else this process."""
    fp = _fingerprint_api()
    if fingerprint_file is not None and hasattr(fp.Fingerprint, "load"):
        return fp.Fingerprint.load(fingerprint_file)
    if fingerprint_file is not None:
        try:
            data = json.loads(Path(fingerprint_file).read_text())
        except OSError as e:
            raise BadInput(f"--fingerprint {fingerprint_file}: {e.strerror}") from None
        except ValueError as e:
            raise BadInput(f"--fingerprint {fingerprint_file}: not JSON ({e})") from None
        data = data.get("fingerprint", data)  # accept a whole manifest too
        try:
            return fp.Fingerprint.from_dict(data)
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(f"--fingerprint {fingerprint_file}: not a cachebake fingerprint ({e})") from None
    try:
        return fp.current_fingerprint(target)
    except ImportError as e:
        raise BadInput(f"cannot read this environment's fingerprint ({e}); pass --fingerprint FILE "
                       "written by `cachebake fingerprint` in the serving image") from None


def fingerprint_target(fingerprint) -> str | None:
    target = getattr(fingerprint, "target", None)
    if target is None and hasattr(fingerprint, "to_dict"):
        target = fingerprint.to_dict().get("target")
    if isinstance(target, dict):  # tolerate {"backend": "cuda", "arch": 90, ...}
        target = target.get("name") or f"{target.get('backend')}:{target.get('arch')}"
    return target


def check(manifest: dict, serving, allow_mismatch: bool, checked_this_process: bool = False) -> list[str]:
    """Return the difference lines (warnings) or raise PreflightMismatch."""
    fp = _fingerprint_api()
    try:
        baked = fp.Fingerprint.from_dict(manifest["fingerprint"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptArtifact(f"manifest fingerprint is unreadable ({e})") from None
    lines = [str(m) for m in fp.compare_fingerprints(baked, serving)]
    if lines and not allow_mismatch:
        raise PreflightMismatch(
            f"bake for {manifest.get('target')} was made for another environment "
            f"({len(lines)} difference{'s' * (len(lines) > 1)}); nothing installed "
            "(--allow-mismatch installs anyway):\n" + "\n".join(f"  {line}" for line in lines)
            + ("\n(checked against this process; if the server runs another image, pass "
               "--fingerprint FILE from `cachebake fingerprint` run in it)" if checked_this_process else ""))
    return lines

"""Preflight: would this bake hit in the environment the server runs in?

Compares the fingerprint stored in the artifact with the serving environment's: read from a
file that ``cachebake fingerprint`` wrote into the serving image at build time (an init
container is often not the serving image), or else from this process.  Each difference is one
line saying what differs, both values, and what it costs.  Nothing is written before this
passes.
"""

from __future__ import annotations

from cachebake import jsonio
from cachebake.artifact import schema
from cachebake.artifact.fingerprint import Fingerprint, compare_fingerprints, current_fingerprint
from cachebake.errors import BadInput, CorruptArtifact, InvalidDocument, PreflightMismatch


def load_serving_fingerprint(fingerprint_file: str | None, target: str | None) -> Fingerprint:
    """The fingerprint to check against: ``fingerprint_file`` if given, else this process
    (which imports Triton; with a file, an init container needs no Triton at all).  The file
    is the user's (exit 3 when it is unreadable or malformed), read with the same bounds as an
    artifact's documents."""
    if fingerprint_file is None:
        return current_fingerprint(target)
    name = f"fingerprint file {fingerprint_file}"
    try:
        data = jsonio.load_document(fingerprint_file, name, schema.CAP_FINGERPRINT, missing=BadInput)
        if isinstance(data, dict) and isinstance(data.get("fingerprint"), dict):
            data = data["fingerprint"]
        c = schema.Checker(name)
        c.string(c.get(c.obj(data), "target", ""), "target", pattern=schema.TARGET_RE)
        for key in ("env", "bake_paths"):
            if key in data:
                c.str_map(data[key], key)
    except InvalidDocument as e:
        raise BadInput(e.line()) from None
    return Fingerprint.from_dict(data)


def check(manifest: dict, serving: Fingerprint, allow_mismatch: bool,
          checked_this_process: bool = False) -> list[str]:
    """Return the difference lines (warnings) or raise PreflightMismatch."""
    try:
        baked = Fingerprint.from_dict(manifest["fingerprint"])
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptArtifact(f"manifest fingerprint is unreadable ({e})") from None
    lines = [str(m) for m in compare_fingerprints(baked, serving)]
    if lines and not allow_mismatch:
        raise PreflightMismatch(
            f"bake for {manifest.get('target')} was made for another environment "
            f"({len(lines)} difference{'s' * (len(lines) > 1)}); nothing installed "
            "(--allow-mismatch installs anyway):\n" + "\n".join(f"  {line}" for line in lines)
            + ("\n(checked against this process; if the server runs another image, pass "
               "--fingerprint FILE from `cachebake fingerprint` run in it)" if checked_this_process else ""))
    return lines

"""``cachebake install``: make a bake hit on this machine, at any path, or say why it can't.

Steps, in order; nothing is written to DIR before step 6, and nothing in DIR changes for a
server before step 7's switch:

1. open the artifact (dir, OCI layout or .tar.zst + manifest), read every document with bounds
   and check its schema, and pick the bake for the GPU target (``--target``, else the serving
   fingerprint's, else the visible GPU's); unknown manifest versions are UNSUPPORTED;
2. preflight the fingerprint against the serving environment (PREFLIGHT, or warnings with
   ``--allow-mismatch``);
3. check DIR: not a link, nothing in the way of a role link, ``.cachebake`` ours; free bytes and
   inodes for what the manifest declares;
4. if DIR holds this digest for this serve path and its tree still matches the inventory in
   install.json: "already installed", done (a damaged tree is repaired below);
5. ``--check-only`` stops here after reading the whole layer through the same checks, writing
   nothing, and reports what an install would do;
6. under DIR's lock: re-check, clean a killed install's leftovers, then in one pass decompress,
   check each entry and write it into a private staging dir (relocating Triton group files);
   the blob's digest is checked at its end;
7. sync, link roles, switch atomically (atomic.py).  Any refusal removes the staging dir (and
   a DIR this install created); Ctrl-C exits 130 saying whether the switch happened.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

from cachebake.errors import Interrupted
from cachebake.install import atomic, extract, preflight, relocate
from cachebake.install.source import open_source
from cachebake.roles import serving_env

LOCK_TIMEOUT_S = 600.0


@dataclass
class InstallReport:
    # "installed" | "replaced" | "repaired" | "already installed"; with --check-only:
    # "would install" | "would replace" | "would repair" | "already installed"
    status: str
    artifact: str
    target: str
    layer_digest: str
    to: str
    serve_at: str
    roles: list[str]
    env: dict[str, str]
    version_dir: str = ""
    entries: int = 0
    files: int = 0
    file_bytes: int = 0
    groups_relocated: int = 0
    cleaned: list[str] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)  # what a repair found wrong (first 20)
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def install_artifact(artifact: str | os.PathLike, to: str | os.PathLike, *,
                     target: str | None = None, fingerprint_file: str | None = None,
                     allow_mismatch: bool = False, serve_at: str | os.PathLike | None = None,
                     lock_timeout: float = LOCK_TIMEOUT_S, check_only: bool = False) -> InstallReport:
    dest = atomic.InstallDir(to)
    try:
        return _install(artifact, dest, target=target, fingerprint_file=fingerprint_file,
                        allow_mismatch=allow_mismatch, serve_at=serve_at, lock_timeout=lock_timeout,
                        check_only=check_only)
    except KeyboardInterrupt:
        if dest.switched():
            raise Interrupted(f"the new bake was switched in at {dest.root}; a re-run cleans up "
                              "what is left") from None
        raise Interrupted(f"nothing was installed; {dest.root} holds what it held before") from None


def _install(artifact, dest: atomic.InstallDir, *, target, fingerprint_file, allow_mismatch,
             serve_at, lock_timeout, check_only) -> InstallReport:
    started = time.monotonic()
    source = open_source(os.fspath(artifact))
    serving = preflight.load_serving_fingerprint(fingerprint_file, target)
    bake = source.select(target or serving.target)
    manifest = bake.manifest
    roles = list(manifest.roles)
    mismatches = preflight.check({"target": manifest.target, "fingerprint": manifest.fingerprint}, serving,
                                 allow_mismatch,
                                 checked_this_process=fingerprint_file is None)

    serve_root = os.path.abspath(serve_at) if serve_at else str(dest.root)
    report = InstallReport(
        status="installed", artifact=os.fspath(artifact), target=bake.target,
        layer_digest=bake.layer_digest, to=str(dest.root),
        serve_at=serve_root, roles=roles, env=serving_env(serve_root, roles), mismatches=mismatches)
    dest.check_usable(roles)
    # the longest path an entry lands at: DIR/.cachebake/versions/<digest12>-<rand8>/<entry>
    version_root = str(dest.state / "versions" / ("0" * 21))
    limits = extract.LayerLimits.from_manifest(manifest, bake.layer_size, (version_root, serve_root))

    def ours(marker: dict | None) -> bool:
        return bool(marker) and marker["layer_digest"] == bake.layer_digest \
            and marker["serve_at"] == serve_root and sorted(marker["roles"]) == sorted(roles)

    def done(version: str) -> InstallReport:
        report.status = "already installed"
        report.version_dir = str(dest.state / "versions" / version)
        report.seconds = round(time.monotonic() - started, 3)
        return report

    with dest.opened(create=False):
        marker, version, damage = dest.inspect()
        leftovers = dest.state_fd is not None and dest.has_leftovers(version)
    if ours(marker) and not damage and not (leftovers and not check_only):
        return done(version)
    dest.check_space(limits.file_bytes, limits.entries)
    transform = relocate.group_rewriter(serve_root)

    if check_only:
        report.damage = damage if ours(marker) else []
        report.status = ("would repair" if ours(marker) else "would replace" if marker or damage
                         else "would install")
        with source.open_layer(bake) as stream:  # every check, nothing written
            _fill(report, extract.extract_layer(stream, limits, None, transform))
        report.seconds = round(time.monotonic() - started, 3)
        return report

    with dest.locked(lock_timeout):
        staged, staged_fd = None, -1
        try:
            marker, version, damage = dest.inspect()
            report.cleaned = dest.clean_leftovers(keep_roles=set(roles))
            if ours(marker) and not damage:  # maybe a racing install did it while we waited
                return done(version)
            report.status = "repaired" if ours(marker) else "replaced" if marker or damage else "installed"
            report.damage = damage if ours(marker) else []
            staged, staged_fd = dest.new_staging()
            with source.open_layer(bake) as stream:
                stats = extract.extract_layer(stream, limits, staged_fd, transform, atomic.checkpoint)
            new_marker = {
                "layer_digest": bake.layer_digest, "target": report.target, "roles": roles,
                "serve_at": serve_root, "artifact": report.artifact,
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "groups_relocated": stats.transformed, "dirs": stats.dirs, "files": stats.inventory}
            version = dest.commit(staged, staged_fd, bake.layer_digest, new_marker, roles)
        except BaseException:
            # Refused, disk full, EIO, Ctrl-C: no half-written tree for the next install, and a
            # DIR this install created is removed again.
            if staged is not None:
                os.close(staged_fd)
                staged_fd = -1
                dest.remove_staging(staged)
            dest.undo()
            raise
        finally:
            if staged_fd >= 0:
                os.close(staged_fd)
        report.cleaned += dest.clean_leftovers()
    report.version_dir = str(dest.state / "versions" / version)
    _fill(report, stats)
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _fill(report: InstallReport, stats: extract.LayerStats) -> None:
    report.entries, report.files = stats.entries, stats.files
    report.file_bytes, report.groups_relocated = stats.file_bytes, stats.transformed

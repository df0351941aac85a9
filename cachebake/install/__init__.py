"""``cachebake install``: make a bake hit on this machine, at any path, or say why it can't.

Steps, in order; nothing is written to DIR before step 5:

1. open the artifact (dir, OCI layout or .tar.zst + manifest) and pick the bake for the GPU
   target (``--target``, else the serving fingerprint's, else the visible GPU's);
2. refuse unknown manifest versions (UNSUPPORTED; the artifact reader does, through BakeManifest);
3. preflight the fingerprint against the serving environment (PREFLIGHT, or warnings with
   ``--allow-mismatch``);
4. if DIR already holds this digest for this serve path: "already installed", done;
   otherwise scan the whole layer, verifying digests and every entry (CORRUPT / UNSAFE);
5. under DIR's lock: re-check, clean a killed install's leftovers, extract into a staging dir
   relocating Triton group files and the vllm role's paths on the way (a role that cannot be
   relocated is left out, with a warning: relocate_vllm.py), sync, switch atomically.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from cachebake.install import atomic, extract, preflight, relocate, relocate_vllm
from cachebake.install.source import open_source
from cachebake.roles import ROLE_ENV, serving_env
from cachebake.runtime import serving_overlay_env as runtime_env

LOCK_TIMEOUT_S = 600.0


@dataclass
class InstallReport:
    status: str  # "installed" | "replaced" | "already installed"
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
    relocated: dict[str, int] = field(default_factory=dict)  # role -> files rewritten for serve_at
    left_out: dict[str, str] = field(default_factory=dict)  # role -> why it was not installed
    warnings: list[str] = field(default_factory=list)
    cleaned: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def _pick_target(target: str | None, serving) -> str:
    """``--target``, else the serving fingerprint's (the visible GPU's, or the file's)."""
    return target or serving.target


def _load(source, bake, limits: extract.LayerLimits, serve_root: str,
          manifest: dict) -> tuple[extract.Layer, relocate_vllm.RoleRelocation]:
    """Digest, decompression under the bomb guard, every entry checked, group files and the
    vllm role relocated in memory; writes nothing.  A role that cannot be relocated is taken
    out of the layer's entries (it will not be written)."""
    vllm = relocate_vllm.RoleRelocation(manifest, serve_root)
    transform = relocate_vllm.combine(relocate.group_rewriter(serve_root), vllm.transform)
    with source.open_layer(bake) as compressed:
        layer = extract.load_layer(compressed, limits, transform)
    if vllm.left_out:
        layer.members = [(m, mode) for m, mode in layer.members
                         if m.name.split("/", 1)[0] not in vllm.left_out]
        layer.stats.entries = len(layer.members)
        layer.stats.files = sum(1 for m, _ in layer.members if m.isreg())
        layer.stats.file_bytes = sum(m.size for m, _ in layer.members if m.isreg())
    return layer, vllm


def install_artifact(artifact: str | os.PathLike, to: str | os.PathLike, *,
                     target: str | None = None, fingerprint_file: str | None = None,
                     allow_mismatch: bool = False, serve_at: str | os.PathLike | None = None,
                     lock_timeout: float = LOCK_TIMEOUT_S,
                     overlay: str | os.PathLike | None = None) -> InstallReport:
    """``overlay``: a writable dir in the server (emptyDir, /tmp) for what the bake misses; the
    env then turns on the layered cache manager and its miss log (cachebake.runtime)."""
    started = time.monotonic()
    source = open_source(os.fspath(artifact))
    serving = preflight.load_serving_fingerprint(fingerprint_file, target)
    bake = source.select(_pick_target(target, serving))
    manifest = bake.manifest.to_dict()
    roles = list(manifest.get("roles") or [])
    mismatches = preflight.check(manifest, serving, allow_mismatch,
                                 checked_this_process=fingerprint_file is None)

    dest = atomic.InstallDir(to)
    serve_root = os.path.abspath(serve_at) if serve_at else str(dest.root)
    report = InstallReport(
        status="installed", artifact=os.fspath(artifact), target=bake.target,
        layer_digest=bake.layer_digest, to=str(dest.root),
        serve_at=serve_root, roles=roles, env=serving_env(serve_root, roles), mismatches=mismatches)
    if overlay is not None:
        report.env.update(runtime_env(overlay, serve_root, roles))
    dest.check_usable(roles)

    def done(marker: dict | None) -> bool:
        if marker and marker.get("layer_digest") == bake.layer_digest \
                and marker.get("serve_at") == serve_root:
            report.status = "already installed"
            report.version_dir = str(dest.current.resolve())
            _left_out(report, dict(marker.get("left_out") or {}), serve_root)
            return True
        return False

    if done(dest.installed()) and not dest.has_leftovers():
        report.seconds = round(time.monotonic() - started, 3)
        return report

    limits = extract.LayerLimits.from_manifest(manifest, bake.layer_size)

    def load() -> tuple[extract.Layer, relocate_vllm.RoleRelocation]:
        dest.check_space(limits.file_bytes + 4096 * limits.entries)
        return _load(source, bake, limits, serve_root, manifest)

    # Load before taking the lock: racing installs verify in parallel, only writes take turns.
    loaded = None if report.status == "already installed" else load()

    dest.root.mkdir(parents=True, exist_ok=True)
    with dest.locked(lock_timeout):
        previous = dest.installed()
        report.cleaned = dest.clean_leftovers(keep_roles=set(roles))
        if done(previous):  # installed already (maybe by a racing install while we scanned)
            report.seconds = round(time.monotonic() - started, 3)
            return report
        report.status = "installed"
        layer, vllm = loaded or load()
        _left_out(report, vllm.left_out, serve_root)
        report.relocated = {role: n for role, n in
                            Counter(name.split("/", 1)[0] for name in layer.rewritten).items()
                            if role not in vllm.left_out}
        report.groups_relocated = report.relocated.get("triton", 0)
        staged = dest.new_staging()
        try:
            stats = extract.extract_layer(layer, str(staged), checkpoint=atomic.checkpoint)
            marker = {"layer_digest": bake.layer_digest, "target": report.target,
                      "roles": report.roles, "serve_at": serve_root, "artifact": report.artifact,
                      "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "groups_relocated": report.groups_relocated, "relocated": report.relocated,
                      "left_out": report.left_out}
            version = dest.commit(staged, bake.layer_digest, marker, report.roles)
        except BaseException:
            # Disk full, EIO, Ctrl-C: don't leave the half-written tree for the next install.
            shutil.rmtree(staged, ignore_errors=True)
            raise
        report.cleaned += dest.clean_leftovers()
    report.status = "replaced" if previous else "installed"
    report.version_dir = str(dest.versions / version)
    report.entries, report.files = stats.entries, stats.files
    report.file_bytes = stats.file_bytes
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _left_out(report: InstallReport, left_out: dict[str, str], serve_root: str) -> None:
    """Take the roles install could not relocate out of the report's roles and environment."""
    report.left_out = dict(left_out)
    report.roles = [r for r in report.roles if r not in left_out]
    # the left-out roles' variables go; the rest (the overlay's, when asked) stays
    dropped = {ROLE_ENV[r] for r in left_out if r in ROLE_ENV}
    report.env = {k: v for k, v in report.env.items() if k not in dropped}
    report.warnings = [f"left the {role} role out ({reason}); the other roles are installed "
                       "and the server compiles what that role held"
                       for role, reason in sorted(left_out.items())]

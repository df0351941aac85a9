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
6. in one transaction of DIR (``InstallDir.transaction``: the lock, a killed install's
   leftovers cleaned, a private staging dir): re-check, then in one pass decompress, check each
   entry and write it into the staging dir (relocating Triton group files); the blob's digest
   is checked at its end;
7. ``tx.commit``: sync, link roles, switch atomically (atomic.py).  Any refusal undoes the
   transaction (the staging dir, and a DIR this install created, are removed); Ctrl-C exits
   130 saying whether the switch happened.

``--check-only`` is steps 1-4 plus step 6's pass over the layer with nothing written.

The vllm role's paths are relocated on the way like Triton's group files; a role that cannot
be relocated is removed from the staging dir before the switch and left out with a warning
(relocate_vllm.py), the other roles install as usual.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from cachebake.artifact.reader import open_source
from cachebake.errors import BadInput, CachebakeError, Interrupted, from_os_error
from cachebake.install import atomic, extract, preflight, relocate, relocate_vllm
from cachebake.install.inventory import InstallMarker, warmup_of
from cachebake.install.environment import IDENTITY, BakeFacts, ServerLayout, server_env
from cachebake.roles import OVERLAY_ENV
from cachebake.roles import serving_overlay_env as runtime_env

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
    # the part of ``env`` that is vLLM's compile identity (serveargs.identity_serve_env)
    # (``env`` is cachebake.install.environment.server_env's, as serve-args and k8s print it)
    identity_env: dict[str, str] = field(default_factory=dict)
    version_dir: str = ""
    entries: int = 0
    files: int = 0
    file_bytes: int = 0
    groups_relocated: int = 0
    relocated: dict[str, int] = field(default_factory=dict)  # role -> files rewritten for serve_at
    left_out: dict[str, str] = field(default_factory=dict)  # role -> why it was not installed
    warnings: list[str] = field(default_factory=list)
    signature: dict[str, str] = field(default_factory=dict)  # --verify-key: digest, key, form verified
    cleaned: list[str] = field(default_factory=list)
    damage: list[str] = field(default_factory=list)  # what a repair found wrong (first 20)
    mismatches: list[str] = field(default_factory=list)
    synced: bool = True  # False: --no-sync, what this install writes may not be on disk yet
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def install_artifact(artifact: str | os.PathLike, to: str | os.PathLike, *,
                     target: str | None = None, fingerprint_file: str | None = None,
                     allow_mismatch: bool = False, serve_at: str | os.PathLike | None = None,
                     lock_timeout: float = LOCK_TIMEOUT_S, check_only: bool = False,
                     overlay: str | os.PathLike | None = None,
                     artifact_name: str | None = None, sync: bool = True,
                     checkpoint: Callable[[str], None] = atomic.no_checkpoint,
                     signature: dict[str, str] | None = None) -> InstallReport:
    """``overlay``: a writable dir in the server (emptyDir, /tmp) for what the bake misses; the
    env then turns on the layered cache manager and its miss log (cachebake.serve).
    ``artifact_name``: what the report and install.json call the artifact when ``artifact`` is
    a stand-in for it (a registry install's private temp layout: its reference instead).
    ``sync`` False: skip the syncfs and fsyncs that make the new tree durable before the
    switch, for a DIR that dies with its machine's crash or that install re-checks before
    every start (an init container's emptyDir, a Dockerfile RUN): there a crash's damage (files
    left empty) is what the next install's tree check repairs, and the sync is ~30 ms of an
    install on a fast disk, more on a node whose other tenants left writeback pending.
    ``checkpoint``: called with the name of each step of the extraction and the switch (the
    crash tests kill the process at the n-th call: tests/kit/installkit.py).
    ``signature``: the verified digest and key (distribute.sign's record), for install.json;
    an install whose marker records another one is not "already installed"."""
    dest = atomic.InstallDir(to, sync=sync, checkpoint=checkpoint)
    try:
        # Ctrl-C at a step, where what was left is known (errors.DeferredInterrupt); a check
        # writes nothing, so it stops wherever it is
        with contextlib.nullcontext() if check_only else dest.interrupts:
            return _install(artifact, dest, target=target, fingerprint_file=fingerprint_file,
                            allow_mismatch=allow_mismatch, serve_at=serve_at, lock_timeout=lock_timeout,
                            check_only=check_only, overlay=overlay,
                            artifact_name=artifact_name or os.fspath(artifact), signature=signature)
    except KeyboardInterrupt:
        raise Interrupted(_what_was_left(dest)) from None
    except OSError as e:
        # DIR's filesystem refused a write (full, read-only, quota, permissions) or failed
        # (EIO): one line naming DIR, never the entry or temp name the OS error carries
        raise from_os_error(e, dest.root, "cannot install", BadInput if e.errno in DIR_REFUSALS else CachebakeError,
                            hint=_what_was_left(dest)) from None


# What DIR's filesystem refuses (the user's to fix: exit 3); any other OSError there is exit 1.
DIR_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                          errno.EMLINK, errno.ENAMETOOLONG})


def _what_was_left(dest: atomic.InstallDir) -> str:
    if dest.switched():
        return f"the new bake was switched in at {dest.root}; a re-run cleans up what is left"
    return f"nothing was installed; {dest.root} holds what it held before"


@dataclass
class _Plan:
    """Steps 1-3: what this install would put where, settled before anything is written."""

    source: object  # cachebake.artifact.reader's source
    bake: object  # its BakeRef for the target
    report: InstallReport
    limits: extract.LayerLimits
    serve_root: str
    started: float
    facts: BakeFacts  # what the server's environment takes from the bake
    overlay: str | None = None  # checked (runtime_env)
    signature: dict[str, str] | None = None  # install --verify-key: what verified it

    def environment(self, roles) -> None:
        """The report's environment for the roles the server gets: server_env's."""
        env = server_env(self.facts, ServerLayout.installed(self.serve_root, roles, self.overlay))
        self.report.env = env.as_dict()
        self.report.identity_env = env.of(IDENTITY)

    def ours(self, marker: InstallMarker | None) -> bool:
        """Whether ``marker`` records this very bake, for this serving path, with these roles."""
        return marker is not None and marker.layer_digest == self.bake.layer_digest \
            and marker.serve_at == self.serve_root \
            and sorted([*marker.roles, *marker.left_out]) == sorted(self.bake.manifest.roles) \
            and (not self.signature or dict(marker.signature) == self.signature)

    def relocation(self) -> tuple[relocate_vllm.RoleRelocation, extract.Transform]:
        """A fresh relocation for one pass over the layer (it records what it finds)."""
        vllm = relocate_vllm.RoleRelocation(self.bake.manifest, self.serve_root)
        return vllm, relocate_vllm.combine(relocate.group_rewriter(self.serve_root),
                                           *([vllm.transform] if vllm.roles else []))

    def extract(self, staging_fd: int | None, checkpoint=atomic.no_checkpoint):
        """One pass over the layer: every check, and the writes when ``staging_fd`` is given."""
        vllm, transform = self.relocation()
        with self.source.open_layer(self.bake) as stream:
            return vllm, extract.extract_layer(stream, self.limits, staging_fd, transform, checkpoint)

    def done(self, status: str, dest: atomic.InstallDir, version: str | None,
             left_out: dict[str, str] | None = None) -> InstallReport:
        report = self.report
        report.status = status
        if version is not None:
            report.version_dir = str(dest.state / "versions" / version)
        if left_out is not None:
            _left_out(self, left_out)
        report.seconds = round(time.monotonic() - self.started, 3)
        return report


def _plan(artifact, dest: atomic.InstallDir, *, target, fingerprint_file, allow_mismatch, serve_at,
          overlay, artifact_name, signature=None) -> _Plan:
    """Steps 1-3 of the module doc: the artifact read and checked, the preflight, DIR usable."""
    started = time.monotonic()
    source = open_source(os.fspath(artifact))
    serving = preflight.load_serving_fingerprint(fingerprint_file, target)
    bake = source.select(target or serving.target)
    manifest = bake.manifest
    roles = list(manifest.roles)
    bake_record = manifest.bake.to_json()
    mismatches = preflight.check(preflight.as_rounds_ran(manifest.fingerprint, bake_record), serving,
                                 allow_mismatch, checked_this_process=fingerprint_file is None,
                                 hashed=preflight.hashed_vllm_variables(bake_record))
    serve_root = os.path.abspath(serve_at) if serve_at else str(dest.root)
    report = InstallReport(
        status="installed", artifact=artifact_name, target=bake.target,
        layer_digest=bake.layer_digest, to=str(dest.root),
        serve_at=serve_root, roles=roles, env={}, mismatches=mismatches, synced=dest.sync,
        signature=dict(signature or {}))
    if overlay is not None:  # checked: absolute, outside the tree, a triton role to layer
        overlay = runtime_env(overlay, serve_root, roles)[OVERLAY_ENV]
    dest.check_usable(roles)
    # the longest path an entry lands at: DIR/.cachebake/versions/<digest12>-<rand8>/<entry>
    version_root = str(dest.state / "versions" / ("0" * 21))
    limits = extract.LayerLimits.from_manifest(manifest, bake.layer_size, (version_root, serve_root))
    plan = _Plan(source, bake, report, limits, serve_root, started,
                 BakeFacts.from_manifest(manifest, f"{artifact_name}: bake manifest"), overlay,
                 signature)
    # vLLM hashes its HOME/XDG-derived paths into the torch.compile dirs: the server gets the
    # bake's values (the compile identity), as serve-args prints them, or the vllm role is
    # never loaded; and an artifact's variable that the rules refuse is refused here, exit 5
    plan.environment(roles)
    return plan


def _install(artifact, dest: atomic.InstallDir, *, lock_timeout, check_only, **options) -> InstallReport:
    plan = _plan(artifact, dest, **options)
    dest.interrupts.check()
    report = plan.report
    with dest.opened(create=False):  # a look without the lock: the common repeat is a no-op
        marker, version, damage = dest.inspect()
        leftovers = dest.state_fd is not None and dest.has_leftovers(version)
    if plan.ours(marker) and not damage and not (leftovers and not check_only):
        return plan.done("already installed", dest, version, dict(marker.left_out))
    dest.check_space(plan.limits.file_bytes, plan.limits.entries)

    if check_only:  # the plan plus a dry extraction: every check, nothing written
        report.damage = damage if plan.ours(marker) else []
        vllm, stats = plan.extract(None)
        _fill(plan, stats, vllm)
        status = "would repair" if plan.ours(marker) else "would replace" if marker or damage else "would install"
        return plan.done(status, dest, None)

    with dest.transaction(lock_timeout, keep_roles=set(report.roles)) as tx:
        report.cleaned = tx.cleaned
        if plan.ours(tx.marker) and not tx.damage:  # a racing install did it while we waited
            return plan.done("already installed", dest, tx.version, dict(tx.marker.left_out))
        report.status = "repaired" if plan.ours(tx.marker) else "replaced" if tx.marker or tx.damage \
            else "installed"
        report.damage = tx.damage if plan.ours(tx.marker) else []
        vllm, stats = plan.extract(tx.staged_fd, tx.checkpoint)
        for role in vllm.left_out:  # found mid-stream: drop it before anything is visible
            tx.drop(role)
            stats.dirs = [d for d in stats.dirs if d.split("/", 1)[0] != role]
            stats.inventory = {n: r for n, r in stats.inventory.items() if n.split("/", 1)[0] != role}
        _fill(plan, stats, vllm)
        version = tx.commit(InstallMarker(
            layer_digest=plan.bake.layer_digest, target=report.target, roles=tuple(report.roles),
            serve_at=plan.serve_root, artifact=report.artifact,
            installed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            groups_relocated=report.groups_relocated, relocated=report.relocated,
            left_out=report.left_out, dirs=tuple(stats.dirs), files=stats.inventory,
            signature=dict(plan.signature or {}),
            warmup=warmup_of(plan.bake.manifest.bake)))
    report.cleaned = tx.cleaned
    return plan.done(report.status, dest, version)


def _fill(plan: _Plan, stats: extract.LayerStats, vllm: relocate_vllm.RoleRelocation) -> None:
    """Counts for the report; the roles left out are out of the counts, the roles and the env."""
    report = plan.report
    if vllm.left_out:
        kept = [n for n in stats.inventory if n.split("/", 1)[0] not in vllm.left_out]
        report.entries, report.files = len(kept) + len(stats.dirs), len(kept)
        report.file_bytes = sum(stats.inventory[n] for n in kept)
    else:
        report.entries, report.files, report.file_bytes = stats.entries, stats.files, stats.file_bytes
    report.groups_relocated = stats.transformed - sum(vllm.files.values())
    report.relocated = {role: n for role, n in
                        {"triton": report.groups_relocated, **dict(vllm.files)}.items()
                        if n and role not in vllm.left_out}
    _left_out(plan, vllm.left_out)


def _left_out(plan: _Plan, left_out: dict[str, str]) -> None:
    """Take the roles install could not relocate out of the report's roles and environment
    (server_env again without them: for vllm, its compile identity goes too)."""
    report = plan.report
    report.left_out = dict(left_out)
    report.roles = [r for r in report.roles if r not in left_out]
    plan.environment(report.roles)
    report.warnings = [f"left the {role} role out ({reason}); the other roles are installed "
                       "and the server compiles what that role held"
                       for role, reason in sorted(left_out.items())]

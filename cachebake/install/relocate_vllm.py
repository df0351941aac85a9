"""Make the ``vllm`` role hit where it is installed, or leave it out; never crash the server.

vLLM's torch.compile cache names the directory it was baked in (artifact/torch_paths.py says
where and who reads it).  Installed at another path unchanged, vLLM 0.24 fails at start-up with
FileNotFoundError, and Inductor looks for its autotune results under the old path.  Install
therefore rewrites every such path for the serving root, as it does Triton's group files.

Which roots are old: the manifest records them (``layer_root``, the fingerprint's
``bake_paths`` and the bake's pinned ``VLLM_CACHE_ROOT``...), each mapped to the same role under
the serving root.  A file that names a root none of these account for (a cache copied elsewhere
before it was packed), or that names one in a form this cannot rewrite, makes the whole role
unsafe to ship here: it is left out with one warning (install's report says which file and
why), and the other roles, Triton's among them, are installed and hit as usual.  A server
without VLLM_CACHE_ROOT's cache compiles its torch.compile graphs again; it does not crash.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from typing import Callable

from cachebake.artifact.manifest import BakeManifest
from cachebake.artifact.torch_paths import PATH_ROLES, NotRelocatable, PathMap, relocate_file
from cachebake.roles import ROLE_ENV


def root_map(manifest: BakeManifest, serve_root: str) -> dict[str, str]:
    """Every root the bake's files may name (per role: the layer root's, the path it was packed
    from, the path the bake pinned) -> that role under ``serve_root``."""
    bake_paths = manifest.fingerprint.bake_paths
    pinned = (manifest.bake.env or {}).get("pinned") or {}
    layer_root = manifest.layer_root
    pairs: dict[str, str] = {}
    for role, var in ROLE_ENV.items():
        new = posixpath.join(serve_root, role)
        for old in (posixpath.join(layer_root, role) if isinstance(layer_root, str) else None,
                    bake_paths.get(role), pinned.get(var)):
            if isinstance(old, str) and old.startswith("/"):
                pairs.setdefault(posixpath.normpath(old), new)
    return pairs


class RoleRelocation:
    """The ``extract.Transform`` for the relocated roles, and what it found.

    ``left_out``: role -> the one-line reason it cannot be installed here; ``files``: role ->
    files rewritten; ``opaque``: old-root occurrences left in Triton debug info (see
    torch_paths)."""

    def __init__(self, manifest: BakeManifest, serve_root: str):
        self.serve_root = posixpath.normpath(serve_root)
        self.roles = [r for r in PATH_ROLES if r in manifest.roles]
        self.left_out: dict[str, str] = {}
        self.files: Counter[str] = Counter()
        self.opaque: Counter[str] = Counter()
        self.pm: PathMap | None = None
        try:
            self.pm = PathMap(root_map(manifest, self.serve_root))
        except NotRelocatable as e:
            for role in self.roles:
                self.left_out[role] = f"cannot relocate to {self.serve_root}: {e}"

    def transform(self, member_name: str) -> Callable[[bytes], bytes] | None:
        role, _, rel = member_name.partition("/")
        if role not in self.roles or self.pm is None:
            return None
        serve_dir = posixpath.dirname(posixpath.join(self.serve_root, member_name))
        pm = self.pm

        def rewrite(data: bytes) -> bytes:
            if role in self.left_out:
                return data
            try:
                new, counts = relocate_file(rel, data, pm, serve_dir)
            except NotRelocatable as e:
                self.left_out[role] = f"{member_name}: {e}"
                return data
            if new is not data:
                self.files[role] += 1
                self.opaque[role] += counts.opaque
            return new

        return rewrite


def combine(*transforms: Callable[[str], Callable[[bytes], bytes] | None]):
    """One ``extract.Transform`` from several: the first that claims a member rewrites it."""
    if len(transforms) == 1:
        return transforms[0]  # called once per file: no wrapper when there is nothing to pick

    def for_member(member_name: str):
        for t in transforms:
            if (rewrite := t(member_name)) is not None:
                return rewrite
        return None

    return for_member

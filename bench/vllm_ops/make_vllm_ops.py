#!/usr/bin/env python3
"""Build an importable, ops-only slice of vLLM from its released wheel.

Why: the GPU machine has no vllm and no network, vllm 0.33 pins torch 2.14 (the device has
2.11), and its 336 MB wheel is over the 64 MiB the device tool carries.  vLLM's Mamba2 Triton
ops are pure Python, so this script downloads the wheel (cached outside the repo), copies the
package ``vllm/model_executor/layers/mamba/ops/`` byte for byte (kernels, per-GPU-name JSON
config tables, LICENSE), and writes small stand-ins for the handful of vllm modules those
files import.  Then ``import vllm.model_executor.layers.mamba.ops.ssd_combined`` works as it
does under a full install, and the kernels' Triton cache keys are the real ones (a key holds
the kernel's source text, never its file path).

Only vLLM's own files are copied; this script is what the repo keeps.  The stand-ins mirror
the behaviour the ops ask of vLLM on a CUDA device (see STANDINS below); values that vLLM
defines as constants (PAD_SLOT_ID, NULL_BLOCK_ID) are read from the wheel's source, not typed
here.  ``ssd_checkpoint`` (the prefix-caching checkpoint kernel) imports too: its only vLLM
import is the checkpoint metadata's type, a stand-in with the real dataclass's fields.
Modules of the ops package that need the rest of vLLM (ssu_dispatch, scatter_states, the
gdn/cutedsl kernels) are copied but will not import.

Usage:  python3 bench/vllm_ops/make_vllm_ops.py [--out DIR] [--wheel-dir DIR] [--version V]
        python3 bench/vllm_ops/make_vllm_ops.py --from-site .../site-packages --out DIR
(the second copies from an installed vllm, every file checked against its RECORD hashes)
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

OPS_PREFIX = "vllm/model_executor/layers/mamba/ops/"
LICENSE_SUFFIX = ".dist-info/licenses/LICENSE"
DEFAULT_OUT = Path("/work/main/.carry/vllm_ops")
DEFAULT_WHEEL_DIR = Path("/work/cache-wheels")
DEFAULT_VERSION = "0.33.0"

# The vllm modules the kernel files import, found by reading their imports:
#   causal_conv1d:   vllm.platforms.current_platform, vllm.triton_utils,
#                    vllm.v1.attention.backends.utils (NULL_BLOCK_ID, PAD_SLOT_ID)
#   mamba_ssm:       vllm.envs, vllm._custom_ops, vllm.logger, vllm.platforms,
#                    vllm.triton_utils, vllm.utils.platform_utils, v1...utils
#   ssd_*, layernorm_gated, triton_helpers, replayssm_config: triton_utils, platforms
# Package __init__ files on the way are empty stand-ins (the real mamba/__init__.py is empty).
PACKAGE_INITS = [
    "vllm/model_executor/__init__.py",
    "vllm/model_executor/layers/__init__.py",
    "vllm/model_executor/layers/mamba/__init__.py",
    "vllm/utils/__init__.py",
    "vllm/v1/__init__.py",
    "vllm/v1/attention/__init__.py",
    "vllm/v1/attention/backends/__init__.py",
]

HEADER = '''"""Stand-in for {module}, written by cachebake's bench/vllm_ops/make_vllm_ops.py.

The real module is part of vllm {version}; only what vLLM's Mamba2 ops use is provided here.
"""
'''

VLLM_INIT = '''
import os

__version__ = "{version}"
__version_tuple__ = tuple(int(p) for p in __version__.split("."))

# vllm/env_override.py runs these at `import vllm`, before any kernel module is imported.
# TRITON_CACHE_AUTOTUNING matters: Triton reads it when an @autotune decorator runs, and it
# decides whether autotune results are written to (and read from) the cache.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")

OPS_ONLY = True  # marks this tree as the ops-only extract, not a full vLLM install
'''

TRITON_UTILS = '''
import triton
import triton.language as tl
import triton.language.extra.libdevice as tldevice

from vllm import envs

HAS_TRITON = True

if envs.VLLM_TRITON_FORCE_FIRST_CONFIG:
    # The real package patches Autotuner.run here; refuse rather than autotune differently.
    raise NotImplementedError("VLLM_TRITON_FORCE_FIRST_CONFIG is not supported by the ops extract")

LOG2E = 1.4426950408889634
LOGE2 = 0.6931471805599453

__all__ = ["HAS_TRITON", "triton", "tl", "tldevice", "LOG2E", "LOGE2"]
'''

PLATFORMS = '''
from typing import NamedTuple

import torch


class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def as_version_str(self) -> str:
        return f"{self.major}.{self.minor}"

    def to_int(self) -> int:
        return self.major * 10 + self.minor


class CudaPlatform:
    """What vllm/platforms/cuda.py answers on an NVIDIA GPU, read through torch.cuda
    (vLLM's own NonNvmlCudaPlatform reads the same values the same way)."""

    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_out_of_tree(self) -> bool:
        return False

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        try:
            major, minor = torch.cuda.get_device_capability(device_id)
        except (RuntimeError, AssertionError):  # no usable CUDA device: vLLM's NVML path gives None
            return None
        return DeviceCapability(major=major, minor=minor)

    def has_device_capability(self, capability, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current >= capability
        return current.to_int() >= capability

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current == capability
        return current.to_int() == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        return (current.to_int() // 10) == (capability // 10)

    def get_device_name(self, device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id)

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).total_memory

    def is_arch_support_pdl(self) -> bool:
        try:
            major, _ = torch.cuda.get_device_capability(torch.cuda.current_device())
        except Exception:
            return False
        return major >= 9


current_platform = CudaPlatform()

__all__ = ["current_platform", "CudaPlatform", "DeviceCapability"]
'''

LOGGER = '''
import logging
from functools import lru_cache
from types import MethodType


@lru_cache
def _once(logger: logging.Logger, level: int, msg: str, *args) -> None:
    logger.log(level, msg, *args, stacklevel=3)


def _debug_once(self, msg, *args, scope="local"):
    _once(self, logging.DEBUG, msg, *args)


def _info_once(self, msg, *args, scope="local"):
    _once(self, logging.INFO, msg, *args)


def _warning_once(self, msg, *args, scope="local"):
    _once(self, logging.WARNING, msg, *args)


def _error_once(self, msg, *args, scope="local"):
    _once(self, logging.ERROR, msg, *args)


_METHODS = {
    "debug_once": _debug_once,
    "info_once": _info_once,
    "warning_once": _warning_once,
    "error_once": _error_once,
}


def init_logger(name: str) -> logging.Logger:
    """A stdlib logger with vLLM's *_once methods, as vllm.logger.init_logger returns."""
    logger = logging.getLogger(name)
    for method_name, method in _METHODS.items():
        setattr(logger, method_name, MethodType(method, logger))
    return logger
'''

ENVS = '''
import os

# Read lazily on attribute access, as vllm/envs.py does; defaults as in vllm {version}.
_READERS = {
    "VLLM_TUNED_CONFIG_FOLDER": lambda: os.getenv("VLLM_TUNED_CONFIG_FOLDER", None),
    "VLLM_TRITON_FORCE_FIRST_CONFIG": lambda: os.environ.get(
        "VLLM_TRITON_FORCE_FIRST_CONFIG", "0"
    ).strip().lower() in ("1", "true"),
    "VLLM_SSM_CONV_STATE_LAYOUT": lambda: os.getenv("VLLM_SSM_CONV_STATE_LAYOUT", None),
}


def __getattr__(name: str):
    if name in _READERS:
        return _READERS[name]()
    raise AttributeError(f"vllm.envs stand-in has no {name} (not used by the Mamba2 ops)")


def __dir__():
    return list(_READERS)
'''

CUSTOM_OPS = '''
# vLLM's compiled CUDA ops (torch.ops._C) are not part of the ops extract.  The Triton paths
# never call them; a call fails loudly instead of silently doing something else.


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"vllm._custom_ops.{name} is a compiled vLLM op, "
                                  "not available in the ops-only extract")

    return _missing
'''

PLATFORM_UTILS = '''
import re
from functools import cache


@cache
def get_device_name_as_file_name(device_id: int = 0) -> str:
    from vllm.platforms import current_platform

    name = current_platform.get_device_name(device_id)
    return re.sub(r"[\\s/]+", "_", name)
'''

CHECKPOINT = '''
from dataclasses import dataclass

import torch


@dataclass
class MambaPrefillCheckpointMetadata:
    """The fields of vllm {version}'s dataclass; ops/ssd_checkpoint.py reads
    ``checkpoint_offsets`` and ``state_indices``."""

    checkpoint_offsets: torch.Tensor
    state_indices: torch.Tensor
    offsets: list | None = None
    query_lens: list | None = None
    request_rows: torch.Tensor | None = None
    block_cols: torch.Tensor | None = None
'''

ATTN_UTILS = '''
# Values read from vllm {version}'s vllm/v1/attention/backends/utils.py.
PAD_SLOT_ID = {PAD_SLOT_ID}
NULL_BLOCK_ID = {NULL_BLOCK_ID}
'''

# stand-in path -> body template
STANDINS = {
    "vllm/__init__.py": VLLM_INIT,
    "vllm/triton_utils/__init__.py": TRITON_UTILS,
    "vllm/platforms/__init__.py": PLATFORMS,
    "vllm/logger.py": LOGGER,
    "vllm/envs.py": ENVS,
    "vllm/_custom_ops.py": CUSTOM_OPS,
    "vllm/utils/platform_utils.py": PLATFORM_UTILS,
    "vllm/v1/attention/backends/utils.py": ATTN_UTILS,
    "vllm/model_executor/layers/mamba/checkpoint.py": CHECKPOINT,
}


def module_name(path: str) -> str:
    return path[: -len(".py")].removesuffix("/__init__").replace("/", ".")


def fill(template: str, **values: object) -> str:
    """Replace {name} placeholders only (the templates hold f-strings and dict literals)."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", str(value))
    return template


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_or_download_wheel(version: str, wheel_dir: Path) -> Path:
    """The cached wheel, else `pip download --no-deps vllm==VERSION` into wheel_dir."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    found = sorted(wheel_dir.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             f"vllm=={version}", "-d", str(wheel_dir)],
            check=True,
        )
        found = sorted(wheel_dir.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"no vllm-{version} wheel in {wheel_dir} after pip download")
    return found[-1]


def module_constants(source: str, names: list[str]) -> dict[str, object]:
    """Top-level `NAME = <literal>` assignments of a module, by parsing it (never importing)."""
    values: dict[str, object] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                values[target.id] = ast.literal_eval(node.value)
    missing = [n for n in names if n not in values]
    if missing:
        raise SystemExit(f"constants {missing} not found in the wheel; the stand-ins need updating")
    return values


class InstalledTree:
    """An installed vllm (a site-packages dir) read like its wheel: the same member names,
    each file checked against the install's RECORD hashes (so these are the wheel's bytes)."""

    def __init__(self, site: Path, version: str):
        self.site = site
        dist = site / f"vllm-{version}.dist-info"
        if not dist.is_dir():
            raise SystemExit(f"{site}: no vllm-{version}.dist-info here")
        self.dist = dist
        self.hashes: dict[str, str] = {}
        import csv  # RECORD is CSV: names with commas are quoted

        for row in csv.reader((dist / "RECORD").read_text().splitlines()):
            if len(row) >= 2 and row[1].startswith("sha256="):
                self.hashes[row[0]] = row[1][len("sha256="):]
        self.name = f"installed vllm {version} at {site}"

    def namelist(self) -> list[str]:
        return sorted(self.hashes)

    def read(self, name: str) -> bytes:
        import base64

        data = (self.site / name).read_bytes()
        want = self.hashes.get(name)
        got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if want is not None and got != want:
            raise SystemExit(f"{self.site / name}: differs from the installed RECORD (modified install?)")
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def build(wheel: Path | InstalledTree, out: Path, version: str) -> dict:
    """Write the extract into `out` (replaced whole) and return its manifest.  `wheel`: the
    released wheel, or an installed vllm checked against its RECORD."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copied: dict[str, str] = {}
    with (wheel if isinstance(wheel, InstalledTree) else zipfile.ZipFile(wheel)) as zf:
        names = zf.namelist()
        for name in names:
            if name.startswith(OPS_PREFIX) and not name.endswith("/"):
                data = zf.read(name)
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(data)
                copied[name] = sha256_bytes(data)
            elif name.endswith(LICENSE_SUFFIX):
                data = zf.read(name)
                (tmp / "vllm" / "LICENSE").parent.mkdir(parents=True, exist_ok=True)
                (tmp / "vllm" / "LICENSE").write_bytes(data)
                copied["vllm/LICENSE"] = sha256_bytes(data)
        if not any(n.startswith(OPS_PREFIX) for n in copied):
            raise SystemExit(f"{wheel} holds no {OPS_PREFIX}")
        consts = module_constants(
            zf.read("vllm/v1/attention/backends/utils.py").decode(), ["PAD_SLOT_ID", "NULL_BLOCK_ID"]
        )

    written: list[str] = []
    for path in PACKAGE_INITS:
        p = tmp / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(fill(HEADER, module=module_name(path), version=version))
        written.append(path)
    for path, body in STANDINS.items():
        p = tmp / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(fill(HEADER + body, module=module_name(path), version=version, **consts))
        written.append(path)

    manifest = {
        "vllm_version": version,
        "wheel": wheel.name,
        "wheel_sha256": (None if isinstance(wheel, InstalledTree)
                         else sha256_bytes(wheel.read_bytes())),
        "copied_from_wheel": copied,
        "stand_ins": sorted(written),
        "constants": consts,
    }
    (tmp / "vllm_ops_manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output dir (put it on sys.path)")
    ap.add_argument("--wheel-dir", type=Path, default=DEFAULT_WHEEL_DIR, help="wheel cache, outside the repo")
    ap.add_argument("--version", default=DEFAULT_VERSION)
    ap.add_argument("--from-site", type=Path, default=None,
                    help="copy from an installed vllm (its site-packages dir) instead of the wheel")
    args = ap.parse_args(argv)
    if args.from_site is not None:
        wheel = InstalledTree(args.from_site, args.version)
    else:
        wheel = find_or_download_wheel(args.version, args.wheel_dir)
    manifest = build(wheel, args.out, args.version)
    n_files = len(manifest["copied_from_wheel"])
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {n_files} files from {wheel.name}, {len(manifest['stand_ins'])} stand-ins, "
          f"{size / 1e6:.2f} MB; use PYTHONPATH={args.out}")


if __name__ == "__main__":
    main()

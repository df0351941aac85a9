"""The compatibility fingerprint: everything in Triton's cache key that differs between machines.

A baked cache only hits where every input of the key matches (shared/FACTS.md, "The cache key"):
the exact Triton wheel (``triton_key()`` hashes its sources and libtriton.so, so the Python tag
matters too), the ptxas that the backend hashes, the GPU target, and each cache-invalidating
environment variable that is set.  vLLM's kernels also pick configs by GPU *name* (H100 and
H200 are both sm_90), and torch/vllm versions change kernel sources.  ``current_fingerprint``
reads all of that from the running process; ``compare_fingerprints`` turns differences into
one-line reasons an operator can act on.

Reading is cheap on purpose: versions come from package metadata, the GPU from nvidia-smi
(or NVML through ``pynvml``, or the AMD KFD topology in sysfs), ptxas from Triton's bundled
binary; torch is never imported unless a caller asks (``allow_torch``: Triton's driver query
imports it, seconds an init container should not spend).  Triton is imported only if it is
installed, so an init container without Triton can still compare against a fingerprint file
written in the serving image.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from cachebake.errors import BadInput

_TARGET_RE = re.compile(r"^(?:(?P<sm>sm_)(?P<smarch>\d+)a?|(?P<backend>cuda|hip):(?P<arch>\w+)|(?P<gfx>gfx\w+))$")

# GPU architectures that exist, so a typo (sm_999, gfx9420) is refused instead of packed and
# installed under a target no GPU has.  CUDA compute capabilities from NVIDIA's table
# (https://developer.nvidia.com/cuda-gpus: V100 70 ... H100/H200 90, B200 100, B300 103,
# Thor 110, RTX 50 120, GB10 121); AMD gfx names from the ROCm GPU list
# (https://rocm.docs.amd.com/en/latest/reference/gpu-arch-specs.html) that Triton's AMD
# backend targets.  A new GPU means one entry here.
KNOWN_CUDA_ARCHS = (70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)
KNOWN_HIP_ARCHS = ("gfx908", "gfx90a", "gfx942", "gfx950", "gfx1030", "gfx1100", "gfx1101",
                   "gfx1102", "gfx1200", "gfx1201")


@dataclass(frozen=True)
class GPUTargetSpec:
    """A Triton GPUTarget, spelled ``cuda:90`` in manifests and ``sm_90`` on the command line."""

    backend: str
    arch: int | str
    warp_size: int

    @classmethod
    def parse(cls, text: str) -> "GPUTargetSpec":
        m = _TARGET_RE.match(text.strip())
        if not m:
            raise BadInput(f"unrecognised GPU target {text!r}: use e.g. sm_90, cuda:90 or gfx942")
        if m["sm"]:
            spec = cls("cuda", int(m["smarch"]), 32)
        elif m["gfx"]:
            spec = cls("hip", m["gfx"], 64)
        elif m["backend"] == "cuda":
            if not m["arch"].isdigit():
                raise BadInput(f"unrecognised CUDA target {text!r}: the arch is a number, e.g. cuda:90")
            spec = cls("cuda", int(m["arch"]), 32)
        else:
            spec = cls("hip", m["arch"], 64)
        known = KNOWN_CUDA_ARCHS if spec.backend == "cuda" else KNOWN_HIP_ARCHS
        if spec.arch not in known:
            names = ", ".join(cls(spec.backend, a, spec.warp_size).ref_name for a in known)
            raise BadInput(f"unknown GPU target {text!r} (known: {names})")
        return spec

    @property
    def key(self) -> str:
        return f"{self.backend}:{self.arch}"

    @property
    def ref_name(self) -> str:
        """The OCI ref name of this target's bake: ``sm_90`` or ``gfx942``."""
        return f"sm_{self.arch}" if self.backend == "cuda" else str(self.arch)


@dataclass
class Fingerprint:
    target: str  # "cuda:90"
    triton_version: str | None = None
    triton_key: str | None = None
    python_tag: str | None = None  # cpython-312 + platform ABI: the wheel triton_key was hashed from
    ptxas: str | None = None  # the backend hash: full `ptxas --version` text + arch
    gpu_name: str | None = None  # None where no GPU was visible (e.g. --target on a CPU builder)
    env: dict[str, str] = field(default_factory=dict)  # cache-invalidating vars that are set
    torch_version: str | None = None
    vllm_version: str | None = None
    bake_paths: dict[str, str] = field(default_factory=dict)  # role -> absolute path baked at

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Fingerprint":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if "target" not in data:
            raise BadInput("fingerprint has no 'target'")
        # Fields we don't know come from a newer cachebake; ignoring them is safe because
        # compare_fingerprints only reasons about fields it knows.
        return cls(**{k: v for k, v in data.items() if k not in unknown})

    @classmethod
    def load(cls, path: os.PathLike | str) -> "Fingerprint":
        try:
            data = json.loads(Path(path).read_text())
        except OSError as e:
            raise BadInput(f"cannot read fingerprint file {path}: {e.strerror}") from None
        except ValueError as e:
            raise BadInput(f"fingerprint file {path} is not JSON: {e}") from None
        return cls.from_dict(data.get("fingerprint", data))


@dataclass(frozen=True)
class Mismatch:
    field: str
    baked: object
    current: object
    consequence: str

    def __str__(self) -> str:
        return f"{self.field}: baked {_short(self.baked)}, here {_short(self.current)} -> {self.consequence}"


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    text = " ".join(str(text).split())
    return text if len(text) <= 90 else text[:87] + "..."


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def python_tag() -> str:
    return f"{sys.implementation.cache_tag}{sysconfig.get_config_var('EXT_SUFFIX') or ''}"


def _first_visible_cuda_device() -> str | None:
    """The device (index or UUID) CUDA would use first: the first of CUDA_VISIBLE_DEVICES, "0"
    when it is unset; None when it hides every device ("" or "-1", as CUDA reads it)."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "0"
    first = value.split(",")[0].strip()
    return None if not first or first.startswith("-") else first


def _nvidia_smi_gpu() -> tuple[GPUTargetSpec, str] | None:
    """Name and compute capability from nvidia-smi: no CUDA context and no torch import (Triton's
    driver query imports torch, seconds an init container should not spend)."""
    smi = shutil.which("nvidia-smi")
    dev = _first_visible_cuda_device()
    if not smi or dev is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader", "-i", dev],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    line = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    name, _, cap = line.rpartition(",")
    major, _, minor = cap.strip().partition(".")
    if not (name and major.isdigit() and minor.isdigit()):
        return None
    return GPUTargetSpec("cuda", int(major) * 10 + int(minor), 32), name.strip()


def _nvml_gpu() -> tuple[GPUTargetSpec, str] | None:
    """The same through NVML's Python binding (``nvidia-ml-py``, which vLLM depends on), for
    images that carry the driver's library but not the nvidia-smi binary."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        dev = _first_visible_cuda_device()
        if dev is None:
            return None
        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(dev)) if dev.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(dev))
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no device: pynvml raises its own NVMLError family
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return GPUTargetSpec("cuda", int(major) * 10 + int(minor), 32), name


# The amdgpu kernel driver publishes each GPU's ISA here (``gfx_target_version 90402`` is
# gfx942: major * 10000 + minor * 100 + stepping, the stepping in hex in the gfx name).
KFD_TOPOLOGY = "/sys/class/kfd/kfd/topology/nodes"


def _kfd_gpu() -> tuple[GPUTargetSpec, None] | None:
    try:
        nodes = sorted(os.listdir(KFD_TOPOLOGY), key=lambda n: int(n) if n.isdigit() else 0)
    except OSError:
        return None
    for node in nodes:
        try:
            props = Path(KFD_TOPOLOGY, node, "properties").read_text()
        except OSError:
            continue
        m = re.search(r"^gfx_target_version (\d+)$", props, re.M)
        version = int(m.group(1)) if m else 0
        if version:  # CPU nodes report 0
            arch = f"gfx{version // 10000}{(version // 100) % 100}{version % 100:x}"
            return GPUTargetSpec("hip", arch, 64), None
    return None


def visible_gpu(allow_torch: bool = False) -> tuple[GPUTargetSpec, str | None] | None:
    """The GPU this process would run on, or None: nvidia-smi, NVML, the AMD KFD topology;
    then, only with ``allow_torch``, Triton's active driver (which imports torch)."""
    for probe in (_nvidia_smi_gpu, _nvml_gpu, _kfd_gpu):
        seen = probe()
        if seen is not None:
            return seen
    if not allow_torch:
        return None
    try:
        from triton.runtime import driver

        t = driver.active.get_current_target()
    except Exception:
        return None
    return GPUTargetSpec(t.backend, t.arch, t.warp_size), None


def resolve_target(target: str | None, allow_torch: bool = False) -> tuple[GPUTargetSpec, str | None]:
    """``--target`` if given, else the visible GPU; a clear error if neither exists."""
    seen = visible_gpu(allow_torch)
    if target:
        spec = GPUTargetSpec.parse(target)
        # The name is only trustworthy when the visible GPU is the one asked for.
        name = seen[1] if seen and seen[0] == spec else None
        return spec, name
    if seen is None:
        raise BadInput("no GPU is visible here: pass --target (e.g. --target sm_90)")
    return seen


def current_fingerprint(target: str | None = None, bake_paths: dict[str, str] | None = None,
                        allow_torch: bool = False) -> Fingerprint:
    spec, gpu_name = resolve_target(target, allow_torch)
    fp = Fingerprint(
        target=spec.key,
        gpu_name=gpu_name,
        python_tag=python_tag(),
        torch_version=_dist_version("torch"),
        vllm_version=_dist_version("vllm"),
        bake_paths=dict(bake_paths or {}),
    )
    try:
        import triton
        from triton._C.libtriton import get_cache_invalidating_env_vars
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.cache import triton_key
    except ImportError:
        return fp  # no Triton here: compare against a fingerprint file from the serving image
    fp.triton_version = triton.__version__
    fp.triton_key = triton_key()
    fp.env = dict(sorted(get_cache_invalidating_env_vars().items()))
    try:
        fp.ptxas = make_backend(GPUTarget(spec.backend, spec.arch, spec.warp_size)).hash()
    except Exception as e:  # a target this Triton has no backend or assembler for
        raise BadInput(f"Triton {triton.__version__} cannot target {spec.key}: {e}") from None
    return fp


# field -> what happens at serve time when it differs
_CONSEQUENCES = {
    "target": "the bake holds no kernels for this GPU: every kernel compiles at first use",
    "triton_version": "another Triton: every kernel recompiles at first use",
    "triton_key": "another Triton build (wheel or Python tag): every kernel recompiles at first use",
    "python_tag": "another Python ABI: Triton's key and its launcher .so differ, every kernel recompiles",
    "ptxas": "another ptxas: every kernel recompiles at first use",
    "env": "cache-invalidating variables differ: every kernel recompiles at first use",
    "gpu_name": "vLLM picks kernel configs by GPU name: some kernels recompile and re-autotune",
    "torch_version": "another torch: Inductor and torch.compile caches miss, Triton kernels it generates recompile",
    "vllm_version": "another vLLM: kernels whose source changed recompile and re-autotune",
}


def compare_fingerprints(baked: Fingerprint, current: Fingerprint) -> list[Mismatch]:
    """One Mismatch per field that would make the bake miss.  A value unknown on one side
    (None: not installed, or no GPU visible) is not a difference we can prove, except for
    Triton itself, without which nothing hits."""
    out: list[Mismatch] = []
    for name, consequence in _CONSEQUENCES.items():
        b, c = getattr(baked, name), getattr(current, name)
        if b == c:
            continue
        if name in ("gpu_name", "torch_version", "vllm_version") and (b is None or c is None):
            continue
        out.append(Mismatch(name, b, c, consequence))
    return out

"""GPU targets and the GPU this process would run on.

A target is spelled ``cuda:90`` in manifests and ``sm_90`` on the command line
(``GPUTargetSpec``); a typo is refused, not packed under a target no GPU has.  The visible GPU
is read cheaply (``visible_gpu``): nvidia-smi, NVML through ``pynvml``, or the AMD KFD topology
in sysfs; torch is never imported unless a caller asks (``allow_torch``: Triton's driver query
imports it, seconds an init container should not spend).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
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

"""Cross-target warmups: run a warmup on this GPU while Triton compiles for another one.

``cachebake build --target sm_120`` on an sm_90 builder sets ``CACHEBAKE_CROSS_TARGET`` (and
``CACHEBAKE_GPU_NAME`` from ``--gpu-name``) in the bake env; the monitor calls
``activate_from_env`` in every process when Triton is imported.  Then:

* Triton's active driver answers ``get_current_target()`` with the requested target, so the JIT
  specializes, keys and compiles every launch for it (the backend, ptxas and options all come
  from the target, as on a real GPU of that arch);
* a kernel compiled for that target is never loaded or launched (its cubin cannot run here):
  its launcher helper is still built, as a first launch would, and the launch is skipped.
  Autotuners then "benchmark" skipped launches: every candidate config compiles, and the
  timings are meaningless, so the bake must not ship them (``seed.BakePrep.finish`` drops
  autotune results of cross bakes);
* host code that asks which GPU it runs on gets the target's answer: ``torch.cuda``'s device
  name and capability, and vLLM's CUDA platform (device-name-keyed config tables such as the
  selective_state_update JSON files are resolved for ``--gpu-name``).

Where this breaks: kernels do not run, so their outputs are whatever the buffers held.  Host
code that reads device values back (``.item()``, ``.tolist()``, a max over a kernel's output
to size the next launch, data-dependent early exits) sees garbage and may pick other
specializations than a real server on the target would, or fail.  Host code that queries the
device through anything but the patched calls (``torch.cuda.get_device_properties``, NVML,
CUDA directly) still sees this GPU.  Shapes and dtypes must not depend on kernel results.
Nothing here has run on an sm_120 GPU: a cross-baked artifact says so in its index entry
until ``cachebake verify`` has run on the target.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from typing import Callable

CROSS_TARGET_ENV = "CACHEBAKE_CROSS_TARGET"  # "cuda:120": compile for it, skip launches
GPU_NAME_ENV = "CACHEBAKE_GPU_NAME"  # the target GPU's name, as torch/vLLM report it

_active: dict = {}


def activate_from_env() -> bool:
    target = os.environ.get(CROSS_TARGET_ENV)
    if not target:
        return False
    activate(target, os.environ.get(GPU_NAME_ENV) or None)
    return True


def activate(target_text: str, gpu_name: str | None = None) -> None:
    """Patch this process for a cross-target warmup (idempotent)."""
    from triton.backends.compiler import GPUTarget

    from cachebake.gpu import GPUTargetSpec

    spec = GPUTargetSpec.parse(target_text)
    target = GPUTarget(spec.backend, spec.arch, spec.warp_size)
    if _active.get("target") == target:
        return
    _active.update(target=target, gpu_name=gpu_name)
    _retarget_driver(target)
    _skip_launches(target)
    capability = divmod(int(spec.arch), 10) if spec.backend == "cuda" else None
    after_import("torch.cuda", lambda mod: _patch_torch(mod, gpu_name, capability))
    after_import("vllm.platforms.cuda", lambda mod: _patch_vllm(mod, gpu_name, capability))


def _retarget_driver(target) -> None:
    from triton.runtime.driver import DriverConfig

    if getattr(DriverConfig.active.fget, "_cachebake_cross", False):
        return
    original = DriverConfig.active

    def active(self):
        drv = original.fget(self)
        if drv.__dict__.get("_cachebake_target") != target:
            drv.get_current_target = lambda: target  # the instance's answer shadows the class's
            drv._cachebake_target = target
        return drv

    active._cachebake_cross = True
    DriverConfig.active = property(active)


def _skip_launches(target) -> None:
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.driver import driver

    original = CompiledKernel._init_handles
    if getattr(original, "_cachebake_cross", False):
        return

    def _init_handles(self):
        if self.module is not None:
            return
        t = self.metadata.target
        if (t.backend, t.arch) != (target.backend, target.arch):
            return original(self)
        # Build the launcher helper as a first launch would (host code, target-independent),
        # then never load the cubin: it is for a GPU that is not here.
        driver.active.launcher_cls(self.src, self.metadata)
        self._run = _skipped_launch
        self.module, self.function = 0, 0
        self.n_regs, self.n_spills, self.n_max_threads = 0, 0, 1024

    _init_handles._cachebake_cross = True
    CompiledKernel._init_handles = _init_handles


def _skipped_launch(*args, **kwargs) -> None:
    return None


def _patch_torch(cuda, gpu_name: str | None, capability) -> None:
    if gpu_name:
        cuda.get_device_name = lambda device=None: gpu_name
    if capability:
        cuda.get_device_capability = lambda device=None: tuple(capability)


def _patch_vllm(mod, gpu_name: str | None, capability) -> None:
    """vLLM's CUDA platforms read the device through NVML or torch (vllm/platforms/cuda.py)."""
    cap_type = getattr(mod, "DeviceCapability", None)
    for cls_name in ("CudaPlatformBase", "NvmlCudaPlatform", "NonNvmlCudaPlatform"):
        cls = getattr(mod, cls_name, None)
        if cls is None:
            continue
        if gpu_name:
            cls.get_device_name = classmethod(lambda cls, device_id=0: gpu_name)
        if capability and cap_type is not None:
            cls.get_device_capability = classmethod(
                lambda cls, device_id=0: cap_type(major=capability[0], minor=capability[1]))


def after_import(name: str, patch: Callable) -> None:
    """Run ``patch(module)`` now if ``name`` is imported, else right after its import."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    sys.meta_path.insert(0, _PostImport(name, patch))


class _PostImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, patch: Callable):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, patch = spec.loader.exec_module, self.patch

        def exec_then_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch
        return spec

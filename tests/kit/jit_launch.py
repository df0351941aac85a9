"""Real JIT launches on a CPU machine, for one chosen GPU target: a stand-in for the GPU.

Triton's JIT (``JITFunction.run``) specializes arguments, computes the key and compiles through
the *active driver*; Triton's own tests swap that driver with ``triton.runtime.driver.set_active``.
``TargetDriver`` is such a driver for a CUDA target we do not have: it answers
``get_current_target()`` with the chosen target, and stands in for the parts that need a GPU
(loading a cubin, launching it, timing it), which it does not do.  Everything Triton computes
before a launch -- specialization, keys, compiles, autotune configs and result files -- is
Triton's own code.  This is a mock of the CUDA runtime only; it is here because nothing real
can load a cubin without a GPU.

``python tests/kit/jit_launch.py --arch 90`` runs one "warmup": launches of the kernels in
tests/kit/replay_kernels.py (plain, a jit function as constexpr, autotuned), for a bake test.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


class _NoLauncher:
    def __init__(self, src, metadata):
        pass

    def __call__(self, *args, **kwargs):
        return None


class _Utils:
    @staticmethod
    def get_device_properties(device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132}

    @staticmethod
    def load_binary(name, kernel, shared, device):
        return 1, 1, 64, 0, 1024  # module, function, n_regs, n_spills, n_max_threads


class TargetDriver(DriverBase):
    """The active driver for a CUDA target with no GPU: keys and compiles are Triton's."""

    launcher_cls = _NoLauncher
    utils = _Utils()

    def __init__(self, arch: int):
        super().__init__()
        self.target = GPUTarget("cuda", arch, 32)
        self._timing = itertools.count(1)

    @classmethod
    def is_active(cls):
        return False

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        raise RuntimeError("no torch device: CPU stand-in")

    def get_benchmarker(self):
        def bench(kernel_call, quantiles=None):
            kernel_call()  # the launch (skipped by _NoLauncher); the JIT compiled it
            t = 0.01 * (1 + next(self._timing) % 5)  # made-up timings: there is no GPU to time
            return [t, t * 0.9, t * 1.1]

        return bench


class DType:
    """A torch-like dtype: the JIT reads ``str(arg.dtype)``."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self):
        return self.name


F32, F16, BF16 = DType("torch.float32"), DType("torch.float16"), DType("torch.bfloat16")


class Tensor:
    """What the JIT reads from a tensor argument: ``data_ptr()`` (alignment) and ``dtype``."""

    def __init__(self, dtype: DType, ptr: int = 1 << 20):
        self.dtype, self.ptr = dtype, ptr

    def data_ptr(self):
        return self.ptr


def use_target(arch: int) -> TargetDriver:
    drv = TargetDriver(arch)
    triton.runtime.driver.set_active(drv)
    return drv


def warmup(arch: int) -> None:
    """The launches a test bake records: 3 kernels, several specializations, one autotuned."""
    import replay_kernels as rk

    use_target(arch)
    x, y, o = Tensor(F32), Tensor(F32), Tensor(F32)
    rk.add_kernel[(1,)](x, y, o, 4096, BLOCK=128)
    rk.add_kernel[(1,)](Tensor(F16), Tensor(F16, ptr=(1 << 20) + 2), Tensor(F16), 1000, BLOCK=256, num_warps=8)
    rk.map_kernel[(1,)](x, o, 4096, FN=rk.square, BLOCK=64)
    rk.tuned_kernel[(1,)](x, o, 4096)
    rk.tuned_kernel[(1,)](Tensor(BF16), Tensor(BF16), 4096)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    warmup(ap.parse_args().arch)

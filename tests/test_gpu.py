"""GPU targets and the visible GPU: spellings, refusals, and what nvidia-smi, NVML and the AMD
KFD topology say (stand-ins on this machine, which has no GPU)."""

from __future__ import annotations

import os
import stat

import pytest

from cachebake.artifact.fingerprint import current_fingerprint
from cachebake.errors import BadInput
from cachebake.gpu import GPUTargetSpec, resolve_target


@pytest.mark.parametrize("text,key,ref", [("sm_90", "cuda:90", "sm_90"), ("cuda:120", "cuda:120", "sm_120"),
                                          ("sm_90a", "cuda:90", "sm_90"), ("gfx942", "hip:gfx942", "gfx942")])
def test_target_spellings(text, key, ref):
    spec = GPUTargetSpec.parse(text)
    assert (spec.key, spec.ref_name) == (key, ref)


def test_no_gpu_and_no_target_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    with pytest.raises(BadInput, match="pass --target"):
        resolve_target(None)


def _fake_nvidia_smi(tmp_path, monkeypatch, line: str):
    # This machine has no GPU; a stand-in answers the one query cachebake makes, in the format
    # `nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader` prints.
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_visible_gpu_name_and_capability_from_nvidia_smi(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0")
    spec, name = resolve_target(None)
    assert (spec.key, name) == ("cuda:90", "NVIDIA H200")
    fp = current_fingerprint()
    assert fp.target == "cuda:90" and fp.gpu_name == "NVIDIA H200" and fp.ptxas.endswith("-90")
    # --target for another GPU than the visible one: the name is not that GPU's
    assert resolve_target("sm_120")[1] is None


def test_cuda_visible_devices_hiding_every_gpu_is_no_gpu(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA H200, 9.0")
    for hidden in ("", "-1"):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", hidden)
        with pytest.raises(BadInput, match="pass --target"):
            resolve_target(None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert resolve_target(None)[1] == "NVIDIA H200"


def test_unparseable_nvidia_smi_is_no_gpu(tmp_path, monkeypatch):
    _fake_nvidia_smi(tmp_path, monkeypatch, "No devices were found")
    with pytest.raises(BadInput, match="pass --target"):
        resolve_target(None)


@pytest.mark.parametrize("text", ["sm_999", "sm_91", "cuda:1", "gfx9420", "hip:gfx000"])
def test_targets_no_gpu_has_are_refused(text):
    with pytest.raises(BadInput, match="unknown GPU target"):
        GPUTargetSpec.parse(text)


def test_amd_gpu_from_the_kfd_topology(tmp_path, monkeypatch):
    """The amdgpu driver's sysfs topology, as it lays it out (a CPU node reports version 0);
    this machine has no AMD GPU, so the tree is a stand-in."""
    from cachebake import gpu

    for node, version in (("0", 0), ("1", 90402), ("2", 90010)):
        (tmp_path / node).mkdir()
        (tmp_path / node / "properties").write_text(
            f"cpu_cores_count 0\ngfx_target_version {version}\nsimd_count 304\n")
    monkeypatch.setattr(gpu, "KFD_TOPOLOGY", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert resolve_target(None) == (GPUTargetSpec.parse("gfx942"), None)
    (tmp_path / "1" / "properties").write_text("gfx_target_version 110000\n")
    assert resolve_target(None)[0].key == "hip:gfx1100"
    (tmp_path / "1" / "properties").write_text("gfx_target_version 0\n")
    assert resolve_target(None)[0].key == "hip:gfx90a"  # 9.0.10: the stepping is hex


def test_no_torch_unless_asked(tmp_path, monkeypatch):
    """Without a GPU tool, the visible GPU is not looked up through Triton's driver (which
    imports torch) unless the caller asks."""
    import sys

    from cachebake.gpu import visible_gpu

    monkeypatch.setenv("PATH", str(tmp_path))
    asked = []
    fake = type(sys)("triton.runtime.driver")
    fake.active = type("A", (), {"get_current_target": lambda self: asked.append(1) or
                                 type("T", (), {"backend": "cuda", "arch": 90, "warp_size": 32})()})()
    monkeypatch.setitem(sys.modules, "triton.runtime.driver", fake)
    import triton.runtime

    monkeypatch.setattr(triton.runtime, "driver", fake, raising=False)
    assert visible_gpu() is None and asked == []
    assert visible_gpu(allow_torch=True)[0].key == "cuda:90" and asked == [1]

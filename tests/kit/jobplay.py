"""Play a `cachebake bake-job` Job under podman 4.3, which cannot play a Job.

podman 4.3's `kube play` plays Pods, Deployments, PersistentVolumeClaims and ConfigMaps, not
``batch/v1`` Jobs (podman 4.3.1 refuses the document: no kind it knows).  A Job's work is its Pod
template: ``pod_of_job`` turns the Job into that Pod, every field carried as written or refused,
so a play cannot pass on a field it silently dropped.  What each Job field becomes:

- ``metadata.name``: the Pod's name (the Job controller adds a random suffix; one Pod here);
  ``metadata.labels`` and the template's labels: the Pod's labels;
- ``spec.backoffLimit``: must be 0 (one Pod, no retry: restartPolicy Never, as written);
- ``spec.activeDeadlineSeconds``: returned; the player waits at most that long, then fails;
- ``spec.ttlSecondsAfterFinished``: the player removes the Pod once it has read its outcome;
- the template's Pod spec: as written, with these fields allowed and nothing else (an unknown
  field is refused, naming it): restartPolicy Never, securityContext, initContainers,
  containers (name, image, command, env name/value, volumeMounts, securityContext), emptyDir
  volumes.

What the stand-in cannot honour is a GPU node: ``nodeSelector: {nvidia.com/gpu.product: P}``
(no scheduler, no nodes) and ``resources.limits: {nvidia.com/gpu: N}`` (no device plugin, no
GPU).  In their place the Pod runs on a stand-in node of product P: each container that holds
the GPU gets that node's ``nvidia-smi`` (a file answering the two queries cachebake and the
stand-in warmup make with P's name and compute capability, mounted read-only at
/usr/local/bin/nvidia-smi as the NVIDIA container toolkit mounts the driver's), and no GPU.
``stood_in`` lists each such field; the test asserts the list.  A real cluster runs the Job as
written: the GPU's driver answers instead of the file, and Triton compiles for what it reports.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
SMI_PATH = "/usr/local/bin/nvidia-smi"

_JOB_KEYS = {"apiVersion", "kind", "metadata", "spec"}
_META_KEYS = {"name", "labels"}
_JOB_SPEC_KEYS = {"backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "template"}
_POD_KEYS = {"restartPolicy", "nodeSelector", "securityContext", "initContainers", "containers", "volumes"}
_CONTAINER_KEYS = {"name", "image", "command", "env", "volumeMounts", "securityContext", "resources"}
_POD_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup"}
_CONTAINER_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "allowPrivilegeEscalation",
                       "readOnlyRootFilesystem", "capabilities"}


class CannotPlay(AssertionError):
    """A Job field this player cannot honour and does not stand in for."""


@dataclass(frozen=True)
class StandInNode:
    product: str  # the nvidia.com/gpu.product label, e.g. NVIDIA-H200
    gpu_name: str  # what nvidia-smi prints, e.g. NVIDIA H200
    compute_cap: str  # e.g. 9.0

    def nvidia_smi(self) -> str:
        # Answers `--query-gpu=name,compute_cap` (cachebake.gpu) and `--query-gpu=compute_cap`
        # (tests/kit/aot_kernels.py --visible-gpu), `--format=csv,noheader`, as the real one prints.
        # The values are the test's own constants, checked below to be shell-safe.
        for v in (self.gpu_name, self.compute_cap):
            if not all(c.isalnum() or c in " .-" for c in v):
                raise CannotPlay(f"stand-in node value {v!r} is not plain text")
        return ("#!/bin/sh\n"
                'case "$1" in\n'
                f"  --query-gpu=name,compute_cap) echo '{self.gpu_name}, {self.compute_cap}' ;;\n"
                f"  --query-gpu=compute_cap) echo '{self.compute_cap}' ;;\n"
                "  *) echo \"stand-in nvidia-smi: $1 is not answered\" >&2; exit 2 ;;\n"
                "esac\n")


@dataclass
class PlayablePod:
    pod: dict
    deadline: int  # seconds (the Job's activeDeadlineSeconds)
    node: StandInNode
    stood_in: list[str]  # the Job's fields a stand-in took the place of


def _only(what: str, doc: dict, allowed: set[str]) -> None:
    extra = sorted(set(doc) - allowed)
    if extra:
        raise CannotPlay(f"{what}: {extra} cannot be played here (not honoured, not stood in for)")


def pod_of_job(job: dict, nodes: list[StandInNode], smi_dir: Path) -> PlayablePod:
    """The Job's Pod, as podman 4.3 plays it, on the stand-in node its nodeSelector picks;
    the node's nvidia-smi is written into ``smi_dir`` (a hostPath the Pod mounts)."""
    _only("Job", job, _JOB_KEYS)
    if (job["apiVersion"], job["kind"]) != ("batch/v1", "Job"):
        raise CannotPlay(f"not a batch/v1 Job: {job['apiVersion']} {job['kind']}")
    _only("Job metadata", job["metadata"], _META_KEYS)
    spec = job["spec"]
    _only("Job spec", spec, _JOB_SPEC_KEYS)
    if spec.get("backoffLimit", 6) != 0:
        raise CannotPlay("backoffLimit > 0: a retried Pod is not played here")
    template = spec["template"]
    _only("Pod template", template, {"metadata", "spec"})
    _only("Pod template metadata", template.get("metadata", {}), {"labels"})
    pod_spec = copy.deepcopy(template["spec"])
    _only("Pod spec", pod_spec, _POD_KEYS)
    if pod_spec.get("restartPolicy") != "Never":
        raise CannotPlay("a Job's Pod here must have restartPolicy Never")
    _only("Pod securityContext", pod_spec.get("securityContext", {}), _POD_SECURITY)
    stood_in = []
    selector = pod_spec.pop("nodeSelector", {})
    _only("nodeSelector", selector, {PRODUCT_LABEL})
    product = selector.get(PRODUCT_LABEL)
    (node,) = [n for n in nodes if n.product == product] or [None]
    if node is None:
        raise CannotPlay(f"no stand-in node has {PRODUCT_LABEL}={product!r}")
    stood_in.append(f"nodeSelector {PRODUCT_LABEL}={product}")
    for v in pod_spec["volumes"]:
        if set(v) != {"name", "emptyDir"} or v["emptyDir"]:
            raise CannotPlay(f"volume {v.get('name')!r}: only plain emptyDirs are played here")
    smi = smi_dir / f"nvidia-smi-{node.product}"
    smi.write_text(node.nvidia_smi())
    smi.chmod(0o755)
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        _only(f"container {c.get('name')}", c, _CONTAINER_KEYS)
        _only(f"container {c['name']} securityContext", c.get("securityContext", {}), _CONTAINER_SECURITY)
        for e in c.get("env", []):
            _only(f"container {c['name']} env", e, {"name", "value"})
        for m in c.get("volumeMounts", []):
            _only(f"container {c['name']} volumeMount", m, {"name", "mountPath", "readOnly"})
        resources = c.pop("resources", {})
        _only(f"container {c['name']} resources", resources, {"limits"})
        _only(f"container {c['name']} limits", resources.get("limits", {}), {GPU_RESOURCE})
        if GPU_RESOURCE in resources.get("limits", {}):
            stood_in.append(f"container {c['name']} resources.limits {GPU_RESOURCE}="
                            f"{resources['limits'][GPU_RESOURCE]}")
            c.setdefault("volumeMounts", []).append({"name": "stand-in-nvidia-smi", "mountPath": SMI_PATH,
                                                     "readOnly": True})
    if any(s.startswith("container ") for s in stood_in):
        pod_spec["volumes"].append({"name": "stand-in-nvidia-smi",
                                    "hostPath": {"path": str(smi), "type": "File"}})
    labels = {**job["metadata"].get("labels", {}), **template.get("metadata", {}).get("labels", {})}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": job["metadata"]["name"], "labels": labels},
           "spec": pod_spec}
    return PlayablePod(pod, int(spec["activeDeadlineSeconds"]), node, stood_in)

"""The bake matrix on Kubernetes: one Job per (GPU, recipe), each baking on a node of that GPU.

One machine cannot bake GPU types x models x vLLM versions; the cluster the fleet already runs
on has every GPU it serves on.  ``bake_jobs`` writes one ``batch/v1`` Job per pair:

- the Pod lands on a node of the GPU: ``nodeSelector`` on GPU Feature Discovery's
  ``nvidia.com/gpu.product`` label (``NVIDIA-H200``: the product name, spaces as '-'), given
  with the GPU target it is (``--gpu NVIDIA-H200=sm_90``); ``cachebake build --target`` then
  refuses to bake if the GPU it sees is not that target;
- ``bake`` (an init container, holding ``nvidia.com/gpu``) runs ``cachebake build --model
  RECIPE --driver D --target T --out /work/bake`` in the builder image (vLLM + cachebake, e.g.
  the Dockerfile's build stage), with its caches under ``/work/root``; ``push`` (the container,
  after it) runs ``cachebake push /work/bake docker://REPO/RECIPE``, which tags the bake
  ``:sm_90``: the Jobs of one recipe fill one repository, one tag per GPU target, which is
  what ``install docker://REPO/RECIPE`` and an image volume read (``merge`` makes one local
  artifact of them);
- both run as uid 65534 with a read-only root filesystem, no privilege escalation and no
  capabilities; ``/work`` and ``/tmp`` are emptyDirs (HOME is ``/work/home``: vLLM writes its
  config and caches under HOME); ``backoffLimit: 0`` (a failed bake is looked at, not retried
  on a GPU), ``activeDeadlineSeconds`` bounds a stuck one, and the Job removes itself a day
  after it finished.

Every command is an argv list (``command:``), never a shell string; recipes are the bundled
ones (a local model directory does not exist in the Pod), their names checked against the
recipe list before they reach a name, a label or a reference; the documents are written by
PyYAML through cachebake.distribute.k8s's ``render`` (each parsed back and compared) and joined
as a multi-document stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cachebake.errors import BadInput
from cachebake.gpu import GPUTargetSpec

NONROOT_UID = 65534
WORK = "/work"
OUT = f"{WORK}/bake"
AUTH_DIR = "/cachebake-auth"
PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery's product label
GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_DEADLINE = 4 * 3600  # seconds: a cold vLLM bake is minutes; a stuck one is stopped
TTL_AFTER_FINISHED = 24 * 3600
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)\Z")
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?\Z")
_REPO = re.compile(r"^(?:docker|oci)://[^\s:@/]+(?::\d+)?(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*\Z")


@dataclass(frozen=True)
class GPUNode:
    product: str  # the nvidia.com/gpu.product label value
    target: GPUTargetSpec

    @classmethod
    def parse(cls, text: str) -> "GPUNode":
        product, sep, target = text.rpartition("=")
        if not sep or not product:
            raise BadInput(f"--gpu {ascii(text)}: give PRODUCT=TARGET, e.g. NVIDIA-H200=sm_90")
        if not _LABEL_VALUE.match(product):
            raise BadInput(f"--gpu {ascii(text)}: {ascii(product)} is not a Kubernetes label value "
                           f"(GPU Feature Discovery's {PRODUCT_LABEL}, e.g. NVIDIA-H200)")
        return cls(product, GPUTargetSpec.parse(target))


@dataclass
class BakeJobPlan:
    builder_image: str
    repository: str  # docker://HOST/PATH: each recipe pushes to PATH/<recipe>, one tag per target
    gpus: list[GPUNode]
    recipes: list[str]
    driver: str = "vllm"  # vllm | kernels | command (the warmup: build_args after their own "--")
    gpu_count: int = 1  # nvidia.com/gpu of the bake (tensor parallel)
    build_args: list[str] = field(default_factory=list)  # more `cachebake build` arguments, as argv
    pull_secret: str | None = None
    tls_verify: bool | None = None
    deadline: int = DEFAULT_DEADLINE
    prefix: str = "cachebake-bake"


def recipe_slug(name: str) -> str:
    """A bundled recipe's name as a DNS label and repository component: ``falcon-h1:7b`` ->
    ``falcon-h1-7b``; anything else is refused (BadInput)."""
    from cachebake.recipes import list_recipes, load_recipe

    known = {r.ref for r in list_recipes()} | {r.name for r in list_recipes()}
    if name not in known:
        raise BadInput(f"--model {ascii(name)}: not a bundled recipe (a Job bakes a recipe: a local "
                       "model directory is not in the Pod); see `cachebake recipes`")
    load_recipe(name)
    slug = name.replace(":", "-").replace(".", "-")
    if not _DNS_LABEL.match(slug):
        raise BadInput(f"--model {ascii(name)}: cannot be named in Kubernetes as {ascii(slug)}")
    return slug


def _job_name(plan: BakeJobPlan, slug: str, target: GPUTargetSpec) -> str:
    name = f"{plan.prefix}-{slug}-{target.ref_name.replace('_', '')}"
    if not _DNS_LABEL.match(name):
        raise BadInput(f"Job name {ascii(name)} is not a DNS-1123 label of at most 63 characters",
                       hint="shorten --name-prefix")
    return name


def _security(read_only_root: bool = True) -> dict:
    return {"runAsNonRoot": True, "runAsUser": NONROOT_UID, "runAsGroup": NONROOT_UID,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": read_only_root,
            "capabilities": {"drop": ["ALL"]}}


def build_argv(plan: BakeJobPlan, recipe: str, target: GPUTargetSpec) -> list[str]:
    return ["cachebake", "build", "--model", recipe, "--driver", plan.driver,
            "--target", target.ref_name, "--root", f"{WORK}/root", "--out", OUT, "--json",
            *plan.build_args]


def push_argv(plan: BakeJobPlan, slug: str) -> list[str]:
    argv = ["cachebake", "push", OUT, f"{plan.repository.rstrip('/')}/{slug}", "--json"]
    if plan.pull_secret:
        argv += ["--authfile", f"{AUTH_DIR}/.dockerconfigjson"]
    if plan.tls_verify is not None:
        argv.append("--tls-verify" if plan.tls_verify else "--no-tls-verify")
    return argv


def job(plan: BakeJobPlan, gpu: GPUNode, recipe: str) -> dict:
    slug = recipe_slug(recipe)
    name = _job_name(plan, slug, gpu.target)
    labels = {"app.kubernetes.io/name": "cachebake-bake", "app.kubernetes.io/component": "bake",
              "dev.cachebake/recipe": slug, "dev.cachebake/target": gpu.target.ref_name}
    mounts = [{"name": "work", "mountPath": WORK}, {"name": "tmp", "mountPath": "/tmp"}]
    env = [{"name": "HOME", "value": f"{WORK}/home"}]
    volumes: list[dict] = [{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    push_mounts = list(mounts)
    if plan.pull_secret:
        volumes.append({"name": "registry-auth", "secret": {"secretName": plan.pull_secret}})
        push_mounts.append({"name": "registry-auth", "mountPath": AUTH_DIR, "readOnly": True})
    bake = {"name": "bake", "image": plan.builder_image, "command": build_argv(plan, recipe, gpu.target),
            "env": env, "volumeMounts": mounts, "securityContext": _security(),
            "resources": {"limits": {GPU_RESOURCE: plan.gpu_count}}}
    push = {"name": "push", "image": plan.builder_image, "command": push_argv(plan, slug),
            "env": env, "volumeMounts": push_mounts, "securityContext": _security()}
    spec: dict = {"restartPolicy": "Never", "nodeSelector": {PRODUCT_LABEL: gpu.product},
                  "securityContext": {"runAsNonRoot": True, "runAsUser": NONROOT_UID,
                                      "runAsGroup": NONROOT_UID, "fsGroup": NONROOT_UID},
                  "initContainers": [bake], "containers": [push], "volumes": volumes}
    if plan.pull_secret:
        spec["imagePullSecrets"] = [{"name": plan.pull_secret}]
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {"backoffLimit": 0, "activeDeadlineSeconds": plan.deadline,
                     "ttlSecondsAfterFinished": TTL_AFTER_FINISHED,
                     "template": {"metadata": {"labels": labels}, "spec": spec}}}


def check_plan(plan: BakeJobPlan) -> None:
    if not plan.gpus or not plan.recipes:
        raise BadInput("a bake matrix needs at least one --gpu PRODUCT=TARGET and one --model")
    if not _REPO.match(plan.repository):
        raise BadInput(f"--repository {ascii(plan.repository)}: give docker://HOST/PATH without a tag "
                       "(each recipe pushes to PATH/RECIPE, one tag per GPU target)")
    targets = [g.target.key for g in plan.gpus]
    products = [g.product for g in plan.gpus]
    if len(set(products)) != len(products):
        raise BadInput("--gpu names one GPU product twice")
    if len(set(targets)) != len(targets):
        # two products of one target would push two bakes to one tag: the last one wins
        raise BadInput("two --gpu products have one GPU target: one bake per target and recipe",
                       hint="keep the product the fleet serves on")
    if len(set(plan.recipes)) != len(plan.recipes):
        raise BadInput("--model names one recipe twice")
    # `cachebake build` takes a warmup command after "--" with --driver command and refuses it
    # with the others: refused here, before a Job on a GPU node would fail on it.
    split = plan.build_args.index("--") if "--" in plan.build_args else None
    if plan.driver == "command" and (split is None or split == len(plan.build_args) - 1):
        raise BadInput("--driver command: give the warmup after a second --: `bake-job ... -- "
                       "[BUILD OPTIONS] -- CMD...` (it runs in the builder image)")
    if plan.driver != "command" and split is not None:
        raise BadInput(f"--driver {plan.driver} bakes the recipe: a warmup command after a second -- "
                       "is for --driver command")


def bake_jobs(plan: BakeJobPlan) -> tuple[list[dict], list[str]]:
    """(the Jobs, notes)."""
    check_plan(plan)
    jobs = [job(plan, gpu, recipe) for recipe in plan.recipes for gpu in plan.gpus]
    names = [j["metadata"]["name"] for j in jobs]
    if len(set(names)) != len(names):
        raise BadInput("two Jobs would have one name: recipes whose names differ only in ':' or '.'")
    repo = plan.repository.rstrip("/")
    notes = [f"{len(jobs)} Jobs: {len(plan.recipes)} recipes x {len(plan.gpus)} GPUs; each pushes "
             f"{repo}/RECIPE:sm_XX; `cachebake install {repo}/RECIPE` picks the tag of its GPU"]
    return jobs, notes


def render_jobs(jobs: list[dict], notes: list[str], fmt: str = "yaml") -> str:
    """A multi-document YAML stream (or one JSON ``v1 List``), each document through the
    k8s writer's serializer and parse-back check."""
    from cachebake.distribute.k8s import render

    if fmt == "json":
        return render({"apiVersion": "v1", "kind": "List", "items": jobs}, notes, "json")
    texts = [render(j, notes if i == 0 else [], "yaml") for i, j in enumerate(jobs)]
    return "---\n".join(texts)


@dataclass
class BakeJobsReport:
    text: str
    jobs: list[dict]
    notes: list[str]

    def to_dict(self) -> dict:
        return {"jobs": self.jobs, "notes": self.notes}

    def render(self, console) -> None:
        import sys

        sys.stdout.write(self.text)  # verbatim: it is a file, not a message

#!/usr/bin/env python3
"""Which Triton kernels vLLM's engine compiles vs what the ``kernels`` driver bakes.

    python3 bench/compare_engine_kernels.py ENGINE_ART KERNELS_ART [--out DIR]

ENGINE_ART: an artifact from ``cachebake build --driver vllm``; KERNELS_ART: one from
``--driver kernels`` (or, names only, the ``artifact_summary.json`` bench/gpu_bake.sh writes).
Both are read from their manifests (``cachebake.json``: the bake's compile events, which carry
each kernel's constexprs, divisibility attributes and launch options); no GPU, no Triton.

Reports: kernels the engine compiles that the kernels driver does not bake at all, grouped by
where they come from (Inductor's generated kernels, the sampler, the model runner, the model's
own ops); for kernels both bake, the specializations only one side has (engine-only: variants a
kernels-driver bake would miss at serve time; kernels-only: variants the engine never
launched); and the counts.  Writes engine_vs_kernels.md and .json to --out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

GROUPS = [  # (group, name prefixes or fragments), first match wins
    ("Inductor (torch.compile's fused kernels)", ("triton_poi", "triton_red", "triton_per", "triton_tem")),
    ("sampler", ("topk", "topp", "gumbel", "penalt", "min_p", "logprob", "bias", "bad_words",
                 "temperature", "bincount", "ranks", "rejection")),
    ("model runner (inputs, KV blocks)", ("slot_mapping", "zero_kv", "block_table", "prepare",
                                          "input", "positions", "combine", "expand")),
    ("Mamba2 ops (vLLM's model code)", ("chunk", "bmm", "state", "conv1d", "selective_scan", "ssd")),
]


def group_of(name: str) -> str:
    for group, marks in GROUPS:
        if name.startswith(marks) if group.startswith("Inductor") else any(m in name for m in marks):
            return group
    return "other"


def spec_of(e: dict) -> str:
    div = sorted(idx[0] for idx, props in e.get("attrs") or [] for name, _ in props
                 if name == "tt.divisibility")
    o = e.get("options") or {}
    cx = ",".join(f"{k}={v}" for k, v in sorted((e.get("constexprs") or {}).items()))
    return f"{cx} div16={div} w{o.get('num_warps')}/s{o.get('num_stages')}"


def load(path: str) -> dict:
    """kernel name -> set of specializations (None when only names are known)."""
    p = Path(path)
    data = json.loads((p / "cachebake.json").read_text() if p.is_dir() else p.read_text())
    out: dict[str, set | None] = defaultdict(set)
    if "bakes" in data:
        for bake in data["bakes"].values():
            for e in (bake.get("bake") or {}).get("events") or []:
                if e.get("kind") == "compile":
                    out[e["kernel"]].add(spec_of(e))
            for k in (bake.get("inventory") or {}).get("kernels") or []:
                out.setdefault(k["name"], set())
    else:  # bench/gpu_bake.sh's artifact_summary.json: names only
        for rnd in data.get("bake_rounds") or []:
            for name in rnd.get("kernels") or []:
                out[name] = None
    return dict(out)


def compare(engine: dict, kernels: dict) -> dict:
    only_engine = sorted(set(engine) - set(kernels))
    only_kernels = sorted(set(kernels) - set(engine))
    both = sorted(set(engine) & set(kernels))
    by_group: dict[str, list] = defaultdict(list)
    for name in only_engine:
        by_group[group_of(name)].append({"kernel": name, "specializations": len(engine[name] or ())})
    shared = []
    for name in both:
        e, k = engine[name], kernels[name]
        if e is None or k is None:
            shared.append({"kernel": name, "engine": len(e or ()), "kernels": None})
            continue
        shared.append({"kernel": name, "engine": len(e), "kernels": len(k),
                       "engine_only": sorted(e - k), "kernels_only": sorted(k - e)})
    return {"engine_only_by_group": dict(by_group), "kernels_only": only_kernels, "shared": shared,
            "counts": {"engine_kernels": len(engine), "kernels_kernels": len(kernels),
                       "engine_only": len(only_engine), "shared": len(both)}}


def render(c: dict) -> str:
    n = c["counts"]
    lines = [f"Engine bake: {n['engine_kernels']} kernels; kernels bake: {n['kernels_kernels']}; "
             f"shared: {n['shared']}; compiled by the engine only: {n['engine_only']}.", "",
             "| compiled by the engine, not baked by the kernels driver | kernels (specializations) |",
             "| --- | --- |"]
    for group, items in sorted(c["engine_only_by_group"].items()):
        lines.append(f"| {group} | " + ", ".join(f"`{i['kernel']}` ({i['specializations']})" for i in items) + " |")
    lines += ["", "| kernel in both | engine specializations | kernels-driver specializations | "
              "engine only | kernels-driver only |", "| --- | --- | --- | --- | --- |"]
    for s in c["shared"]:
        if s["kernels"] is None:
            lines.append(f"| `{s['kernel']}` | {s['engine']} | (names only) | - | - |")
        else:
            lines.append(f"| `{s['kernel']}` | {s['engine']} | {s['kernels']} | "
                         f"{len(s['engine_only'])} | {len(s['kernels_only'])} |")
    if c["kernels_only"]:
        lines += ["", "Baked by the kernels driver, never compiled by the engine: "
                  + ", ".join(f"`{k}`" for k in c["kernels_only"])]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine")
    ap.add_argument("kernels")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    c = compare(load(a.engine), load(a.kernels))
    md = render(c)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "engine_vs_kernels.json").write_text(json.dumps(c, indent=1))
        (out / "engine_vs_kernels.md").write_text(md)
    sys.stdout.write(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

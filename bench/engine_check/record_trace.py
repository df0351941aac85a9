#!/usr/bin/env python3
"""Record what a vLLM server's Mamba2 layer launches: start-up, then real traffic.

Runs where the real ``vllm`` package imports (a CPU is enough; the vllm venv).  For a recipe
variant's stored engine plan (cachebake/vllm/kernels/plans/) it drives:

* start-up as Model Runner V2 runs it (vllm/v1/worker/gpu/): the profile run's SSD warm-up,
  ``warmup_kernels`` (prefill of the planned batch, then decodes), and CUDA-graph capture of
  every PIECEWISE size and every FULL uniform-decode size, with the runner's dummy batches;
* serving: a random workload (short and long prompts, prompts longer than the token budget,
  prompts sharing prefixes, speculative drafts when the plan has them) through vLLM's real
  ``Scheduler`` and KV-cache manager; every step that does not replay a FULL CUDA graph runs
  the layer eagerly, as the engine does;

and for each step feeds vLLM's own Mamba2 metadata builder and ``MambaMixer2`` (see
reference.py) and records every op call.  The trace (gzip JSON) is what replay.py launches on
a GPU, exactly as recorded.  Nothing here uses cachebake's kernels driver: the engine steps
are the scheduler's and the runner's, the metadata vLLM's.

    /work/venv-vllm/bin/python bench/engine_check/record_trace.py --model nemotron-h --out T.json.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))  # the checkout, for cachebake.vllm.kernels.plan and recipes

TRACE_FORMAT = 1
BLOCKS = 32  # state blocks the recorded calls address (ids are folded into them)


def fold(block_id: int) -> int:
    """Scheduler block ids folded into the layer's BLOCKS (0, the null block, stays 0)."""
    return 0 if block_id == 0 else 1 + (block_id - 1) % (BLOCKS - 1)


def dummy_rows(num_reqs: int, num_tokens: int):
    """InputBatch.make_dummy: even spread, remainder on the last rows, nothing computed."""
    base, extra = divmod(num_tokens, num_reqs)
    return [(0, base + (i >= num_reqs - extra), False) for i in range(num_reqs)]


def startup(ref, plan):
    """(label, kwargs for ReferenceLayer.forward) of Model Runner V2's start-up, in order."""
    sched, spec, cg, warm = plan["scheduler"], plan["spec"], plan["cudagraph"], plan["warmup"]
    width, k = plan["block_table"]["width"], spec["num_speculative_tokens"]
    q, max_reqs = spec["decode_query_len"], sched["max_num_seqs"]
    zeros = lambda n: [[0] * width for _ in range(n)]  # noqa: E731 (dummy block tables)
    for size in warm.get("compile_sizes", []):
        n = min(size, max_reqs)
        yield f"startup/compile-warmup/{size}", dict(rows=dummy_rows(n, size), block_rows=zeros(n))
    n, plen = warm["num_reqs"], warm["prompt_len"]
    blocks = [[fold(1 + i)] + [0] * (width - 1) for i in range(n)]
    yield "startup/warmup_kernels/prefill", dict(rows=[(0, plen, True)] * n, block_rows=blocks)
    steps = [[q if k else 1] * n]
    if n >= 2:
        steps.append([q, 1] if k else [1, 1])
        if k:
            steps.append([1, 1])
    steps += [[q] if k else [1]] + ([[1]] if k else [])
    done = plen
    for shape in steps:
        rows = sorted(((done, t, False) for t in shape), key=lambda r: (r[1] == 1, r[1] != q))
        yield f"startup/warmup_kernels/decode/{shape[:3]}", dict(rows=rows, block_rows=blocks[: len(rows)])
        done += q
    for d in cg["captures"]["PIECEWISE"]:
        t = d["num_tokens"]
        n = min(t, max_reqs)
        yield f"startup/capture/PIECEWISE/{t}", dict(rows=dummy_rows(n, t), block_rows=zeros(n))
    for d in cg["captures"]["FULL"]:
        yield (f"startup/capture/FULL/{d['num_tokens']}",
               dict(rows=dummy_rows(d["num_reqs"], d["num_tokens"]), block_rows=zeros(d["num_reqs"]),
                    capture=True))


class Traffic:
    """A random serving workload through vLLM's real scheduler and KV-cache manager."""

    def __init__(self, engine, plan, seed: int):
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_planning import get_kv_cache_configs
        from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config,
                                                 get_request_block_hasher, init_none_hash,
                                                 resolve_kv_cache_block_sizes)
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.structured_output import StructuredOutputManager

        vc = engine.vc
        self.plan, self.rng, self.vc = plan, random.Random(seed), vc
        kv = get_kv_cache_configs(vc, [engine.specs], [plan["kv_cache"]["kv_cache_bytes"]], engine.groups)
        sched_kv = generate_scheduler_kv_cache_config(kv)
        vc.cache_config.num_gpu_blocks = sched_kv.num_blocks
        # EngineCore._initialize_kv_caches: the global block size becomes the smallest
        # prefix-cacheable group's (a lone Mamba group in "none" mode: max_model_len).
        groups = sched_kv.kv_cache_groups
        cacheable = [g.kv_cache_spec.block_size for g in groups if g.kv_cache_spec.prefix_cacheable]
        vc.cache_config.block_size = min(cacheable or [g.kv_cache_spec.block_size for g in groups])
        block, hash_block = resolve_kv_cache_block_sizes(sched_kv, vc)
        sched_kv.hash_block_size = hash_block
        sched_kv.cache_hit_alignment_tokens = plan["cache"]["cache_hit_alignment_tokens"]
        self.group = next(i for i, g in enumerate(sched_kv.kv_cache_groups)
                          if engine.mixer.prefix in g.layer_names)
        self.scheduler = Scheduler(vc, sched_kv, StructuredOutputManager(vc), block_size=block,
                                   hash_block_size=hash_block)
        self.hasher = None
        if vc.cache_config.enable_prefix_caching:
            hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.hasher = get_request_block_hasher(hash_block, hash_fn)
        self.blocks: dict[str, list[int]] = {}
        self.pending: list[tuple[str, list[int], int]] = []
        self.vocab = 32000
        self.k = plan["spec"]["num_speculative_tokens"]
        self.q = plan["spec"]["decode_query_len"]

    def add(self, rid: str, ids: list[int], max_tokens: int) -> None:
        from vllm import SamplingParams
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        self.scheduler.add_request(Request(rid, ids, sp, None, block_hasher=self.hasher))

    def workload(self, n: int) -> None:
        """n requests, arriving a few per step: short chats, long documents (past the token
        budget where the model allows), a shared system prompt (prefix-cache hits), so that
        steps mix any number of decodes with prefills."""
        sched = self.plan["scheduler"]
        budget, max_len = sched["max_num_batched_tokens"], sched["max_model_len"]
        shared = [self.rng.randrange(16, self.vocab) for _ in range(min(2600, max_len // 2))]
        for i in range(n):
            kind = self.rng.random()
            if kind < 0.5:
                length = self.rng.randint(1, 300)
            elif kind < 0.75:
                length = self.rng.randint(300, min(4000, max_len - 64))
            elif kind < 0.9:
                length = self.rng.randint(min(budget, max_len - 64) // 2, max_len - 64)
            else:
                length = 0
            if length:
                ids = [self.rng.randrange(16, self.vocab) for _ in range(length)]
            else:  # a prompt that starts with the shared prefix
                tail = self.rng.randint(1, 400)
                ids = shared + [self.rng.randrange(16, self.vocab) for _ in range(tail)]
            self.pending.append((f"r{i}", ids[: max_len - 40], self.rng.randint(2, 40)))

    def steps(self, limit: int):
        """Each scheduler step as (rows, block rows, accepted counts, eager?)."""
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        s = self.scheduler
        for step in range(limit):
            arrivals = 8 if step == 0 else min(len(self.pending), self.rng.choice((0, 0, 1, 1, 2, 3)))
            for _ in range(min(arrivals, len(self.pending))):
                self.add(*self.pending.pop(0))
            if not s.has_unfinished_requests():
                if not self.pending:
                    return
                continue
            out = s.schedule()
            if out.total_num_scheduled_tokens == 0:
                return
            for nr in out.scheduled_new_reqs:
                self.blocks[nr.req_id] = list(nr.block_ids[self.group])
            cached = out.scheduled_cached_reqs
            for rid, new in zip(cached.req_ids, cached.new_block_ids):
                if rid in cached.resumed_req_ids and new is not None:
                    self.blocks[rid] = list(new[self.group])
                elif new is not None:
                    self.blocks[rid].extend(new[self.group])
            items = []
            for rid, n in out.num_scheduled_tokens.items():
                req = s.requests[rid]
                computed = req.num_computed_tokens - n  # the scheduler already advanced it
                drafted = bool(out.scheduled_spec_decode_tokens.get(rid))
                prefilling = computed < req.num_prompt_tokens
                items.append((rid, n, computed, drafted, prefilling))
            items.sort(key=lambda it: (not it[3], it[1] != self.q, it[1]))
            rows = [(c, n, p) for _, n, c, _, p in items]
            width = self.plan["block_table"]["width"]
            block_rows = [[fold(b) for b in self.blocks[rid]][:width] for rid, *_ in items]
            accepted = [self.rng.randint(1, 1 + self.k) if d else 1 for _, _, _, d, _ in items]
            yield rows, block_rows, accepted, out
            sampled, drafts = [], []
            for rid, n, c, d, p in items:
                req = s.requests[rid]
                done = c + n >= req.num_prompt_tokens
                sampled.append([self.rng.randrange(16, self.vocab)] if done else [])
            ids = [it[0] for it in items]
            s.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=sampled))
            if self.k:  # the n-gram drafter proposes 0..k tokens for decoding requests
                for rid in ids:
                    if rid in s.requests and s.requests[rid].num_computed_tokens >= s.requests[rid].num_prompt_tokens:
                        drafts.append((rid, [self.rng.randrange(16, self.vocab)
                                             for _ in range(self.rng.randint(0, self.k))]))
                if drafts:
                    s.update_draft_token_ids(DraftTokenIds([r for r, _ in drafts], [d for _, d in drafts]))


def replays_full_graph(plan, rows) -> bool:
    """Model Runner V2's dispatch: a batch of decode rows all of decode_query_len tokens that
    fits a captured FULL graph replays it (no kernel launch of its own)."""
    cg, q = plan["cudagraph"], plan["spec"]["decode_query_len"]
    if "FULL" not in cg["mode"] or any(p for _, _, p in rows):
        return False
    if any(n != q for _, n, _ in rows):
        return False
    tokens = sum(n for _, n, _ in rows)
    return any(d["num_tokens"] >= tokens and d["num_reqs"] >= len(rows) for d in cg["captures"]["FULL"])


def record(recipe_ref: str, key: str, requests: int, seed: int, max_steps: int) -> dict:
    from reference import ReferenceLayer

    from cachebake.vllm.kernels.plan.store import load_store
    from cachebake.recipes import load_recipe

    recipe = load_recipe(recipe_ref)
    plan = load_store(recipe.name)["variants"][recipe.variant][key]["plan"]
    steps = []
    t0 = time.time()
    with ReferenceLayer(plan, recipe.hf_config, num_blocks=BLOCKS) as ref:
        steps.append({"label": "startup/profile-run/ssd-warmup", "calls": ref.ssd_warmup()})
        for label, kw in startup(ref, plan):
            _, calls = ref.forward(**kw)
            steps.append({"label": label, "calls": calls})
        traffic = Traffic(ref.engine, plan, seed)
        traffic.workload(requests)
        replayed = 0
        for i, (rows, block_rows, accepted, _) in enumerate(traffic.steps(max_steps)):
            if replays_full_graph(plan, rows):
                replayed += 1
                continue
            _, calls = ref.forward(rows, block_rows, accepted=accepted)
            desc = f"{sum(1 for _, n, p in rows if not p and n <= plan['spec']['decode_query_len'])}d+" \
                   f"{sum(1 for *_, p in rows if p)}p/{sum(n for _, n, _ in rows)}tok"
            steps.append({"label": f"serve/step{i}/{desc}", "calls": calls})
    return {"format": TRACE_FORMAT, "recipe": recipe.ref, "plan_key": key, "seed": seed,
            "requests": requests, "ops": plan["ops"], "vllm_version": plan["vllm_version"],
            "blocks": BLOCKS, "full_graph_replays": replayed, "seconds": round(time.time() - t0, 1),
            "steps": steps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="recipe name[:variant]")
    ap.add_argument("--plan-key", default=None, help="stored plan (default: the recipe's serve args)")
    ap.add_argument("--requests", type=int, default=160)
    ap.add_argument("--max-steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from cachebake.recipes import load_recipe

    recipe = load_recipe(args.model)
    key = args.plan_key or f"tp={recipe.serve_args['tensor_parallel_size']},prefix=default,spec=off"
    trace = record(recipe.ref, key, args.requests, args.seed, args.max_steps)
    with gzip.open(args.out, "wt") as f:
        json.dump(trace, f, separators=(",", ":"))
    calls = sum(len(s["calls"]) for s in trace["steps"])
    print(f"{args.out}: {recipe.ref} {key}: {len(trace['steps'])} steps, {calls} op calls "
          f"({trace['full_graph_replays']} steps replayed FULL graphs), {trace['seconds']} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

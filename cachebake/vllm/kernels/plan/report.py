"""``cachebake plan``: the engine plan of a model + serve args + GPU, computed or stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PlanReport:
    recipe: str
    source: str  # "computed with vllm X" or "stored <file>"
    plan: dict[str, Any]
    stored_equal: bool | None = None  # computed: does the stored plan of these args equal it?

    def to_dict(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "source": self.source, "stored_equal": self.stored_equal,
                "plan": self.plan}

    def render(self, console) -> None:
        from rich.table import Table

        p = self.plan
        mx, kv, cache, cg, sched, warm = (p["mixer"], p["kv_cache"], p["cache"], p["cudagraph"],
                                          p["scheduler"], p["warmup"])
        t = Table(title=f"engine plan {self.recipe} ({self.source})", show_header=False, box=None)
        t.add_row("vLLM / target", f"{p['vllm_version']} / {p['target']['gpu_name']} "
                  f"{p['target']['memory_gib']:g} GiB, {kv['attention_backend']}")
        t.add_row("mixer per rank", f"tp={p['model']['tensor_parallel_size']}: {mx['num_heads']} heads x "
                  f"{mx['head_dim']}, {mx['n_groups']} groups, state {mx['d_state']}, conv {mx['conv_kernel']}, "
                  f"chunk {mx['chunk_size']}, in_proj {mx['in_proj_width']}, {mx['activation']}")
        t.add_row("pages", f"attention block {kv['block_size']} tokens, page {kv['page_bytes']} B "
                  f"(state {kv['state_bytes']} B), layout {kv['layout']}, conv {kv['conv_state_layout']}")
        for v in kv["views"]:
            t.add_row(f"{v['name']} state", f"{v['dtype']} {v['shape']} strides {v['stride']} "
                      f"at +{v['offset_bytes']} B")
        t.add_row("cache", f"mamba mode {cache['mamba_cache_mode']}, prefix caching "
                  f"{cache['prefix_caching']}, block table width {p['block_table']['width']}")
        t.add_row("scheduler", f"max_num_seqs {sched['max_num_seqs']}, max_num_batched_tokens "
                  f"{sched['max_num_batched_tokens']}, max_model_len {sched['max_model_len']}")
        t.add_row("cuda graphs", f"{cg['mode']}, {len(cg['capture_sizes'])} sizes up to "
                  f"{cg['max_capture_size']}, decode graphs up to {cg['decode_cudagraph_max_bs']}")
        t.add_row("spec decoding", str(p["spec"]["method"] or "off") +
                  (f", {p['spec']['num_speculative_tokens']} tokens" if p["spec"]["method"] else ""))
        t.add_row("warm-up batch", f"{warm['num_reqs']} x {warm['prompt_len']} tokens "
                  f"(limited by {warm['limited_by']})")
        if self.stored_equal is not None:
            t.add_row("stored plan", "equal" if self.stored_equal else "DIFFERS (stale store?)")
        console.print(t)


def make_plan_report(model: str, tp: int | None, serve_args, gpu: str | None,
                     stored_only: bool = False) -> PlanReport:
    """Compute the plan with vllm when it imports (and say whether the stored one equals it);
    without vllm, or with ``stored_only``, return the stored plan of exactly these args."""
    from cachebake.errors import Unsupported
    from cachebake.vllm.kernels.plan import DEFAULT_GPU, gpu_target
    from cachebake.vllm.kernels.plan.store import plan_file, stored_plan
    from cachebake.vllm.serveargs import resolve

    recipe, args, _ = resolve(model, tp, serve_args=serve_args)
    stored = stored_plan(recipe, args, gpu)
    have_vllm = True
    try:
        import vllm  # noqa: F401
    except ImportError:
        have_vllm = False
    if stored_only or not have_vllm:
        if stored is None:
            why = "--stored" if stored_only else "vllm is not installed here"
            # Blame what differs from the store: the serve args, or (stored for them on the
            # default GPU) --gpu-memory.
            if gpu_target(gpu) != gpu_target(None) and stored_plan(recipe, args, None) is not None:
                raise Unsupported(f"no stored engine plan for {recipe.ref} on --gpu-memory {gpu} "
                                  f"(stored plans are for {DEFAULT_GPU}), and {why}: compute it "
                                  "where vllm is installed (`cachebake plan`), or leave out "
                                  "--gpu-memory")
            raise Unsupported(f"no stored engine plan for {recipe.ref} with these serve args, and "
                              f"{why}: compute it where vllm is installed (`cachebake plan`)")
        return PlanReport(recipe.ref, f"stored {plan_file(recipe.name).name}", stored)
    from cachebake.vllm.kernels.plan.compute import compute_plan

    plan = compute_plan(recipe.hf_config, args, gpu_target(gpu), recipe=recipe.ref)
    return PlanReport(recipe.ref, f"computed with vllm {plan['vllm_version']}", plan,
                      stored_equal=None if stored is None else stored == plan)

"""The request plan a vLLM bake sends after startup: pure data, no vLLM needed.

vLLM's own startup (profile run, JIT warmup registry, CUDA graph capture) compiles what every
server compiles.  It misses what only real traffic reaches (shared/FACTS.md):

* chunked prefill: a prompt longer than ``max_num_batched_tokens`` is prefilled in pieces, and
  every piece after the first runs the SSD kernels with ``HAS_INITSTATES=True``;
* prefix-cache hits on hybrid models, which run the extra "align" kernels and also start from a
  saved state;
* decode batches that are not a CUDA-graph size: sizes above the largest captured one run eagerly
  with their exact batch size, which can pick new selective-state-update variants (an int == 1 is
  a constant, a multiple of 16 gets ``tt.divisibility=16``, anything else neither);
* mixed steps (decodes plus a prefill chunk), whose token count is no capture size;
* speculative decoding, where a decode step carries ``1 + k`` tokens per sequence;
* the sampling parameters traffic sends: temperature with top-k/top-p, min-p, penalties,
  logprobs and prompt logprobs, logit bias, seeded and unseeded sampling, greedy and sampled
  requests in one batch.  vLLM 0.33's default (V2) model runner samples with Triton kernels
  (``vllm/v1/worker/gpu/sample/``) that compile at the first request using them; 0.24's V1
  runner samples in torch except top-k/top-p (``topk_topp_triton``);
* the longest prompt the model length allows (positions far past the warmups').

``plan_requests`` turns a recipe's config and the serve args into that traffic, as batches of
token-id prompts (no tokenizer: the bake runs with ``skip_tokenizer_init=True``).  Limits come
from the serve args (``limits_from_serve_args``) or, better, from the live engine's resolved
config (``limits_from_vllm_config``), so the plan uses the capture sizes vLLM really chose.

Deterministic where vLLM allows: token ids, lengths and sampling seeds are fixed, and the
driver admits each batch at once (vllm_engine: scheduler paused while it enqueues), so every
round runs the same steps.  Why a round can still compile after a quiet one is in
vllm_engine's docstring.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

# vLLM's defaults when the serve args leave a limit out (vLLM 0.33 can pick larger ones per GPU
# and usage context; the live engine's config always wins over these).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
MAX_DEFAULT_CAPTURE = 512


def default_capture_sizes(max_num_seqs: int, num_speculative_tokens: int = 0) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then steps of 8 to 256, then 16."""
    largest = min(max_num_seqs * (1 + num_speculative_tokens) * 2, MAX_DEFAULT_CAPTURE)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
    return [s for s in sizes if s <= largest]


@dataclass
class EngineLimits:
    """The scheduler and graph limits the plan is shaped around."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    capture_sizes: list[int]  # CUDA-graph sizes in tokens, ascending; empty: no graphs
    block_size: int | None = None
    prefix_caching: bool | None = None  # None: vLLM's default, unknown here
    num_speculative_tokens: int = 0
    chunk_size: int | None = None  # the SSD chunk (tokens) from the model config
    source: str = "serve_args"  # or "engine": read from the live vLLM config

    @property
    def largest_capture(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RequestBatch:
    """One ``LLM.generate`` call: prompts sent together, each running ``max_tokens`` steps."""

    label: str
    purpose: str
    prompt_lens: list[int]
    max_tokens: int
    shared_prefix: int = 0  # tokens every prompt of the batch shares with the prefix seed
    seed: int = 0
    repetitive: bool = False  # prompts built from a short repeated n-gram (n-gram drafts hit)
    # SamplingParams overrides, cycled over the prompts; empty: greedy, as before.
    sampling: list[dict[str, Any]] = field(default_factory=list)

    def sampling_for(self, i: int) -> dict[str, Any]:
        """The SamplingParams fields of prompt ``i`` (besides max_tokens/ignore_eos)."""
        return dict(self.sampling[i % len(self.sampling)]) if self.sampling else {"temperature": 0.0}

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lens)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompt_lens)

    def prompts(self, vocab_size: int) -> list[list[int]]:
        """The token ids of every prompt (deterministic; no tokenizer)."""
        out = []
        prefix = token_ids(self.shared_prefix, 7919, vocab_size) if self.shared_prefix else []
        for i, n in enumerate(self.prompt_lens):
            tail = n - len(prefix)
            if self.repetitive:
                gram = token_ids(5, self.seed * 1000 + i, vocab_size)
                body = (gram * (tail // len(gram) + 1))[:tail]
            else:
                body = token_ids(tail, self.seed * 1000 + i, vocab_size)
            out.append(prefix + body)
        return out


def token_ids(n: int, seed: int, vocab_size: int) -> list[int]:
    """``n`` pseudo-random ids in [16, vocab_size): clear of the low special-token ids."""
    lo, span = 16, max(vocab_size - 16, 1)
    x = (seed * 2654435761 + 12345) & 0xFFFFFFFF
    out = []
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(lo + x % span)
    return out


def _model_len(hf_config: dict[str, Any]) -> int:
    return int(hf_config.get("max_position_embeddings") or 4096)


def _chunk(hf_config: dict[str, Any]) -> int | None:
    v = hf_config.get("chunk_size") or hf_config.get("mamba_chunk_size")
    return int(v) if v else None


def limits_from_serve_args(hf_config: dict[str, Any], serve_args: dict[str, Any]) -> EngineLimits:
    """Limits as far as the serve args (and vLLM's documented defaults) tell them."""
    max_num_seqs = int(serve_args.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS)
    budget = int(serve_args.get("max_num_batched_tokens") or DEFAULT_MAX_NUM_BATCHED_TOKENS)
    max_len = int(serve_args.get("max_model_len") or _model_len(hf_config))
    spec = serve_args.get("speculative_config") or {}
    k = int(spec.get("num_speculative_tokens") or 0) if isinstance(spec, dict) else 0
    comp = serve_args.get("compilation_config") or {}
    if isinstance(comp, dict) and comp.get("cudagraph_capture_sizes"):
        sizes = sorted(int(s) for s in comp["cudagraph_capture_sizes"])
    elif isinstance(comp, dict) and comp.get("max_cudagraph_capture_size"):
        largest = int(comp["max_cudagraph_capture_size"])
        sizes = [s for s in default_capture_sizes(10**6) if s <= largest]
    else:
        sizes = default_capture_sizes(max_num_seqs, k)
    return EngineLimits(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_len,
        capture_sizes=sizes,
        block_size=serve_args.get("block_size"),
        prefix_caching=serve_args.get("enable_prefix_caching"),
        num_speculative_tokens=k,
        chunk_size=_chunk(hf_config),
        source="serve_args",
    )


def limits_from_vllm_config(vllm_config: Any, hf_config: dict[str, Any]) -> EngineLimits:
    """Limits as the live engine resolved them (``LLM(...).llm_engine.vllm_config``)."""
    sched = vllm_config.scheduler_config
    cache = vllm_config.cache_config
    comp = vllm_config.compilation_config
    spec = getattr(vllm_config, "speculative_config", None)
    sizes = sorted(int(s) for s in (getattr(comp, "cudagraph_capture_sizes", None) or []))
    return EngineLimits(
        max_num_seqs=int(sched.max_num_seqs),
        max_num_batched_tokens=int(sched.max_num_batched_tokens),
        max_model_len=int(vllm_config.model_config.max_model_len),
        capture_sizes=sizes,
        block_size=getattr(cache, "block_size", None),
        prefix_caching=getattr(cache, "enable_prefix_caching", None),
        num_speculative_tokens=int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec else 0,
        chunk_size=_chunk(hf_config),
        source="engine",
    )


def decode_sizes(lim: EngineLimits) -> list[int]:
    """Decode batch sizes worth one batch each: 1, non-multiples and multiples of 16 up to the
    largest capture size, and past it up to max_num_seqs (where batches run eagerly)."""
    cap = lim.largest_capture
    want = {1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33}
    if cap:
        want |= {cap - 1, cap}
        # Past the largest graph size: exact sizes, both kinds of divisibility.
        want |= {cap + d for d in (1, 8, 15, 16, 17, 32, 33)}
    want |= {lim.max_num_seqs - 1, lim.max_num_seqs}
    return sorted(s for s in want if 1 <= s <= lim.max_num_seqs)


def plan_requests(recipe: Any, serve_args: dict[str, Any],
                  limits: EngineLimits | None = None) -> list[RequestBatch]:
    """The traffic to send after vLLM's own warmups (see the module docstring for why).

    ``recipe``: a ``cachebake.recipes.Recipe`` or its ``hf_config`` dict."""
    hf_config = getattr(recipe, "hf_config", recipe)
    lim = limits or limits_from_serve_args(hf_config, serve_args)
    budget, max_len = lim.max_num_batched_tokens, lim.max_model_len
    chunk = lim.chunk_size or 128
    plan: list[RequestBatch] = []

    def fits(n: int, gen: int) -> int:  # a prompt of at most n tokens leaving room for gen more
        return max(1, min(n, max_len - gen))

    plan.append(RequestBatch("single", "one short prompt, then decode batch 1", [fits(100, 8)], 8, seed=1))
    # Prefill shapes around the SSD chunk size, several sequences in one varlen prefill.
    lens = [fits(n, 4) for n in (1, chunk - 1, chunk, chunk + 1, 2 * chunk + 3, 300 + 57)]
    plan.append(RequestBatch("prefill-shapes", "varlen prefill across SSD chunk boundaries", lens, 4, seed=2))

    # Chunked prefill: the second and later chunks carry initial states (HAS_INITSTATES).
    if max_len - 4 > budget + 1:
        n = fits(budget + budget // 2 + 7, 4)
        plan.append(RequestBatch("chunked-prefill", "one prompt longer than max_num_batched_tokens",
                                 [n], 4, seed=3))
        if max_len - 4 > 2 * budget + 1:
            plan.append(RequestBatch("chunked-prefill-3", "a prompt spanning three chunks",
                                     [fits(2 * budget + 33, 4)], 4, seed=4))
    # Two prompts that cannot both fit one step: the second one is split (partial prefill).
    each = fits(max(2, (budget * 3) // 4), 4)
    plan.append(RequestBatch("split-prefill", "two prompts over one step's budget", [each, each], 4, seed=5))

    if lim.prefix_caching is not False:
        block = lim.block_size or 16
        prefix = fits(max(2 * block + 5, 64), 64)
        plan.append(RequestBatch("prefix-seed", "a prompt whose prefix later requests reuse",
                                 [fits(prefix + 21, 4)], 4, shared_prefix=prefix, seed=6))
        plan.append(RequestBatch("prefix-hit", "repeated prefix: prefix-cache hits (align kernels)",
                                 [fits(prefix + 9, 6), fits(prefix + 40, 6)], 6, shared_prefix=prefix,
                                 seed=7))

    for n in decode_sizes(lim):
        plen = 9 + n % 7  # short prompts: the prefill is cheap, then n sequences decode together
        steps = -(-n * plen // budget)  # prefill steps before every sequence decodes
        plan.append(RequestBatch(f"decode-{n}", f"decode batch of {n} sequences",
                                 [plen] * n, 4 + steps + 2, seed=100 + n))

    # Mixed steps: short requests decoding while a long prompt is prefilled in chunks.
    n_dec = max(1, min(lim.max_num_seqs - 2, 33))
    # The long prompt spans several steps where it can, so several steps are mixed.
    plan.append(RequestBatch("mixed", "decodes alongside a chunked prefill",
                             [8] * n_dec + [fits(2 * budget + budget // 2, 24), fits(budget // 2 + 5, 24)],
                             24, seed=8))

    # The longest prompt the model length allows: positions no warmup reaches.
    longest = fits(max_len - 8, 4)
    if longest > max(max(b.prompt_lens) for b in plan):
        plan.append(RequestBatch("longest-prompt", "a prompt as long as max_model_len allows",
                                 [longest], 4, seed=9))

    plan += sampling_batches(lim)

    k = lim.num_speculative_tokens
    if k:
        cap = lim.largest_capture or 1
        per = 1 + k
        sizes = {1, 2, 3, max(1, cap // per), cap // per + 1, min(lim.max_num_seqs, cap // per + 16)}
        for n in sorted(s for s in sizes if 1 <= s <= lim.max_num_seqs):
            plan.append(RequestBatch(f"spec-{n}", f"speculative decode: {n} x {per} tokens per step",
                                     [fits(40, 16)] * n, 16, seed=200 + n, repetitive=True))
    return plan


# What traffic sets in SamplingParams, one dict per kind of request (token ids < 1000: any
# vocabulary holds them).  Seeds make sampled tokens, and so n-gram drafts, repeatable.
GREEDY = {"temperature": 0.0}
SAMPLED = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 1}
SAMPLING_KINDS: dict[str, list[dict[str, Any]]] = {
    "sample-mixed": [GREEDY, SAMPLED, {"temperature": 1.0, "seed": 2}, {"temperature": 0.7, "top_p": 0.9, "seed": 3}],
    "sample-topk": [{"temperature": 1.0, "top_k": 1, "seed": 4}, {"temperature": 0.6, "top_k": 100, "seed": 5}],
    "sample-min-p": [{"temperature": 1.0, "min_p": 0.1, "seed": 6}, GREEDY],
    "sample-penalties": [{"temperature": 0.8, "seed": 7, "repetition_penalty": 1.1,
                          "frequency_penalty": 0.5, "presence_penalty": 0.5}, GREEDY],
    "logprobs": [{"temperature": 0.0, "logprobs": 5}, {"temperature": 0.8, "seed": 8, "logprobs": 1},
                 {"temperature": 0.0, "prompt_logprobs": 2}],
    "logit-bias": [{"temperature": 0.8, "seed": 9, "logit_bias": {100: 5.0, 200: -5.0}}, GREEDY],
    "sample-unseeded": [{"temperature": 1.0, "top_p": 0.9}],
    # Top-p without top-k anywhere in the batch (the sampler's TOPK_ENABLED=False variant): on
    # the H200 (vLLM 0.24) this was the one kernel a baked server still compiled, for such
    # traffic (bench/RESULTS.md, "The real vLLM engine").
    "sample-top-p": [GREEDY, {"temperature": 0.3, "seed": 10}, {"temperature": 0.9, "top_p": 0.8, "seed": 11}],
}


# Rows for which top-p-only sampling reaches vLLM's _topk_topp_kernel with a BATCH_SIZE that is
# no multiple of 16 (Triton specializes that int argument on it; the engine's warm-up compiles
# only the multiple): vLLM 0.24 samples fewer than 8 rows in torch (v1/sample/ops/
# topk_topp_sampler.py:356, apply_top_k_top_p), 0.33 sends top-p-only batches of up to 64 rows
# to its split pipeline (v1/sample/ops/topk_topp_triton.py:986 _SPLIT_MAX_BATCH, :1681
# use_split).  On the H200 the kernel compiled for unseen traffic until the plan sent such a
# batch (bench/RESULTS.md).
TOPP_KERNEL_ROWS = 77


def sampling_batches(lim: EngineLimits) -> list[RequestBatch]:
    """Each kind of sampling traffic at a batch size of 1, 7 (no multiple of anything) and 16,
    so both specializations of the sampler kernels' batch-size arguments compile; the mixed
    kind also at 33 and past the largest graph size, top-p alone also at TOPP_KERNEL_ROWS."""
    out = []
    for kind, params in SAMPLING_KINDS.items():
        if kind == "sample-unseeded" and lim.num_speculative_tokens:
            continue  # unseeded tokens would make the drafts, and so the step shapes, random
        sizes = {1, 7, 16}
        if kind == "sample-mixed":
            sizes |= {33, lim.largest_capture + 1}
        if kind == "sample-top-p":
            sizes.add(TOPP_KERNEL_ROWS)
        for n in sorted(x for x in sizes if 1 <= x <= lim.max_num_seqs):
            out.append(RequestBatch(f"{kind}-{n}", f"sampling traffic: {kind}, {n} requests",
                                    [24 + i % 5 for i in range(n)], 6, seed=300 + n,
                                    sampling=params))
    return out


def plan_summary(plan: list[RequestBatch]) -> list[dict[str, Any]]:
    return [{"label": b.label, "requests": b.num_requests, "prompt_tokens": b.prompt_tokens,
             "max_tokens": b.max_tokens} for b in plan]


def plan_digest(plan: list[RequestBatch], vocab_size: int) -> str:
    """sha256 of everything the plan sends (token ids, lengths, sampling): two rounds with the
    same digest sent the same traffic."""
    h = hashlib.sha256()
    for b in plan:
        h.update(json.dumps([b.label, b.max_tokens, b.prompts(vocab_size),
                             [b.sampling_for(i) for i in range(b.num_requests)]],
                            sort_keys=True, default=str).encode())
    return "sha256:" + h.hexdigest()


__all__ = ["EngineLimits", "RequestBatch", "SAMPLING_KINDS", "decode_sizes",
           "default_capture_sizes", "limits_from_serve_args", "limits_from_vllm_config",
           "plan_digest", "plan_requests", "plan_summary", "sampling_batches", "token_ids"]

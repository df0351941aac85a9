#!/usr/bin/env python3
"""Start vLLM's engine as the server would from an installed bake, then send traffic; time it.

    python3 bench/vllm_serve_probe.py SERVE_ARGS.json OUT.json

SERVE_ARGS.json is ``cachebake serve-args ART --root DIR --json`` (model path, the ``vllm serve``
flags, the environment).  The flags are parsed by vLLM's own CLI parser, exactly as ``vllm
serve`` would; the environment is applied before vLLM is imported.  The weights are dummy and
there is no tokenizer (the only additions to the server's arguments: no weights travel here),
and ``jit_monitor_verbose`` turns on vLLM's own JIT monitor, whose warnings the table counts.

Phases, each timed (unix times in OUT.json, so compile events can be attributed):
``startup`` (``LLM(...)``), ``first`` (one 100-token prompt, 8 tokens), ``plan`` (the bake's
request plan, as the vllm driver sends it), ``unseen`` (traffic the plan does not send:
other batch sizes, prompt lengths and sampling mixes, admitted as they arrive).
Compiles are counted outside this process, from CACHEBAKE_MONITOR_LOG (the caller puts the
monitor's sitecustomize on PYTHONPATH so the EngineCore process is watched too).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time


def parse_engine_kwargs(model: str, flags: list[str]) -> dict:
    """The EngineArgs fields the flags set, through vLLM's own parser (defaults left out)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    given = vars(parser.parse_args(["--model", model, *flags]))
    default = vars(parser.parse_args(["--model", model]))
    return {k: v for k, v in given.items() if v != default.get(k) and k != "model"}


def unseen_batches(vocab: int, max_len: int, max_seqs: int) -> list[tuple[str, list, list]]:
    """Traffic a server meets that the plan does not send: (label, prompts, sampling kwargs)."""
    rng = random.Random(20261130)
    out = []

    def ids(n):
        return [16 + rng.randrange(vocab - 16) for _ in range(n)]

    for n in (5, 11, 23, 47, 100, 200):
        n = min(n, max_seqs)
        lens = [rng.randint(1, min(3000, max_len - 64)) for _ in range(n)]
        params = [rng.choice([{"temperature": 0.0}, {"temperature": 0.3, "seed": i},
                              {"temperature": 0.9, "top_p": 0.8, "seed": i}])
                  for i in range(n)]
        out.append((f"random-{n}", [ids(x) for x in lens], params))
    long_len = min(5000, max_len - 64)
    out.append(("long+20-short", [ids(long_len)] + [ids(rng.randint(5, 60)) for _ in range(20)],
                [{"temperature": 0.0}] * 21))
    prefix = ids(600)
    out.append(("shared-prefix-8", [prefix + ids(rng.randint(10, 200)) for _ in range(8)],
                [{"temperature": 0.5, "seed": 7}] * 8))
    out.append(("logprobs-9", [ids(rng.randint(20, 400)) for _ in range(9)],
                [{"temperature": 0.0, "logprobs": 3}] * 9))
    return out


def main() -> None:
    spec_path, out_path = sys.argv[1], sys.argv[2]
    spec = json.load(open(spec_path))
    # `serve-args --json`: {"model_path", "argv": ["vllm", "serve", MODEL, *flags], "env"}
    spec["model"], spec["flags"] = spec["model_path"], spec["argv"][3:]
    os.environ.update({k: str(v) for k, v in spec["env"].items()})
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    report: dict = {"serve_args": spec, "phases": {}, "batches": []}

    def phase(name, t0):
        report["phases"][name] = {"start": t0, "end": time.time(), "seconds": round(time.time() - t0, 3)}

    t0 = time.time()
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from cachebake.vllm.engine import generate_at_once
    from cachebake.vllm.request_plan import limits_from_vllm_config, plan_requests

    kwargs = parse_engine_kwargs(spec["model"], spec["flags"])
    llm = LLM(model=spec["model"], load_format="dummy", skip_tokenizer_init=True,
              jit_monitor_verbose=True, **kwargs)
    phase("startup", t0)
    report["vllm_version"] = vllm.__version__
    report["engine_kwargs"] = {k: str(v) for k, v in kwargs.items()}
    hf = json.load(open(os.path.join(spec["model"], "config.json")))
    vocab = int(hf.get("vocab_size") or 32000)
    cfg = llm.llm_engine.vllm_config
    report["model_runner"] = "v2" if getattr(cfg, "use_v2_model_runner", False) else "v1"

    def send(label, prompts, params, at_once):
        sp = [SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False, **p) for p in params]
        t = time.time()
        tp = [TokensPrompt(prompt_token_ids=p) for p in prompts]
        if at_once:
            outs, paused = generate_at_once(llm, tp, sp)
        else:
            outs, paused = llm.generate(tp, sp, use_tqdm=False), False
        report["batches"].append({"label": label, "requests": len(prompts),
                                  "prompt_tokens": sum(map(len, prompts)),
                                  "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                                  "seconds": round(time.time() - t, 3), "admitted_at_once": paused,
                                  "start": t})

    t0 = time.time()
    send("first", [[16 + (7 * i) % (vocab - 16) for i in range(100)]], [{"temperature": 0.0}], False)
    phase("first", t0)
    report["first_request_seconds"] = report["phases"]["first"]["seconds"]

    t0 = time.time()
    lim = limits_from_vllm_config(cfg, hf)
    for b in plan_requests(hf, {}, lim):  # the limits vLLM resolved decide the plan
        params = [b.sampling_for(i) for i in range(b.num_requests)]
        t = time.time()
        sps = [SamplingParams(max_tokens=b.max_tokens, ignore_eos=True, detokenize=False, **p)
               for p in params]
        outs, paused = generate_at_once(llm, [TokensPrompt(prompt_token_ids=p) for p in b.prompts(vocab)], sps)
        report["batches"].append({"label": f"plan:{b.label}", "requests": b.num_requests,
                                  "prompt_tokens": b.prompt_tokens,
                                  "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
                                  "seconds": round(time.time() - t, 3), "admitted_at_once": paused,
                                  "start": t})
    phase("plan", t0)

    t0 = time.time()
    for label, prompts, params in unseen_batches(vocab, lim.max_model_len, lim.max_num_seqs):
        send(f"unseen:{label}", prompts, params, at_once=False)
    phase("unseen", t0)
    with open(out_path, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v["seconds"] for k, v in report["phases"].items()}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""One `vllm serve` from `cachebake serve-args`, driven by vLLM's own client, measured.

    python3 bench/vllm_serve_run.py --serve-args SA.json --tok TOKDIR --port P --work DIR \
        [--uid N] [--home H] [--traffic] --out RESULT.json

Starts vLLM's real OpenAI server (``python3 -m vllm.entrypoints.cli.main serve``) with the
flags and environment serve-args printed (``--json``), plus ``--tokenizer``, ``--load-format
dummy`` (weights never enter a key; LoadConfig is not hashed) and a loopback port, as uid
``--uid`` with ``HOME=--home`` when given (setpriv), with cachebake's compile monitor on
(its sitecustomize on PYTHONPATH: every Triton compile of every server process is a line).
Then polls /health, and with ``--traffic`` runs ``vllm bench serve`` scenarios in this process
(vllm.benchmarks.serve.main: vLLM's client, imported once): random lengths, long prompts,
sequential, top-p only, top-k with top-p, prefix repetition, 256-way decode, Poisson arrivals.

RESULT.json: ready seconds (launch to /health 200), the per-phase breakdown of its log
(bench/ready_breakdown.py, from the launch time), vLLM's own "init engine" and
"torch.compile took" figures from its log, whether it logged "Directly load AOT compilation",
the cache directories it used, Triton compiles through start-up and through the traffic
(kernel names), and each scenario's request count and median/p99 TTFT.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

AUTOLOAD = str(Path(__file__).resolve().parent.parent / "cachebake" / "capture" / "autoload")
sys.path.insert(0, str(Path(__file__).resolve().parent))
import ready_breakdown  # noqa: E402  (bench/ready_breakdown.py: per-phase seconds from the log)

SCENARIOS = [  # (name, extra `vllm bench serve` args)
    ("random", ["--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "32",
                "--random-range-ratio", "0.9", "--num-prompts", "64", "--max-concurrency", "16"]),
    ("long", ["--dataset-name", "random", "--random-input-len", "3500", "--random-output-len", "16",
              "--num-prompts", "8", "--max-concurrency", "4"]),
    ("sequential", ["--dataset-name", "random", "--random-input-len", "200", "--random-output-len", "24",
                    "--num-prompts", "6", "--max-concurrency", "1"]),
    ("top-p", ["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "32",
               "--num-prompts", "48", "--max-concurrency", "24", "--temperature", "0.8", "--top-p", "0.9"]),
    ("top-k-top-p", ["--dataset-name", "random", "--random-input-len", "256", "--random-output-len", "32",
                     "--num-prompts", "48", "--max-concurrency", "24", "--temperature", "0.8",
                     "--top-k", "50", "--top-p", "0.9"]),
    ("prefix", ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "512",
                "--prefix-repetition-suffix-len", "64", "--prefix-repetition-num-prefixes", "4",
                "--prefix-repetition-output-len", "32", "--num-prompts", "48", "--max-concurrency", "16"]),
    ("decode-256", ["--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "64",
                    "--num-prompts", "256", "--max-concurrency", "256"]),
    ("poisson", ["--dataset-name", "random", "--random-input-len", "300", "--random-output-len", "32",
                 "--random-range-ratio", "0.5", "--num-prompts", "64", "--request-rate", "16"]),
]


def compiles(events: Path) -> list[str]:
    if not events.exists():
        return []
    out = []
    for line in events.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("kind") in ("compile", "autotune", "helper_build"):
            out.append(f"{e['kind']}:{e.get('kernel')}")
    return out


def log_facts(text: str) -> dict:
    def last_float(pattern):
        found = re.findall(pattern, text)
        return float(found[-1]) if found else None
    return {
        "engine_init_s": last_float(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)"),
        "torch_compile_s": last_float(r"torch\.compile took ([0-9.]+) s in total"),
        "aot_loaded": "Directly load AOT compilation" in text,
        "graphs_loaded_from_cache": len(re.findall(r"Directly load the compiled graph", text)),
        "graphs_compiled": len(re.findall(r"Compiling a graph for", text)),
        "cache_dirs": sorted(set(re.findall(r"Using cache directory: (\S+)", text))),
    }


def run_traffic(base_url: str, model: str, tok: str, work: Path) -> list[dict]:
    from vllm.benchmarks.serve import add_cli_args, main

    results = []
    for name, extra in SCENARIOS:
        parser = argparse.ArgumentParser()
        add_cli_args(parser)
        args = parser.parse_args(["--backend", "vllm", "--base-url", base_url, "--model", model,
                                  "--tokenizer", tok, "--ignore-eos", "--disable-tqdm",
                                  "--seed", "1", *extra])
        t0 = time.monotonic()
        try:
            r = main(args) or {}
            results.append({"scenario": name, "seconds": round(time.monotonic() - t0, 1),
                            "completed": r.get("completed"), "failed": r.get("failed"),
                            "median_ttft_ms": r.get("median_ttft_ms"),
                            "p99_ttft_ms": r.get("p99_ttft_ms")})
        except Exception as e:  # noqa: BLE001 - recorded: a scenario that breaks is a result
            results.append({"scenario": name, "error": f"{type(e).__name__}: {e}"})
    return results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve-args", required=True)
    ap.add_argument("--tok", required=True)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--work", required=True)
    ap.add_argument("--uid", type=int)
    ap.add_argument("--home")
    ap.add_argument("--traffic", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    sa = json.loads(Path(a.serve_args).read_text())
    argv = sa["argv"]  # ["vllm", "serve", MODEL, FLAGS...]
    model = argv[2]
    env = {k: v for k, v in os.environ.items()}
    if a.home:
        env["HOME"] = a.home
    env.update(sa["env"])
    events = work / "events.jsonl"
    events.touch()
    env["CACHEBAKE_MONITOR_LOG"] = str(events)
    env["PYTHONPATH"] = AUTOLOAD + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model, *argv[3:],
           "--tokenizer", a.tok, "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(a.port)]
    if a.uid is not None:
        os.chown(work, a.uid, a.uid)
        os.chown(events, a.uid, a.uid)
        cmd = ["setpriv", f"--reuid={a.uid}", f"--regid={a.uid}", "--clear-groups", *cmd]
    log_path = work / "server.log"
    t0 = time.monotonic()
    launched = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp",
                                start_new_session=True)
    ready = None
    while time.monotonic() - t0 < 420 and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{a.port}/health", timeout=2) as r:
                if r.status == 200:
                    ready = round(time.monotonic() - t0, 1)
                    break
        except OSError:
            pass
        time.sleep(0.5)
    result = {"cmd": cmd, "home": env.get("HOME"), "uid": a.uid if a.uid is not None else os.getuid(),
              "ready_s": ready, "exit_code": proc.poll(), "launched_epoch": round(launched, 3)}
    result["startup_compiles"] = compiles(events)
    if ready is not None and a.traffic:
        result["traffic"] = run_traffic(f"http://127.0.0.1:{a.port}", model, a.tok, work)
        result["traffic_compiles"] = compiles(events)[len(result["startup_compiles"]):]
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    text = log_path.read_text(errors="replace")
    result.update(log_facts(text))
    # the server's stamps are its local time; the scripts run with TZ unset (UTC)
    result["breakdown"] = ready_breakdown.breakdown(text.splitlines(), start=launched,
                                                    year=time.gmtime(launched).tm_year)
    Path(a.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("cmd", "traffic")}, indent=1))
    for t in result.get("traffic", []):
        print(json.dumps(t))
    return 0 if ready is not None else 1


if __name__ == "__main__":
    sys.exit(main())

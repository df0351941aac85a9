#!/usr/bin/env python3
"""Stands in for vLLM's CLI where there is no GPU and no vLLM (the container tests' serving
image, the Pod runner's tests): `vllm serve MODEL FLAGS...` does, with the environment the Pod
or image gives it, what the real server (vLLM 0.24 / 0.34 on torch 2.11 / 2.14) does to the
filesystem before it serves, in the same order, and fails where it would fail:

1. at `import vllm` (torch._dynamo is imported): Inductor's cache dir is made;
2. the API server: the usage-stats thread, the engine's IPC socket;
3. the engine: the model directory's config.json is read; its Triton kernels: the baked ones
   must be cache hits (`cachebake verify` on the cache TRITON_CACHE_DIR names, with the warmup
   the bake ran), and one kernel the bake lacks compiles as a miss, in a child process with the
   server's environment (as an engine worker), through the cache manager that environment names;
4. torch.compile: its cache directories and a file written as a miss writes it.

Then it prints one JSON line, `STAND-IN-SERVER {...}` (what it was given, what it wrote where,
the verify report), and stays up as a server does.  An OSError at step 1 is not caught: the
real server dies there with the same traceback (issue 30: `OSError: [Errno 30] Read-only file
system: '/var/cache/cachebake/inductor'`).

The warmup kernels: `$CACHEBAKE_STANDIN_KERNELS/aot_kernels.py` (default /opt/cachebake-ci, where
the container tests' serving image has it)."""

import getpass
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

argv = sys.argv[1:]
if argv[:1] != ["serve"] or len(argv) < 2:
    sys.exit(f"stand-in vllm: expected `vllm serve MODEL ...`, got {argv}")
model = argv[1]
env = os.environ
report = {"argv": argv, "model_config": None, "model_writable": None, "wrote": {}}
wrote = report["wrote"]

# -- 1. import vllm -> import torch._dynamo ------------------------------------------------------
# torch/_dynamo/package.py:1299 (torch 2.14; 2.11: :1173) runs at import:
#   DynamoCache = DiskDynamoCache(os.path.join(cache_dir(), "dynamo"))
# and torch/_inductor/runtime/cache_dir_utils.py:14-21 (2.11: :14-19) `cache_dir()` is
#   TORCHINDUCTOR_CACHE_DIR or default_cache_dir() = {tempfile.gettempdir()}/torchinductor_{user}
#   (:24-34, user from getpass, else uid_N), made absolute and written back to the env, then
#   os.makedirs(cache_dir, exist_ok=True): not caught anywhere, so a read-only dir kills the
#   server at import.  Not caught here either.


def _default_inductor_dir() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # cache_dir_utils.py: getpass fails for a uid without a passwd entry
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


inductor = os.path.abspath(env.get("TORCHINDUCTOR_CACHE_DIR") or _default_inductor_dir())
os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor
os.makedirs(inductor, exist_ok=True)
wrote["inductor_dir"] = inductor

# vllm/envs.py (0.34 :757 VLLM_CACHE_ROOT, :748 VLLM_CONFIG_ROOT; 0.24 :623 the config root):
# $VLLM_CACHE_ROOT or {XDG_CACHE_HOME or ~/.cache}/vllm; $VLLM_CONFIG_ROOT or
# {XDG_CONFIG_HOME or ~/.config}/vllm, each expanduser'ed.
cache_root = os.path.expanduser(env.get("VLLM_CACHE_ROOT") or os.path.join(
    env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm"))
config_root = os.path.expanduser(env.get("VLLM_CONFIG_ROOT") or os.path.join(
    env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "vllm"))

# -- 2. the API server ---------------------------------------------------------------------------
# vllm/usage/usage_lib.py:50-68: off with VLLM_NO_USAGE_STATS=1, VLLM_DO_NOT_TRACK=1 or
# DO_NOT_TRACK=1; else a background thread writes {VLLM_CONFIG_ROOT}/usage_stats.json
# (:28-29; `_write_to_file` :273-278 makes the dir first).  A failure there is a thread's
# traceback on stderr, not a failed start: the same here.
usage_off = any(env.get(k) == "1" for k in ("VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK"))


def _usage_stats() -> None:
    os.makedirs(config_root, exist_ok=True)
    with open(os.path.join(config_root, "usage_stats.json"), "a") as f:
        f.write(json.dumps({"stand_in": True}) + "\n")
    wrote["usage_stats"] = os.path.join(config_root, "usage_stats.json")


if not usage_off:
    t = threading.Thread(target=_usage_stats, name="usage-stats", daemon=True)
    t.start()
    t.join()

# vllm/utils/network_utils.py:175-177 `get_open_zmq_ipc_path()` = ipc://{VLLM_RPC_BASE_PATH}/{uuid4}
# (VLLM_RPC_BASE_PATH default tempfile.gettempdir(), envs.py:775); the bind makes the dir
# (:411-418).  The API server and the engine core talk over it: a failure stops the start.
rpc_base = env.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
os.makedirs(rpc_base, exist_ok=True)
ipc = os.path.join(rpc_base, str(uuid.uuid4()))
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.bind(ipc)
wrote["ipc_socket"] = ipc

# -- 3. the engine -------------------------------------------------------------------------------
try:
    with open(os.path.join(model, "config.json")) as f:
        report["model_config"] = json.load(f)
except OSError as e:
    sys.exit(f"stand-in vllm: no model at {model}: {e}")
report["model_writable"] = os.access(model, os.W_OK)

kernels = os.path.join(env.get("CACHEBAKE_STANDIN_KERNELS", "/opt/cachebake-ci"), "aot_kernels.py")
if env.get("TRITON_CACHE_DIR"):
    root = os.path.dirname(env["TRITON_CACHE_DIR"])
    done = subprocess.run(["cachebake", "verify", "--cache", root, "--json", "--", sys.executable, kernels],
                          capture_output=True, text=True)
    report["verify_rc"] = done.returncode
    report["verify"] = json.loads(done.stdout[done.stdout.index("{"):]) if "{" in done.stdout else done.stderr
# A kernel the bake does not hold (a serve flag the bake lacked): Triton compiles it and stores
# it through `get_cache_manager` (triton/runtime/cache.py: TRITON_CACHE_MANAGER, else
# FileCacheManager, whose __init__ makes {knobs.cache.dir}/{key} (:50-55) and whose put() writes
# a tmp dir there then os.replace: a read-only TRITON_CACHE_DIR fails the compile, and the
# engine with it).  In a child with this environment, as in vLLM's engine-core process; the
# cachebake vLLM plugin (entry point cachebake_monitor) turns the layered manager on there when
# CACHEBAKE_OVERLAY_DIR is set, which TRITON_CACHE_MANAGER also names.
_MISS = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import triton, aot_kernels
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
seen = []
triton.knobs.compilation.listener = lambda **kw: seen.append(kw["cache_hit"])
fn, sig, consts = aot_kernels.SPECS[0]
k = triton.compile(ASTSource(fn, sig, constexprs={"BLOCK": 1024}, attrs={}), target=GPUTarget("cuda", 90, 32))
from triton.runtime.cache import get_cache_manager
manager = type(get_cache_manager(k.hash))  # TRITON_CACHE_MANAGER's class, else FileCacheManager
print(json.dumps({"hits": seen.count(True), "misses": seen.count(False), "key": k.hash,
                  "manager": f"{manager.__module__}:{manager.__qualname__}"}))
"""
miss = subprocess.run([sys.executable, "-c", _MISS, os.path.dirname(kernels)], capture_output=True, text=True)
if miss.returncode != 0:
    sys.stderr.write(miss.stderr)
    sys.exit(f"stand-in vllm: the engine died compiling a kernel the bake lacks (exit {miss.returncode})")
report["miss_compile"] = json.loads(miss.stdout.strip().splitlines()[-1])

# -- 4. torch.compile ----------------------------------------------------------------------------
# vllm/compilation/backends.py:1098-1101 (0.34; 0.24 :~1085): the JIT cache dir
# {VLLM_CACHE_ROOT}/torch_compile_cache/<10 hex>/rank_{rank}_{dp}/<prefix>, made with
# os.makedirs; :1133-1146 writes cache_key_factors.json there on every start; Inductor then saves
# the graphs it compiles beside it.  On an AOT hit (0.34 decorators.py:580-589, 0.24 the same
# branch) TORCHINDUCTOR_CACHE_DIR is set to torch_compile_cache/torch_aot_compile/<hash>/
# inductor_cache, which Inductor writes into when it loads, and the mega artifact's load makes
# {VLLM_CACHE_ROOT}/dummy_cache (0.34 caching.py:521-522): so VLLM_CACHE_ROOT is written even on
# a full hit.  The hashes here are the stand-in's own (argv), not vLLM's.
key = hashlib.sha256(json.dumps(argv).encode()).hexdigest()
local = os.path.join(cache_root, "torch_compile_cache", key[:10], "rank_0_0", "backbone")
os.makedirs(local, exist_ok=True)
with open(os.path.join(local, "cache_key_factors.json"), "w") as f:
    json.dump({"stand_in": True, "argv": argv}, f)
wrote["torch_compile_cache"] = local
aot_inductor = os.path.join(cache_root, "torch_compile_cache", "torch_aot_compile", key, "inductor_cache")
os.makedirs(aot_inductor, exist_ok=True)
os.makedirs(os.path.join(cache_root, "dummy_cache"), exist_ok=True)
wrote["aot_inductor_cache"] = aot_inductor

# FlashInfer (flashinfer/jit/env.py:67-70, 0.7.4): FLASHINFER_WORKSPACE_BASE (default HOME) ->
# {base}/.cache/flashinfer, its JIT workspace {cache}/{version}/{arch} (:382-391) made when it
# JIT-compiles (vLLM's FlashInfer sampler and attention backends).  Only when set, as the
# serving environment of a bake with a flashinfer role sets it.
if env.get("FLASHINFER_WORKSPACE_BASE"):
    fi = os.path.join(env["FLASHINFER_WORKSPACE_BASE"], ".cache", "flashinfer", "standin", "90")
    os.makedirs(fi, exist_ok=True)
    wrote["flashinfer_workspace"] = fi

print("STAND-IN-SERVER " + json.dumps(report), flush=True)
while True:
    time.sleep(3600)

"""The serve-args dialect: the vLLM serving arguments a bake runs with and a server must start
with, and how a bake's ``--model``/``--tp``/``--serve-args`` resolve into them.

A bake only hits when the server runs with the same serving arguments (every argument that
shapes a kernel: TP size, dtype, max_num_seqs, max_num_batched_tokens, block size, prefix
caching, mamba cache dtypes, speculative decoding, compilation config).  Here they are one plain
dict of ``EngineArgs`` field names, parsed from JSON or ``vllm serve`` flags
(``parse_serve_args``), checked (``validate_serve_args`` refuses ``enforce_eager``: it turns off
vLLM's JIT warmup and CUDA graph capture, so a bake with it misses most of what the server
compiles at startup), turned back into the exact flags (``serve_args_to_flags``), and resolved
against a recipe (``resolve``).  The driver, the plan, ``serve-args`` and ``k8s`` all read them
from here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from cachebake.errors import BadInput, CachebakeError
from cachebake.jsonio import parse_json

# Set by the driver, never by serve args: the bake needs them, the server must not copy them.
DRIVER_OWNED = ("model", "load_format", "skip_tokenizer_init")


# Bake-only settings the driver adds; `serve-args` leaves them out of the server's command.
BAKE_ONLY = {"load_format": "dummy", "skip_tokenizer_init": True}


def validate_serve_args(serve_args: dict[str, Any]) -> dict[str, Any]:
    """Refuse serve args a bake cannot honestly run with; return them unchanged otherwise."""
    if not isinstance(serve_args, dict):
        raise BadInput(f"serve args must be a mapping of vLLM engine arguments, not {type(serve_args).__name__}")
    if serve_args.get("enforce_eager"):
        raise BadInput("refusing enforce_eager: it disables vLLM's JIT warmup and CUDA graph capture, "
                       "so the bake would miss what the server compiles at startup; remove it "
                       "(and serve without it)")
    owned = [k for k in DRIVER_OWNED if k in serve_args]
    if owned:
        raise BadInput(f"serve args must not set {', '.join(owned)}: the vllm driver sets them "
                       "(the model comes from --model, weights are dummy, no tokenizer is loaded)")
    bad = [k for k in serve_args if not isinstance(k, str) or not k.replace("_", "").isalnum()]
    if bad:
        raise BadInput(f"serve args have keys that are no engine argument names: {bad}")
    return serve_args


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def serve_args_to_flags(serve_args: dict[str, Any]) -> list[str]:
    """The ``vllm serve`` flags for ``serve_args`` (EngineArgs names), in the dict's order.

    True -> ``--x``; False -> ``--no-x`` (vLLM's boolean engine args accept both); None is left
    out (vLLM's default); dicts (speculative_config, compilation_config...) -> compact JSON;
    lists -> one value per item."""
    out: list[str] = []
    for key, value in serve_args.items():
        if value is None:
            continue
        if value is True:
            out.append(_flag(key))
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            out += [_flag(key), json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            out += [_flag(key), *(str(v) for v in value)]
        else:
            out += [_flag(key), str(value)]
    return out


def _scalar(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text[:1] in "{[":
        try:
            return parse_json(text, "a serve-args value")
        except CachebakeError:  # not strict JSON (or nested past jsonio's limit): the text
            pass
    return text


def parse_serve_args(text: str) -> dict[str, Any]:
    """``--serve-args`` text: a JSON object, or ``vllm serve``-style flags
    (``--max-num-seqs 64 --enable-prefix-caching --no-enforce-eager``)."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            data = parse_json(text, "--serve-args")
        except CachebakeError as e:
            raise BadInput(f"--serve-args is not valid JSON: {e.line()}") from None
        if not isinstance(data, dict):
            raise BadInput("--serve-args JSON must be an object")
        return data
    try:
        words = shlex.split(text)
    except ValueError as e:  # an unbalanced quote or a trailing backslash
        raise BadInput(f"--serve-args: {str(e).lower()} (the flags are read as a shell would)") from None
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("--"):
            raise BadInput(f"--serve-args: expected a --flag, got {w!r} (a model path does not go here)")
        name, eq, val = w[2:].partition("=")
        key = name.replace("-", "_")
        values: list[str] = [val] if eq else []
        if not eq:
            while i + 1 < len(words) and not words[i + 1].startswith("--"):
                values.append(words[i + 1])
                i += 1
        if not values:
            if key.startswith("no_"):
                out[key[3:]] = False
            else:
                out[key] = True
        elif len(values) == 1:
            out[key] = _scalar(values[0])
        else:
            out[key] = [_scalar(v) for v in values]
        i += 1
    return out


# Where model directories live unless the user names another: a bake's default model dir, the
# k8s model volume's mount (cachebake.distribute.k8s), a fold round's model dir from a base.
MODEL_DIR_BASE = "/models"


def default_model_dir(recipe) -> str:
    """Where a bake puts a recipe's model when no path is given: pass the server's path instead."""
    slug = recipe.name.replace("/", "-")
    return f"{MODEL_DIR_BASE}/{slug}-{recipe.variant}" if recipe.variant else f"{MODEL_DIR_BASE}/{slug}"


def resolve(model: str, tp: int | None = None, *, serve_args: dict[str, Any] | str | None = None,
            model_dir: str | None = None) -> tuple[Any, dict[str, Any], str]:
    """A bake's recipe, final serve args and model dir, without touching the disk.

    Serve args: the recipe's defaults updated by ``serve_args`` (dict, JSON or flags); ``tp``
    overrides tensor_parallel_size when given.  Model dir: ``model_dir``, else a local model's
    own directory (baked where it is served from), else ``default_model_dir``."""
    from cachebake.recipes import load_recipe

    recipe = load_recipe(model)
    extra = parse_serve_args(serve_args) if isinstance(serve_args, str) else dict(serve_args or {})
    args = {**recipe.serve_args, **extra}
    if tp is not None:
        args["tensor_parallel_size"] = int(tp)
    validate_serve_args(args)
    if model_dir is None and recipe.local_path:
        local = Path(recipe.local_path)
        model_dir = str(local.parent if local.is_file() else local)
    elif model_dir is None:
        model_dir = default_model_dir(recipe)
    return recipe, args, str(model_dir)


# ---- the model reference and the torch.compile identity a server must match -----------------
#
# vLLM names its torch.compile cache by hashes of the environment (``envs.compile_factors()``),
# the engine configuration (``VllmConfig.compute_hash()``, which holds the model string), the
# traced source files and the compiler (vllm/compilation/backends.py ``VllmBackend.__call__``;
# the AOT artifact by the first two and the model's forward: compilation/decorators.py).  The
# vllm driver records all of it as vLLM computed it in the round (``IDENTITY_KEY`` of the bake
# section, cachebake.vllm.identity); what follows turns that record into what a server
# must be given, without vLLM, so install, serve-args, k8s and the installer image can use it.

IDENTITY_KEY = "compile_identity"

# A Hugging Face repo id as huggingface_hub's ``validate_repo_id`` accepts it ("org/name"), and
# nothing else: one slash, no "--" or "..", at most 96 characters.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,127}\Z")
_VLLM_ENV_NAME = re.compile(r"VLLM_[A-Z0-9_]{1,123}\Z")
MAX_PATH_CHARS = 4096
MAX_PATH_FACTORS = 64


def hub_repo_id(text: str) -> str | None:
    """``text`` if it is a Hugging Face repo id ("org/name"), else None."""
    if (isinstance(text, str) and len(text) <= 96 and _HUB_ID.match(text) and "--" not in text
            and ".." not in text and not text.endswith(".git")):
        return text
    return None


def model_reference(text: str) -> tuple[str, str]:
    """What ``--model-dir`` names: ("path", absolute path) or ("hub", "org/name").

    The string is what the server passes to ``vllm serve`` and it enters vLLM's config hash
    (``ModelConfig.model``), so an absolute path is kept exactly as given.  A relative path is
    made absolute; one that is also a repo id ("models/x") is refused when it exists here,
    because vLLM itself would take it as a local directory (repo_utils: ``Path(model).exists()``
    comes first) while another working directory would take it as a repo id."""
    if not isinstance(text, str) or not text or "\0" in text or any(ord(c) < 32 for c in text):
        raise BadInput(f"--model-dir {text!r}: not a path or a Hugging Face repo id")
    if os.path.isabs(text):
        return "path", text
    repo = hub_repo_id(text)
    if repo is not None:
        if os.path.exists(text):
            raise BadInput(f"--model-dir {text}: both a directory here and a Hugging Face repo id; "
                           f"give {os.path.abspath(text)} for the directory (vLLM takes a "
                           "relative path that exists as a local directory)")
        return "hub", repo
    return "path", os.path.abspath(text)


def _identity_path(identity: dict, field_name: str, value: Any) -> str:
    from cachebake.errors import InvalidDocument

    if (not isinstance(value, str) or not os.path.isabs(value) or len(value) > MAX_PATH_CHARS
            or any(ord(c) < 32 or 0x7f <= ord(c) < 0xa0 or ord(c) in (0x2028, 0x2029) for c in value)):
        raise InvalidDocument("bake manifest", f"bake.{IDENTITY_KEY}.{field_name}",
                              "is not an absolute path")
    return value


def identity_serve_env(bake: dict[str, Any]) -> dict[str, str]:
    """The variables a server must get so that vLLM computes the bake's torch.compile hashes
    whatever its HOME, XDG dirs and uid: {} for a bake without a recorded identity.

    - ``path_factors``: the compile factors whose values the bake's round found to follow
      HOME/XDG (vLLM's own getters, re-run with other HOME/XDG values:
      cachebake.vllm.identity), e.g. vLLM 0.24's VLLM_CONFIG_ROOT and
      VLLM_XLA_CACHE_PATH, exported with the values the bake hashed; vLLM 0.33 stopped hashing
      them, and its bakes record none;
    - ``model.hf_hub_cache``: a hub id that vLLM resolved, offline, to a snapshot under this
      Hugging Face cache (EngineArgs.__post_init__ puts the snapshot path in ModelConfig.model):
      HF_HUB_CACHE and HF_HUB_OFFLINE=1, or the server hashes another model string.

    The record comes from an artifact, so only what it may hold is taken: VLLM_ names that
    are among its own compile factors with the same value, and absolute one-line paths (no C0
    or C1 control: they reach terminals and env files); anything else is refused
    (InvalidDocument, exit 5), never exported.  These are candidates: the one function that
    builds a server's environment (cachebake.install.environment.server_env) lets only its
    ``IDENTITY_NAMES`` through, so this route cannot set a role's variable or a knob."""
    from cachebake.errors import InvalidDocument

    identity = bake.get(IDENTITY_KEY)
    if identity is None:
        return {}
    where = f"bake.{IDENTITY_KEY}"
    if not isinstance(identity, dict):
        raise InvalidDocument("bake manifest", where, "is not an object")
    factors = identity.get("env_factors")
    path_factors = identity.get("path_factors")
    factors = {} if factors is None else factors
    path_factors = {} if path_factors is None else path_factors
    if not isinstance(factors, dict) or not isinstance(path_factors, dict):
        raise InvalidDocument("bake manifest", where, "env_factors/path_factors are not objects")
    if len(path_factors) > MAX_PATH_FACTORS:
        raise InvalidDocument("bake manifest", f"{where}.path_factors",
                              f"has {len(path_factors)} entries (at most {MAX_PATH_FACTORS})")
    env: dict[str, str] = {}
    for name, value in sorted(path_factors.items()):
        if not _VLLM_ENV_NAME.match(name):
            raise InvalidDocument("bake manifest", f"{where}.path_factors",
                                  f"names {name[:80]!r}, which is no vLLM variable")
        if factors.get(name) != value:
            raise InvalidDocument("bake manifest", f"{where}.path_factors.{name}",
                                  "differs from the value the bake hashed (env_factors)")
        env[name] = _identity_path(identity, f"path_factors.{name}", value)
    model = identity.get("model")
    model = {} if model is None else model
    if not isinstance(model, dict):
        raise InvalidDocument("bake manifest", f"{where}.model", "is not an object")
    if model.get("hf_hub_cache") is not None:
        env["HF_HUB_CACHE"] = _identity_path(identity, "model.hf_hub_cache", model["hf_hub_cache"])
        env["HF_HUB_OFFLINE"] = "1"
    return env


# ---- the flags a logged server may hand a fold round ------------------------------------------
#
# Fold-back (cachebake.replay.vllm_fold) runs vLLM's engine on the fold machine with the serve
# flags a server logged (cachebake.serve.vllm_misses).  A log is the pod's, so only flags that
# shape what torch.compile and the kernels compile pass, with plain values: no flag that loads
# code (trust_remote_code, worker or logits-processor classes, compilation passes), names a
# place or a service (paths, tokenizers, downloads, KV connectors) or another model
# (speculative_config).  A flag outside this list keeps its miss from being folded, named.
FOLD_FLAGS = frozenset({
    "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "dtype",
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size",
    "enable_prefix_caching", "enable_chunked_prefill", "mamba_ssm_cache_dtype", "mamba_cache_dtype",
    "mamba_block_size", "kv_cache_dtype", "gpu_memory_utilization", "quantization", "seed",
    "cuda_graph_sizes", "max_seq_len_to_capture", "max_cudagraph_capture_size", "async_scheduling",
    "disable_cascade_attn", "enable_expert_parallel", "kv_cache_memory_bytes",
    "num_gpu_blocks_override", "max_num_partial_prefills", "long_prefill_token_threshold",
    "disable_custom_all_reduce", "calculate_kv_scales",
})
# Flags that only say how the server is reached, logs, or finds its weights and tokenizer, never
# what it compiles: a fold round leaves them out of a logged flag set (named in its plan) rather
# than refusing the set.  A served Pod always has some (--port, and the bench runner's
# --load-format dummy --tokenizer).  Left out means never applied, so a flag here that did shape
# the graphs shows as "not reproduced", never as a wrong bake.
SERVING_ONLY_FLAGS = frozenset({
    "host", "port", "uds", "tokenizer", "tokenizer_mode", "load_format", "download_dir",
    "served_model_name", "api_key", "uvicorn_log_level", "disable_uvicorn_access_log",
    "disable_log_stats", "disable_log_requests", "enable_log_requests", "max_log_len",
    "root_path", "allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials",
    "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "ssl_cert_reqs", "chat_template",
    "response_role", "enable_auto_tool_choice", "tool_call_parser", "enable_request_id_headers",
    "disable_fastapi_docs", "enable_prompt_tokens_details", "return_tokens_as_token_ids",
})
# A value that starts with "-" would read as a flag of its own in the round's command line
# (the plan shows `--serve-args '--dtype --trust-remote-code'`); numbers are logged as numbers.
_FOLD_TOKEN = re.compile(r"[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,63}\Z")


def fold_flag_problem(serve_args: Any, source: str = "a log") -> str | None:
    """Why serve args from ``source`` (a miss log, or the base artifact's own warmup) may not
    drive a fold round (None: they may): a mapping of ``FOLD_FLAGS`` names to booleans,
    numbers, short tokens or lists of integers."""
    if not isinstance(serve_args, dict):
        return "no serve flags were logged"
    for key, value in serve_args.items():
        if key not in FOLD_FLAGS:
            return (f"flag --{str(key).replace('_', '-')[:64]} is not one a fold round takes from "
                    f"{source} (only flags that shape the compiled graphs, never code, places or models)")
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if value != value or value in (float("inf"), float("-inf")):
                return f"flag --{key.replace('_', '-')} has a non-finite value"
            continue
        if isinstance(value, str) and _FOLD_TOKEN.match(value):
            continue
        if isinstance(value, list) and len(value) <= 256 and all(type(v) is int for v in value):
            continue
        return f"flag --{key.replace('_', '-')} has a value that is no plain token or number"
    return None

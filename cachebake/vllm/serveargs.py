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
from here.  What an artifact (or a server's log) may carry into a command is one allowlist,
``SERVE_ARG_KINDS`` (``carried_serve_args``, ``fold_flag_problem``): a user's own serve args are
never checked against it.
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


def carried_model_dir_problem(model_dir: Any) -> str | None:
    """Why a model dir an artifact recorded may not be where a round writes the model's
    config.json (the vllm driver's warmup: verify's installed warmup, a fold round), None where
    it may: a hub id, or a normalized absolute path under ``MODEL_DIR_BASE``, printable ASCII."""
    import posixpath

    if not model_dir or (isinstance(model_dir, str) and hub_repo_id(model_dir) is not None):
        return None
    if isinstance(model_dir, str) and model_dir.startswith(MODEL_DIR_BASE + "/") and \
            posixpath.normpath(model_dir) == model_dir and model_dir.isascii() and model_dir.isprintable():
        return None
    return (f"model dir {ascii(model_dir)[1:-1][:120]} is not under {MODEL_DIR_BASE}: a round writes the "
            "model's config.json there")


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


# ---- the serve args an artifact or a log may carry into a command ---------------------------
#
# An artifact's bake records the serve args it ran with, and `serve-args`, `k8s --bake`, `verify`
# (its installed warmup and --check-only) and fold-back (cachebake.replay.vllm_fold, which also
# takes the flags a server logged: cachebake.serve.vllm_misses) turn them into a `vllm serve`
# command or an engine run.  The artifact and the log are hostile, so only the args that shape
# what torch.compile and the kernels compile, or how the engine serves, pass, each with a value
# of its kind: no arg that loads code (trust_remote_code, worker, executor or logits-processor
# classes, compilation passes, a custom compile backend), names a place (download_dir, a cache
# or dump dir), a service (KV connectors, hosts) or another model (tokenizer, hf_overrides, a
# draft model).  One table for every such reader (``SERVE_ARG_KINDS``); a user's own
# --serve-args are theirs and never checked against it.

# A value that starts with "-" would read as a flag of its own in a command line (a fold plan
# showed `--serve-args '--dtype --trust-remote-code'`); numbers are logged as numbers.
_TOKEN = re.compile(r"[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,63}\Z")

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
_SIZE = re.compile(r"[0-9]{1,12}(\.[0-9]{1,6})?[kKmMgGtT]?[iI]?[bB]?\Z")  # vLLM's human_readable_int
_OP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}(::[A-Za-z_][A-Za-z0-9_.]{0,127})?\Z")
_CUSTOM_OP = re.compile(r"[+-]?[A-Za-z_][A-Za-z0-9_]{0,63}\Z")
MAX_LIST = 256
_DTYPES = frozenset({"auto", "half", "float16", "bfloat16", "float", "float32"})
_STATE_DTYPES = frozenset({"auto", "float32", "float16", "bfloat16"})
_KV_DTYPES = frozenset({"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"})
_CUDAGRAPH_MODES = frozenset({"NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"})
_COMPILE_MODES = frozenset({"NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"})
# vLLM resolves any other backend by its qualified name (an import): only its own names pass
_COMPILE_BACKENDS = frozenset({"", "inductor", "eager", "aot_eager"})
# speculative decoding that needs no second model: n-gram and suffix lookup, the model's own MTP
_SPEC_METHODS = frozenset({"ngram", "suffix", "mtp"})


def _is_int(v) -> bool:
    return type(v) is int and -(1 << 62) <= v <= 1 << 62


def _is_number(v) -> bool:
    return (_is_int(v) or type(v) is float) and v == v and v not in (float("inf"), float("-inf"))


def _bool(v) -> str | None:
    return None if v is None or isinstance(v, bool) else "must be true or false"


def _int(v) -> str | None:
    return None if v is None or _is_int(v) else "must be an integer"


def _size(v) -> str | None:  # an integer, or vLLM's "32k"/"1G" form
    return None if v is None or _is_int(v) or (isinstance(v, str) and _SIZE.match(v)) else \
        "must be an integer (or a size like 32k)"


def _number(v) -> str | None:
    return None if v is None or _is_number(v) else "must be a finite number"


def _token(v) -> str | None:
    return None if v is None or (isinstance(v, str) and _TOKEN.match(v)) else "must be a plain token"


def _ints(v) -> str | None:  # one integer or a list of them (cuda_graph_sizes takes both)
    if v is None or _is_int(v) or (isinstance(v, list) and len(v) <= MAX_LIST and all(map(_is_int, v))):
        return None
    return f"must be an integer or a list of at most {MAX_LIST} integers"


def _one_of(choices: frozenset[str]):
    def check(v) -> str | None:
        return None if v is None or (isinstance(v, str) and v in choices) else \
            f"must be one of {', '.join(sorted(choices))}"
    return check


def _dict_of(kinds: dict, what: str):
    """A JSON object whose keys are ``kinds``' and whose values pass each key's check."""
    def check(v) -> str | None:
        if v is None:
            return None
        if not isinstance(v, dict):
            return f"must be an object of {what}"
        for key, value in v.items():
            if key not in kinds:
                return f"holds {str(key)[:64]!r}, which is not one of the {what} an artifact may set"
            why = kinds[key](value)
            if why:
                return f"{key} {why}"
        return None
    return check


def _custom_ops(v) -> str | None:
    if isinstance(v, list) and len(v) <= MAX_LIST and all(isinstance(x, str) and _CUSTOM_OP.match(x) for x in v):
        return None
    return "must be a list of op names (+name, -name, all, none)"


def _splitting_ops(v) -> str | None:
    if v is None or (isinstance(v, list) and len(v) <= MAX_LIST
                     and all(isinstance(x, str) and _OP_NAME.match(x) for x in v)):
        return None
    return "must be a list of op names (namespace::op)"


def _compile_sizes(v) -> str | None:
    if v is None or (isinstance(v, list) and len(v) <= MAX_LIST
                     and all(_is_int(x) or x == "cudagraph_capture_sizes" for x in v)):
        return None
    return "must be a list of integers"


def _pass_config(v) -> str | None:
    """Switches and sizes of vLLM's own passes: booleans and numbers only (the passes a
    config can add by name, ``inductor_passes``, are refused with the config key)."""
    if not isinstance(v, dict):
        return "must be an object of pass switches"
    for key, value in v.items():
        if not (isinstance(key, str) and _TOKEN.match(key)) or not (isinstance(value, bool) or _is_number(value)):
            return f"{str(key)[:64]!r} must be a switch name with a boolean or a number"
    return None


# CompilationConfig's fields that shape the compiled graphs, by kind.  Left out on purpose: the
# dirs it reads and writes (cache_dir, local_cache_dir, debug_dump_path), the passes and
# Inductor options given by name (inductor_passes, inductor_compile_config: a pass or a
# callable by its import path).
COMPILATION_KEYS = {
    "level": _int, "mode": lambda v: None if _is_int(v) else _one_of(_COMPILE_MODES)(v),
    "backend": _one_of(_COMPILE_BACKENDS), "custom_ops": _custom_ops, "splitting_ops": _splitting_ops,
    "use_inductor": _bool, "compile_sizes": _compile_sizes, "compile_mm_encoder": _bool,
    "use_inductor_graph_partition": _bool, "cudagraph_mode": _one_of(_CUDAGRAPH_MODES),
    "use_cudagraph": _bool, "cudagraph_num_of_warmups": _int, "cudagraph_capture_sizes": _ints,
    "cudagraph_copy_inputs": _bool, "full_cuda_graph": _bool, "cudagraph_specialize_lora": _bool,
    "max_cudagraph_capture_size": _int, "pass_config": _pass_config,
}
_compilation_dict = _dict_of(COMPILATION_KEYS, "compilation settings")


def _compilation_config(v) -> str | None:  # vLLM also takes the bare level (-O3 = 3)
    return None if v is None or _is_int(v) else _compilation_dict(v)


SPECULATIVE_KEYS = {"method": _one_of(_SPEC_METHODS), "num_speculative_tokens": _int,
                    "prompt_lookup_min": _int, "prompt_lookup_max": _int}
_speculative_dict = _dict_of(SPECULATIVE_KEYS, "speculative settings (no draft model)")


def _speculative_config(v) -> str | None:
    why = _speculative_dict(v)
    if why is None and v is not None and "method" not in v:
        why = "must name its method (one that needs no draft model)"
    return why


# The one allowlist: engine argument -> the check of its value (None: it may carry it).
SERVE_ARG_KINDS = {
    "tensor_parallel_size": _int, "pipeline_parallel_size": _int, "data_parallel_size": _int,
    "dtype": _one_of(_DTYPES), "max_model_len": _size, "max_num_seqs": _int,
    "max_num_batched_tokens": _size, "block_size": _int, "enable_prefix_caching": _bool,
    "enable_chunked_prefill": _bool, "mamba_ssm_cache_dtype": _one_of(_STATE_DTYPES),
    "mamba_cache_dtype": _one_of(_STATE_DTYPES), "mamba_block_size": _int,
    "kv_cache_dtype": _one_of(_KV_DTYPES), "gpu_memory_utilization": _number, "quantization": _token,
    "seed": _int, "cuda_graph_sizes": _ints, "max_seq_len_to_capture": _int,
    "max_cudagraph_capture_size": _int, "async_scheduling": _bool, "disable_cascade_attn": _bool,
    "enable_expert_parallel": _bool, "kv_cache_memory_bytes": _size, "num_gpu_blocks_override": _int,
    "max_num_partial_prefills": _int, "long_prefill_token_threshold": _int,
    "disable_custom_all_reduce": _bool, "calculate_kv_scales": _bool, "enforce_eager": _bool,
    "compilation_config": _compilation_config, "speculative_config": _speculative_config,
}
# What the flags a logged server hands a fold round may hold: the same list (one home).
FOLD_FLAGS = frozenset(SERVE_ARG_KINDS)


def _shown_flag(key) -> str:
    """``--name`` for a message: short, one line, ASCII (a key from an artifact may hold any
    character: ``ascii`` escapes controls and line breaks)."""
    return "--" + ascii((key if isinstance(key, str) else repr(key)).replace("_", "-")[:64])[1:-1]


def serve_arg_problem(key, value) -> str | None:
    """Why serve arg ``key`` with ``value`` may not go from an artifact or a log into a command
    (None: it may)."""
    check = SERVE_ARG_KINDS.get(key) if isinstance(key, str) else None
    if check is None:
        return (f"{_shown_flag(key)} is not one an artifact or a log may carry into a command "
                "(only args that shape what is compiled and served: never code, places, services "
                "or other models)")
    why = check(value)
    return None if why is None else f"{_shown_flag(key)} has a value an artifact may not carry: {why}"


def carried_serve_args(serve_args: Any, document: str, field_name: str) -> dict[str, Any]:
    """``serve_args`` read from an artifact (``document``'s ``field_name``), to be made into a
    command: every arg on ``SERVE_ARG_KINDS`` with a value of its kind, else UnsafeArtifact
    (exit 6) naming the first that is not.  ``BAKE_ONLY`` args with the driver's own values
    pass (every command leaves them out)."""
    from cachebake.errors import InvalidDocument, UnsafeArtifact

    if serve_args is None:
        return {}
    if not isinstance(serve_args, dict):
        raise InvalidDocument(document, field_name, "must be an object of vLLM engine arguments")
    for key, value in serve_args.items():
        if key in BAKE_ONLY and value == BAKE_ONLY[key]:
            continue
        why = serve_arg_problem(key, value)
        if why is not None:
            raise UnsafeArtifact(f"{document}: {field_name}: {why}")
    return dict(serve_args)


def fold_flag_problem(serve_args: Any, source: str = "a log") -> str | None:
    """Why serve args from ``source`` (a miss log, or the base artifact's own warmup) may not
    drive a fold round (None: they may): a mapping of ``SERVE_ARG_KINDS`` names, each with a
    value of its kind."""
    if not isinstance(serve_args, dict):
        return "no serve flags were logged"
    for key, value in serve_args.items():
        why = serve_arg_problem(key, value)
        if why is not None:
            return "flag " + why.replace("an artifact or a log may carry into a command",
                                         f"a fold round takes from {source}").replace(
                "an artifact may not carry", "a fold round does not take")
    return None

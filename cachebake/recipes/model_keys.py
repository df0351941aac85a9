"""One reader for the config keys of Mamba2-family models, as vLLM's model code reads them.

Each family spells the same hyperparameter differently, and vLLM's model classes do not all
derive the mixer's widths the same way (Granite-4.0-H and Zamba2 size the mixer from
``mamba_expand * hidden_size``; Zamba2 derives the head dim from it and hard-codes ``silu``;
Falcon-H1 takes ``mamba_d_ssm``).  The table below follows the ``MambaMixer2(...)`` calls of
vLLM 0.33's ``nemotron_h.py``, ``mamba2.py``, ``granitemoehybrid.py``, ``falcon_h1.py`` and
``zamba2.py``; defaults are the transformers config classes' for keys a config.json may omit.
tests/test_recipes_vllm.py checks every recipe against the mixers vLLM itself builds.

``mamba_hparams`` is for recipes (what a bake is specialized on) and for the kernels driver
(which checks that an engine plan belongs to the model it bakes); ``state_dtypes`` applies
vLLM's "auto" rules for the Mamba state dtypes to serve args.  Pure data: no vllm, no torch.
"""

from __future__ import annotations

from typing import Any

from cachebake.errors import BadInput

DEFAULT_CHUNK_SIZE = 2048  # ModelConfig.get_mamba_chunk_size when a config sets none


def _get(cfg: dict[str, Any], key: str, default: Any = None) -> Any:
    value = cfg.get(key)
    return default if value is None else value


def _need(cfg: dict[str, Any], model_type: str, *keys: str) -> list[Any]:
    missing = [k for k in keys if cfg.get(k) is None]
    if missing:
        raise BadInput(f"{model_type} config lacks {', '.join(missing)}")
    return [cfg[k] for k in keys]


def _nemotron_h(cfg):
    heads, head_dim, groups, d_state, conv = _need(
        cfg, "nemotron_h", "mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size",
        "conv_kernel")
    pattern = str(cfg.get("hybrid_override_pattern") or "")
    return dict(num_heads=heads, head_dim=head_dim, intermediate=heads * head_dim, n_groups=groups,
                d_state=d_state, conv_kernel=conv, activation=_get(cfg, "mamba_hidden_act", "silu"),
                use_conv_bias=_get(cfg, "use_conv_bias", True),
                rms_norm_eps=_get(cfg, "layer_norm_epsilon", 1e-5), use_rms_norm=True,
                mamba_layers=pattern.count("M"), attention_layers=pattern.count("*"))


def _mamba2(cfg):
    heads, head_dim, groups, d_state, conv, hidden = _need(
        cfg, "mamba2", "num_heads", "head_dim", "n_groups", "state_size", "conv_kernel", "hidden_size")
    layers = _get(cfg, "num_hidden_layers", 0)
    return dict(num_heads=heads, head_dim=head_dim,
                intermediate=_get(cfg, "intermediate_size", _get(cfg, "expand", 2) * hidden),
                n_groups=groups, d_state=d_state, conv_kernel=conv,
                activation=_get(cfg, "hidden_act", "silu"), use_conv_bias=_get(cfg, "use_conv_bias", True),
                rms_norm_eps=_get(cfg, "layer_norm_epsilon", 1e-5), use_rms_norm=True,
                mamba_layers=layers, attention_layers=0)


def _granite(cfg):
    heads, head_dim, d_state, hidden = _need(
        cfg, "granitemoehybrid", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "hidden_size")
    types = list(cfg.get("layer_types") or [])
    return dict(num_heads=heads, head_dim=head_dim, intermediate=_get(cfg, "mamba_expand", 2) * hidden,
                n_groups=_get(cfg, "mamba_n_groups", 1), d_state=d_state,
                conv_kernel=_get(cfg, "mamba_d_conv", 4), activation=_get(cfg, "hidden_act", "silu"),
                use_conv_bias=_get(cfg, "mamba_conv_bias", True),
                rms_norm_eps=_get(cfg, "rms_norm_eps", 1e-6), use_rms_norm=True,
                mamba_layers=types.count("mamba"), attention_layers=types.count("attention"))


def _falcon_h1(cfg):
    heads, head_dim, d_state, hidden = _need(
        cfg, "falcon_h1", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "hidden_size")
    layers = _get(cfg, "num_hidden_layers", 0)  # every layer: attention and Mamba in parallel
    return dict(num_heads=heads, head_dim=head_dim,
                intermediate=_get(cfg, "mamba_d_ssm", _get(cfg, "mamba_expand", 2) * hidden),
                n_groups=_get(cfg, "mamba_n_groups", 1), d_state=d_state,
                conv_kernel=_get(cfg, "mamba_d_conv", 4), activation=_get(cfg, "hidden_act", "silu"),
                use_conv_bias=_get(cfg, "mamba_conv_bias", True),
                rms_norm_eps=_get(cfg, "rms_norm_eps", 1e-5),
                use_rms_norm=_get(cfg, "mamba_rms_norm", False),
                mamba_layers=layers, attention_layers=layers)


def _zamba2(cfg):
    heads, d_state, hidden = _need(cfg, "zamba2", "n_mamba_heads", "mamba_d_state", "hidden_size")
    intermediate = _get(cfg, "mamba_expand", 2) * hidden
    types = list(cfg.get("layers_block_type") or [])
    return dict(num_heads=heads, head_dim=intermediate // heads, intermediate=intermediate,
                n_groups=_get(cfg, "mamba_ngroups", 1), d_state=d_state,
                conv_kernel=_get(cfg, "mamba_d_conv", 4),
                activation="silu",  # vLLM's Zamba2MambaDecoderLayer passes "silu", whatever hidden_act says
                use_conv_bias=_get(cfg, "use_conv_bias", True),
                rms_norm_eps=_get(cfg, "rms_norm_eps", 1e-5), use_rms_norm=True,
                mamba_layers=len(types) or _get(cfg, "num_hidden_layers", 0),
                attention_layers=types.count("hybrid"))


READERS = {
    "nemotron_h": _nemotron_h,
    "mamba2": _mamba2,
    "granitemoehybrid": _granite,
    "falcon_h1": _falcon_h1,
    "zamba2": _zamba2,
}


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's config (multimodal wrappers keep it under ``text_config``)."""
    inner = cfg.get("text_config")
    if isinstance(inner, dict) and cfg.get("model_type") not in READERS:
        return inner
    return cfg


def mamba_hparams(cfg: dict[str, Any]) -> dict[str, Any]:
    """The whole model's Mamba2 mixer hyperparameters (before any TP split), the chunk size
    and the model dtype, read as vLLM reads them."""
    cfg = text_config(cfg)
    model_type = cfg.get("model_type")
    if model_type not in READERS:
        raise BadInput(f"model_type {model_type!r} is not a Mamba2 family cachebake reads "
                       f"(known: {', '.join(sorted(READERS))})")
    out = READERS[model_type](cfg)
    chunk = cfg.get("mamba_chunk_size") or cfg.get("chunk_size") or DEFAULT_CHUNK_SIZE
    out.update(model_type=model_type, chunk_size=int(chunk),
               dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch."))
    return out


def model_dtype(cfg: dict[str, Any], serve_args: dict[str, Any] | None = None) -> str:
    """The activation dtype: the serve args' ``dtype`` unless "auto", else the config's (vLLM
    serves a float32 config as bfloat16 only when asked; fp32 stays fp32)."""
    want = str((serve_args or {}).get("dtype") or "auto").removeprefix("torch.")
    if want not in ("auto", ""):
        return {"half": "float16", "float": "float32", "bf16": "bfloat16"}.get(want, want)
    return mamba_hparams(cfg)["dtype"]


def state_dtypes(cfg: dict[str, Any], serve_args: dict[str, Any] | None = None) -> tuple[str, str]:
    """(conv state dtype, SSM state dtype) as vLLM resolves them.

    ``mamba_cache_dtype`` "auto" is the model dtype (``get_kv_cache_torch_dtype``);
    ``mamba_ssm_cache_dtype`` "auto" follows the conv state -- except NemotronH, whose config
    hook makes "auto" the config's ``mamba_ssm_cache_dtype`` or float32
    (vllm/model_executor/models/config.py, MambaStateDtypeCalculator)."""
    args = serve_args or {}
    conv = str(args.get("mamba_cache_dtype") or "auto")
    ssm = str(args.get("mamba_ssm_cache_dtype") or "auto")
    inner = text_config(cfg)
    if ssm == "auto" and inner.get("model_type") == "nemotron_h":
        ssm = str(inner.get("mamba_ssm_cache_dtype") or "float32")
    conv_dtype = model_dtype(cfg, args) if conv == "auto" else conv
    return conv_dtype, (conv_dtype if ssm == "auto" else ssm)

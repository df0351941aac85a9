"""Model recipes as data: the real ``config.json`` hyperparameters of public models, no weights.

Kernels are specialized on a model's shapes and dtypes and on the serving arguments, never on
its weights (shared/FACTS.md).  So a bake needs only the model's ``config.json`` (vLLM builds the
model with ``load_format="dummy"``) plus the exact serve args.  Each ``<name>.json`` beside this
file holds one model family: named variants, each with the published config's hyperparameters,
where they were taken from, which fields were checked, notes on anything that was not, and the
default serve args.

``load_recipe`` also accepts a local model directory or a ``config.json`` path, so a private
model bakes the same way (its serve args then come from the caller).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachebake import jsonio
from cachebake.errors import BadInput, InvalidDocument
from cachebake.recipes.model_keys import mamba_hparams

RECIPE_DIR = Path(__file__).resolve().parent
# A model's config.json as cachebake reads it (a local model dir, the path an artifact records):
# the largest published ones are tens of KB; this leaves room and still bounds a hostile one.
CAP_MODEL_CONFIG = 16 << 20


@dataclass
class Recipe:
    """One bakeable model: a family recipe's variant, or a local config."""

    name: str  # recipe name ("nemotron-h"), or the local path
    variant: str | None  # the chosen variant ("8b"); None for a local config
    variants: list[str]  # every variant of the family (empty for a local config)
    description: str
    model_id: str | None  # the public model this describes ("nvidia/Nemotron-H-8B-Base-8K")
    source_url: str | None  # where the config.json is published
    config_source: str  # where the hyperparameters here were actually taken from
    hf_config: dict[str, Any]
    serve_args: dict[str, Any] = field(default_factory=dict)
    verified: list[str] = field(default_factory=list)  # fields checked against a source
    notes: list[str] = field(default_factory=list)  # anything unverified, said plainly
    local_path: str | None = None  # set when the recipe is a local model dir / config.json

    @property
    def ref(self) -> str:
        """How to name this recipe again: ``name:variant`` or the local path."""
        if self.local_path is not None:
            return self.local_path
        return f"{self.name}:{self.variant}" if self.variant else self.name

    @property
    def architecture(self) -> str:
        archs = self.hf_config.get("architectures") or []
        return archs[0] if archs else str(self.hf_config.get("model_type", "?"))

    def mamba_shapes(self) -> dict[str, Any]:
        """The Mamba2 shapes that decide which kernel specializations a bake produces."""
        return mamba_shapes(self.hf_config)

    def identity(self) -> dict[str, Any]:
        """What the manifest records about the model (the bake section's ``model``)."""
        try:
            shapes: dict[str, Any] | None = self.mamba_shapes()
        except BadInput:  # not a Mamba2 family: the vllm driver still bakes it
            shapes = None
        return {
            "recipe": self.ref,
            "model_id": self.model_id,
            "source_url": self.source_url,
            "architecture": self.architecture,
            "mamba": shapes,
        }


def mamba_shapes(cfg: dict[str, Any]) -> dict[str, Any]:
    """The Mamba2 shapes a bake is specialized on, in the short names ``cachebake recipes``
    shows; read through the one config reader (``model_keys``) the kernels driver uses too."""
    hp = mamba_hparams(cfg)
    return {"heads": hp["num_heads"], "head_dim": hp["head_dim"], "groups": hp["n_groups"],
            "d_state": hp["d_state"], "conv": hp["conv_kernel"], "chunk": hp["chunk_size"],
            "mamba_layers": hp["mamba_layers"]}


def _load_family(path: Path) -> dict[str, Any]:
    return jsonio.load_document(path, f"recipe {path}", CAP_MODEL_CONFIG, missing=BadInput)


def _families() -> dict[str, Path]:
    """recipe name (and alias) -> its JSON file."""
    out: dict[str, Path] = {}
    for p in sorted(RECIPE_DIR.glob("*.json")):
        data = _load_family(p)
        out[data["name"]] = p
        for alias in data.get("aliases", []):
            out[alias] = p
    return out


def list_recipes() -> list[Recipe]:
    """Every variant of every bundled recipe, default variant first within a family."""
    out: list[Recipe] = []
    seen: set[Path] = set()
    for path in _families().values():
        if path in seen:
            continue
        seen.add(path)
        data = _load_family(path)
        names = list(data["variants"])
        default = data.get("default_variant", names[0])
        for v in [default] + [n for n in names if n != default]:
            out.append(_from_family(data, v))
    return out


def _from_family(data: dict[str, Any], variant: str) -> Recipe:
    v = data["variants"][variant]
    return Recipe(
        name=data["name"],
        variant=variant,
        variants=list(data["variants"]),
        description=v.get("description") or data.get("description", ""),
        model_id=v.get("model_id"),
        source_url=v.get("source_url"),
        config_source=v.get("config_source", ""),
        hf_config=dict(v["hf_config"]),
        serve_args=dict(v.get("serve_args", {})),
        verified=list(v.get("verified", [])),
        notes=list(v.get("notes", [])),
    )


def _from_local(path: Path) -> Recipe:
    cfg_path = path / "config.json" if path.is_dir() else path
    if not cfg_path.is_file():
        raise BadInput(f"{path}: no config.json there")
    # Strict and bounded (jsonio): the path may come from an artifact (serve-args reads the
    # model dir a bake recorded), and a config nested 200,000 deep must not crash the reader.
    # A Hugging Face snapshot's config.json links into blobs/: read what it names, as vLLM does.
    try:
        cfg = jsonio.load_document(os.path.realpath(cfg_path), "config.json", CAP_MODEL_CONFIG,
                                   missing=BadInput)
    except InvalidDocument as e:
        raise BadInput(f"{cfg_path}: not a readable JSON config: {e.reason}") from None
    if not isinstance(cfg, dict) or not (cfg.get("architectures") or cfg.get("model_type")):
        raise BadInput(f"{cfg_path}: not a model config (no architectures / model_type)")
    ref = str(path.resolve())
    return Recipe(
        name=ref,
        variant=None,
        variants=[],
        description=f"local config {cfg_path}",
        model_id=cfg.get("_name_or_path") or None,
        source_url=None,
        config_source=str(cfg_path.resolve()),
        hf_config=cfg,
        serve_args={},
        local_path=ref,
    )


def load_recipe(name_or_path: str) -> Recipe:
    """``nemotron-h``, ``nemotron-h:47b``, a model directory, or a ``config.json`` path."""
    families = _families()
    name, _, variant = name_or_path.partition(":")
    if name in families:
        data = _load_family(families[name])
        variant = variant or data.get("default_variant") or next(iter(data["variants"]))
        if variant not in data["variants"]:
            raise BadInput(f"recipe {data['name']} has no variant {variant!r} "
                           f"(known: {', '.join(data['variants'])})")
        return _from_family(data, variant)
    path = Path(name_or_path)
    if path.exists():
        return _from_local(path)
    raise BadInput(f"unknown model {name_or_path!r}: not a recipe "
                   f"({', '.join(sorted(families))}) and no such path")


"""Recipes: loading by name / variant / path, and that the bundled data is self-consistent."""

from __future__ import annotations

import json

import pytest

from cachebake.errors import BadInput, ExitCode
from cachebake.recipes import RECIPE_DIR, list_recipes, load_recipe, mamba_shapes

EXPECTED = {
    "nemotron-h": {"8b", "47b", "56b", "nano-9b-v2", "nano-12b-v2"},
    "mamba2": {"codestral-7b"},
    "granite-4.0-h": {"tiny", "small"},
    "falcon-h1": {"7b", "3b"},
    "zamba2": {"7b"},
}


def test_every_family_and_variant_is_bundled():
    got: dict[str, set[str]] = {}
    for r in list_recipes():
        got.setdefault(r.name, set()).add(r.variant)
    assert got == EXPECTED


def test_default_is_nemotron_h_8b():
    r = load_recipe("nemotron-h")
    assert r.ref == "nemotron-h:8b"
    assert r.model_id == "nvidia/Nemotron-H-8B-Base-8K"
    assert r.architecture == "NemotronHForCausalLM"
    # The shapes shared/FACTS.md measured on the H200.
    assert r.mamba_shapes() == {"heads": 128, "head_dim": 64, "groups": 8, "d_state": 128,
                                "conv": 4, "chunk": 128, "mamba_layers": 24}


def test_variant_and_alias():
    r = load_recipe("nemotron-h:47b")
    assert r.variant == "47b" and r.hf_config["num_hidden_layers"] == 98
    assert r.mamba_shapes()["heads"] == 256 and r.mamba_shapes()["d_state"] == 256
    assert load_recipe("codestral-mamba").ref == "mamba2:codestral-7b"


def test_unknown_name_and_variant_are_bad_input():
    with pytest.raises(BadInput, match="unknown model"):
        load_recipe("no-such-model")
    with pytest.raises(BadInput, match="no variant 'huge'") as e:
        load_recipe("nemotron-h:huge")
    assert e.value.code == ExitCode.BAD_INPUT


@pytest.mark.parametrize("recipe", list_recipes(), ids=lambda r: r.ref)
def test_recipe_data_is_consistent(recipe):
    cfg = recipe.hf_config
    assert cfg["architectures"] == [recipe.architecture] and cfg["model_type"]
    assert recipe.source_url.startswith("https://huggingface.co/") and recipe.config_source
    assert recipe.model_id in recipe.source_url
    # Anything not checked against a source must say so.
    assert recipe.verified or recipe.notes
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is not None:
        assert len(pattern) == cfg["num_hidden_layers"] and set(pattern) <= set("M*-")
    for key in ("layer_types", "layers_block_type"):
        if key in cfg:
            assert len(cfg[key]) == cfg["num_hidden_layers"]
    shapes = recipe.mamba_shapes()
    assert {"heads", "head_dim", "groups", "d_state", "conv", "chunk"} <= set(shapes) or \
        cfg["model_type"] == "zamba2"
    assert shapes["mamba_layers"] > 0
    sa = recipe.serve_args
    assert not sa.get("enforce_eager")
    # Mamba2 has no positional limit; the others must not be served past theirs.
    assert sa["max_model_len"] <= cfg.get("max_position_embeddings", sa["max_model_len"])


def test_zamba2_hybrid_layers_match_block_types():
    cfg = load_recipe("zamba2").hf_config
    assert cfg["hybrid_layer_ids"] == [i for i, t in enumerate(cfg["layers_block_type"]) if t == "hybrid"]
    assert cfg["n_mamba_heads"] * cfg["mamba_headdim"] == cfg["mamba_expand"] * cfg["hidden_size"]


def test_unverified_variants_say_so():
    small = load_recipe("granite-4.0-h:small")
    assert any("UNVERIFIED" in n for n in small.notes) and "mamba_n_heads" not in small.verified


def test_local_directory_and_config_path(tmp_path):
    cfg = dict(load_recipe("mamba2").hf_config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    by_dir = load_recipe(str(tmp_path))
    by_file = load_recipe(str(tmp_path / "config.json"))
    for r in (by_dir, by_file):
        assert r.local_path == str(tmp_path.resolve()) or r.local_path == str((tmp_path / "config.json").resolve())
        assert r.variant is None and r.serve_args == {}
        assert r.hf_config == cfg and r.architecture == "Mamba2ForCausalLM"
        assert r.ref == r.local_path


def test_local_path_that_is_no_model_config(tmp_path):
    with pytest.raises(BadInput, match="no config.json"):
        load_recipe(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(BadInput, match="not a model config"):
        load_recipe(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BadInput, match="not a readable JSON"):
        load_recipe(str(tmp_path))


def test_mamba_shapes_reads_each_family_spelling():
    assert mamba_shapes({"model_type": "falcon_h1", "head_dim": 128, "mamba_d_head": 64,
                         "mamba_n_heads": 48, "mamba_d_state": 16, "hidden_size": 64})["head_dim"] == 64
    granite = {"model_type": "granitemoehybrid", "mamba_n_heads": 4, "mamba_d_head": 8,
               "mamba_d_state": 16, "hidden_size": 16, "layer_types": ["mamba", "attention", "mamba"]}
    assert mamba_shapes(granite)["mamba_layers"] == 2


def test_recipe_files_are_plain_json():
    for p in RECIPE_DIR.glob("*.json"):
        data = json.loads(p.read_text())
        assert data["default_variant"] in data["variants"]

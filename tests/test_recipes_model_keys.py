"""The one config reader (recipes/model_keys): each family's spelling, vLLM's derivations, the
state dtype rules.  tests/test_vllm_kernels_plan_vllm.py checks the same reader against the mixers vLLM
builds; these run without vllm."""

from __future__ import annotations

import pytest

from cachebake.errors import BadInput
from cachebake.recipes import list_recipes, load_recipe
from cachebake.recipes.model_keys import mamba_hparams, state_dtypes


def test_nemotron_h_8b_reads_the_engine_widths():
    hp = mamba_hparams(load_recipe("nemotron-h:8b").hf_config)
    assert (hp["num_heads"], hp["head_dim"], hp["n_groups"], hp["d_state"]) == (128, 64, 8, 128)
    assert (hp["conv_kernel"], hp["chunk_size"], hp["activation"]) == (4, 128, "silu")
    assert hp["intermediate"] == 8192
    assert (hp["mamba_layers"], hp["attention_layers"]) == (24, 4)


def test_zamba2_is_read_the_way_vllm_builds_it():
    cfg = load_recipe("zamba2").hf_config
    hp = mamba_hparams(cfg)
    assert cfg["hidden_act"] == "gelu" and hp["activation"] == "silu"  # hard-coded in vLLM
    assert hp["intermediate"] == cfg["mamba_expand"] * cfg["hidden_size"] == 7168
    assert hp["head_dim"] == hp["intermediate"] // cfg["n_mamba_heads"] == 64
    assert (hp["n_groups"], hp["d_state"], hp["chunk_size"]) == (2, 64, 256)
    assert hp["mamba_layers"] == 81 and hp["attention_layers"] == 13


def test_granite_sizes_the_mixer_from_expand_times_hidden():
    cfg = load_recipe("granite-4.0-h:tiny").hf_config
    hp = mamba_hparams(cfg)
    assert hp["intermediate"] == cfg["mamba_expand"] * cfg["hidden_size"]
    assert hp["chunk_size"] == cfg["mamba_chunk_size"]  # mamba_chunk_size wins over chunk_size


def test_falcon_h1_takes_d_ssm():
    cfg = dict(load_recipe("falcon-h1:7b").hf_config, mamba_d_ssm=1234)
    assert mamba_hparams(cfg)["intermediate"] == 1234


@pytest.mark.parametrize("recipe", list_recipes(), ids=lambda r: r.ref)
def test_every_recipe_reads(recipe):
    hp = mamba_hparams(recipe.hf_config)
    assert hp["num_heads"] * hp["head_dim"] == hp["intermediate"]
    assert hp["num_heads"] % hp["n_groups"] == 0 and hp["mamba_layers"] > 0


def test_unknown_family_and_missing_keys_are_bad_input():
    with pytest.raises(BadInput, match="not a Mamba2 family"):
        mamba_hparams({"model_type": "llama"})
    with pytest.raises(BadInput, match="lacks mamba_num_heads"):
        mamba_hparams({"model_type": "nemotron_h"})
    wrapped = {"model_type": "some_vl", "text_config": load_recipe("mamba2").hf_config}
    assert mamba_hparams(wrapped)["num_heads"] == 128


def test_state_dtypes_follow_vllms_auto_rules():
    nemo, granite = load_recipe("nemotron-h").hf_config, load_recipe("granite-4.0-h").hf_config
    # auto: conv state in the model dtype; SSM state follows it, except NemotronH (float32)
    assert state_dtypes(granite, {}) == ("bfloat16", "bfloat16")
    assert state_dtypes(nemo, {}) == ("bfloat16", "float32")
    assert state_dtypes(nemo, {"mamba_ssm_cache_dtype": "bfloat16"}) == ("bfloat16", "bfloat16")
    assert state_dtypes(granite, {"mamba_ssm_cache_dtype": "float32"}) == ("bfloat16", "float32")
    assert state_dtypes(granite, {"dtype": "float16"}) == ("float16", "float16")
    assert state_dtypes(granite, {"mamba_cache_dtype": "float32"}) == ("float32", "float32")
    assert state_dtypes(dict(nemo, mamba_ssm_cache_dtype="float16"), {}) == ("bfloat16", "float16")

"""Every JSON a user or an artifact hands cachebake is read by jsonio's one bounded, strict
reader: a model's config.json nested 200,000 deep (its path recorded in an artifact, or given
with --model), serve args recorded as deeply nested JSON text, a config.json that is a FIFO or
larger than the cap: one line, exit 5 (a malformed document) or 3, never a RecursionError or a
read without end."""

from __future__ import annotations

import json
import os

import pytest

from installkit import cli
from cachebake.errors import ExitCode

DEEP = "[" * 200_000 + "]" * 200_000
DEEP_OBJECT = '{"a":' * 200_000 + "1" + "}" * 200_000


def _one_line(r, *codes) -> str:
    assert r.returncode in codes, (r.returncode, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith("cachebake: error: ") and "internal error" not in line, line
    assert "RecursionError" not in line, line
    return line


def _manifest(tmp_path, bake: dict):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"bake": bake}))
    return path


def _model_dir(tmp_path, config: str):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(config)
    return model


@pytest.mark.parametrize("config", [DEEP, DEEP_OBJECT])
def test_serve_args_with_a_recorded_model_whose_config_nests_200000_deep(tmp_path, config):
    """serve-args takes the model path from the artifact and reads the config.json there."""
    model = _model_dir(tmp_path, config)
    manifest = _manifest(tmp_path, {"driver": "vllm", "model": str(model), "tp": 1})
    line = _one_line(cli("serve-args", manifest), ExitCode.CORRUPT, ExitCode.BAD_INPUT)
    assert "config.json" in line and "nests deeper" in line


def test_plan_with_a_model_dir_whose_config_nests_200000_deep(tmp_path):
    model = _model_dir(tmp_path, DEEP_OBJECT)
    line = _one_line(cli("plan", "--model", model), ExitCode.CORRUPT, ExitCode.BAD_INPUT)
    assert "config.json" in line


@pytest.mark.parametrize("config", ['{"model_type": "x", "model_type": "y"}', '{"model_type": NaN}'])
def test_a_model_config_with_duplicate_keys_or_nan_is_refused(tmp_path, config):
    model = _model_dir(tmp_path, config)
    manifest = _manifest(tmp_path, {"driver": "vllm", "model": str(model), "tp": 1})
    line = _one_line(cli("serve-args", manifest), ExitCode.CORRUPT, ExitCode.BAD_INPUT)
    assert "config.json" in line


def test_a_model_config_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    os.mkfifo(model / "config.json")
    manifest = _manifest(tmp_path, {"driver": "vllm", "model": str(model), "tp": 1})
    line = _one_line(cli("serve-args", manifest, timeout=60), ExitCode.CORRUPT, ExitCode.BAD_INPUT)
    assert "config.json" in line


def test_a_model_config_over_the_cap_is_refused(tmp_path):
    from cachebake.recipes import CAP_MODEL_CONFIG

    model = _model_dir(tmp_path, '{"model_type": "' + "x" * CAP_MODEL_CONFIG + '"}')
    manifest = _manifest(tmp_path, {"driver": "vllm", "model": str(model), "tp": 1})
    line = _one_line(cli("serve-args", manifest), ExitCode.CORRUPT, ExitCode.BAD_INPUT)
    assert "bytes" in line


@pytest.mark.parametrize("serve_args", ["{\"max_num_seqs\": " + DEEP + "}",
                                        "--max-num-seqs " + "[" * 100_000])
def test_recorded_serve_args_nested_200000_deep(tmp_path, serve_args):
    """A bake's serve args recorded as text (JSON or flags) that hold deep JSON: one line."""
    manifest = _manifest(tmp_path, {"driver": "vllm", "model": "nemotron-h", "tp": 1,
                                    "serve_args": serve_args})
    r = cli("serve-args", manifest)
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr, r.stderr
    assert "internal error" not in r.stderr, r.stderr

"""params: option values checked while parsing (exit 2 for a malformed value, 3 for a
well-formed one naming something missing)."""

import click
import pytest
from click.testing import CliRunner

from cachebake.artifact.snapshot import CacheRoot
from cachebake.cli.params import (ABSOLUTE_PATH, GPU_TARGET, NON_NEGATIVE_SECONDS, POSITIVE_INT,
                                  ROLE_DIR, SERVE_ARGS)
from cachebake.errors import BadInput


def convert(param_type, value):
    return param_type.convert(value, None, None)


def test_role_dir(tmp_path):
    assert convert(ROLE_DIR, str(tmp_path)) == CacheRoot("triton", tmp_path)
    assert convert(ROLE_DIR, f"vllm={tmp_path}") == CacheRoot("vllm", tmp_path)
    for bad, match in [(f"cuda={tmp_path}", "unknown cache role 'cuda'"), ("vllm=", "empty path")]:
        with pytest.raises(click.BadParameter, match=match):
            convert(ROLE_DIR, bad)
    with pytest.raises(BadInput, match="no such directory"):
        convert(ROLE_DIR, str(tmp_path / "nope"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadInput, match="not a directory"):
        convert(ROLE_DIR, str(tmp_path / "f"))


@pytest.mark.parametrize("text,key", [("sm_90", "cuda:90"), ("sm_90a", "cuda:90"), ("cuda:120", "cuda:120"),
                                      ("sm_103", "cuda:103"), ("gfx942", "hip:gfx942"),
                                      ("hip:gfx90a", "hip:gfx90a")])
def test_gpu_targets_that_exist(text, key):
    assert convert(GPU_TARGET, text) == key


@pytest.mark.parametrize("text", ["sm_999", "cuda:91", "gfx9420", "h200", "cuda:x", ""])
def test_gpu_targets_that_do_not(text):
    with pytest.raises(click.BadParameter):
        convert(GPU_TARGET, text)


def test_absolute_path():
    assert convert(ABSOLUTE_PATH, "/srv//cache/") == "/srv/cache"
    with pytest.raises(click.BadParameter, match="not an absolute path"):
        convert(ABSOLUTE_PATH, "srv/cache")
    # a line break would end the YAML, shell or terminal line the path is written into
    for bad in ("/srv/cache\n---", "/srv/\x1b[2J", "/srv\r", "/srv\u2028x", "/srv\x85"):
        with pytest.raises(click.BadParameter, match="control character"):
            convert(ABSOLUTE_PATH, bad)


def test_kubernetes_forms_and_image_names():
    from cachebake.cli.params import IMAGE_NAME, K8S_NAME, QUANTITY, SECRET_NAME

    for t, good, bad in [(K8S_NAME, ["vllm", "a-1"], ["Vllm", "-a", "a_b", "a" * 64, "a\n"]),
                         (SECRET_NAME, ["regcred", "a.b-c"], ["Reg", "a..b", "a\nb"]),
                         (QUANTITY, ["2Gi", "512Mi", "1.5G", "100"], ["2 Gi", "lots", "2Gi\n", "-1Gi"]),
                         (IMAGE_NAME, ["vllm:1", "vllm/vllm-openai:v0.33.0", "127.0.0.1:5000/a/b:t",
                                       "r.example/a@sha256:" + "a" * 64],
                          ["vllm 1", "vllm:1\n---", "$(id)", "A/B", "v:", "v\x1b"])]:
        for g in good:
            assert convert(t, g) == g
        for b in bad:
            with pytest.raises(click.BadParameter):
                convert(t, b)


def test_serve_args():
    assert convert(SERVE_ARGS, "--max-num-seqs 64 --enable-prefix-caching") == {
        "max_num_seqs": 64, "enable_prefix_caching": True}
    assert convert(SERVE_ARGS, '{"max_num_seqs": 8}') == {"max_num_seqs": 8}
    for bad in ['{"enforce_eager": true}', "--enforce-eager", "{not json", "model-path --x 1",
                '{"model": "x"}']:
        with pytest.raises(click.BadParameter):
            convert(SERVE_ARGS, bad)


def test_numbers_are_clicks_own_ranges():
    @click.command()
    @click.option("--n", type=POSITIVE_INT)
    @click.option("--t", type=NON_NEGATIVE_SECONDS)
    def cmd(n, t):
        click.echo(f"{n} {t}")

    runner = CliRunner()
    assert runner.invoke(cmd, ["--n", "3", "--t", "0"]).output == "3 0.0\n"
    for args in (["--n", "0"], ["--n", "-1"], ["--t", "-5"], ["--n", "x"]):
        assert runner.invoke(cmd, args).exit_code == 2

"""The server's environment: one function (install/environment.server_env) for install,
serve-args, k8s and the Dockerfile; every route an artifact has into it (the bake's serve_env,
the cache-invalidating variables, the compile identity) refuses what the rules refuse, and no
route sets a variable the layout owns (a role's dir, the overlay, HOME): issue 31's findings,
each by the route it took."""

import pytest

from cachebake.artifact.manifest import BakeRecord
from cachebake.cli.render import render_install
from cachebake.errors import InvalidDocument
from cachebake.install.environment import (IDENTITY, INVALIDATING, ROLE, SCRATCH, SERVE_ENV, BakeFacts,
                                           ServerLayout, server_env)
from cachebake.roles import ROLE_ENV

LAYOUT = ServerLayout.installed("/srv/cache", list(ROLE_ENV))


def _identity(path_factors: dict, **model) -> dict:
    return {"compile_identity": {"env_factors": dict(path_factors), "path_factors": dict(path_factors),
                                 **({"model": model} if model else {})}}


def _facts(**bake) -> BakeFacts:
    return BakeFacts(BakeRecord.from_json({"driver": "vllm", **bake}), roles=tuple(ROLE_ENV),
                     layer_root="/var/cache/cachebake")


def test_each_variable_says_where_it_comes_from():
    facts = _facts(serve_env={"VLLM_USE_V2_MODEL_RUNNER": "1", "VLLM_CACHE_ROOT": "/bake/vllm"},
                   env={"invalidating_env_vars": {"TRITON_DEFAULT_FP_FUSION": "0"}},
                   extra_key=1, **_identity({"VLLM_CONFIG_ROOT": "/root/.config/vllm"}))
    env = server_env(facts, ServerLayout.installed("/srv/cache", list(ROLE_ENV), scratch={"HOME": "/scratch"}))
    assert env.of(ROLE) == {**{v: f"/srv/cache/{r}" for r, v in ROLE_ENV.items()}, "TRITON_CACHE_AUTOTUNING": "1"}
    assert env.of(SERVE_ENV) == {"VLLM_USE_V2_MODEL_RUNNER": "1"}  # the recorded VLLM_CACHE_ROOT: ignored
    assert env.of(INVALIDATING) == {"TRITON_DEFAULT_FP_FUSION": "0"}
    assert env.of(IDENTITY) == {"VLLM_CONFIG_ROOT": "/root/.config/vllm"}
    assert env.of(SCRATCH) == {"HOME": "/scratch"}


# issue 31: what the attack corpus got through, by route
@pytest.mark.parametrize("name", ["VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "VLLM_MODEL_REDIRECT_PATH",
                                  "VLLM_RPC_BASE_PATH", "VLLM_PLUGINS", "VLLM_ALLOW_INSECURE_SERIALIZATION",
                                  "HOME", "VLLM_TEST_FORCE_LOAD_FORMAT"])
def test_the_compile_identity_sets_only_its_own_few_variables(name):
    facts = _facts(**_identity({name: "/evil"}) if name.startswith("VLLM_") else
                   {"compile_identity": {"model": {"hf_hub_cache": "/x"}, "env_factors": {name: "/evil"},
                                         "path_factors": {name: "/evil"}}})
    with pytest.raises(InvalidDocument, match=r"compile_identity") as e:
        server_env(facts, LAYOUT)
    assert e.value.code == 5 and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["VLLM_TEST_FORCE_LOAD_FORMAT", "VLLM_PLUGINS", "VLLM_CACHE_ROOT_X",
                                  "VLLM_ALLOW_INSECURE_SERIALIZATION", "LD_PRELOAD", "HOME"])
def test_the_bakes_serve_env_passes_only_what_the_vllm_driver_records(name):
    with pytest.raises(InvalidDocument, match=rf"bake.serve_env.{name}: is not a variable an artifact may set"):
        server_env(_facts(serve_env={name: "x"}), LAYOUT)


@pytest.mark.parametrize("name", ["TRITON_CACHE_DIR", "TRITON_CACHE_MANAGER", "TRITON_HOME",
                                  "TRITON_KERNEL_OVERRIDE", "LLVM_PASS_PLUGIN_PATH"])
def test_the_invalidating_route_refuses_a_layout_variable_or_a_knob(name):
    with pytest.raises(InvalidDocument, match=rf"invalidating_env_vars.{name}"):
        server_env(_facts(env={"invalidating_env_vars": {name: "x"}}), LAYOUT)


def test_no_root_recorded_exports_no_role_variable_of_the_artifact():
    from cachebake.serve.command import serve_command

    doc = {"bake": {"driver": "vllm", "model": {"path": "/models/m"}, "serve_args": {},
                    "serve_env": {"TRITON_CACHE_DIR": "/evil/triton", "VLLM_CACHE_ROOT": "/evil/vllm",
                                  "TORCHINDUCTOR_CACHE_DIR": "/evil/inductor"}}}
    cmd = serve_command(doc)
    assert not set(ROLE_ENV.values()) & set(cmd.env) and any("--root" in n for n in cmd.notes)
    assert serve_command(doc, root="/srv").env["VLLM_CACHE_ROOT"] == "/srv/vllm"


def test_an_identity_path_with_a_c1_control_is_refused():
    with pytest.raises(InvalidDocument, match="absolute path"):
        server_env(_facts(**_identity({"VLLM_CONFIG_ROOT": "/root/\x9b2J"})), LAYOUT)


def test_install_prints_no_control_character_of_an_artifact(capsys):
    from types import SimpleNamespace

    from rich.console import Console

    report = SimpleNamespace(status="installed", layer_digest="sha256:x", target="cuda:90", to="/d", files=1,
                             file_bytes=1, groups_relocated=0, relocated={}, seconds=0.1, synced=True,
                             env={"VLLM_CONFIG_ROOT": "/a\x9b31mb\x1b]0;t\x07"})
    render_install(report, Console(force_terminal=False, width=200))
    out = capsys.readouterr().out
    assert not any(0x80 <= ord(c) < 0xa0 or (ord(c) < 32 and c != "\n") for c in out), ascii(out)
    assert "VLLM_CONFIG_ROOT=" in out


def test_every_variable_the_vllm_driver_records_may_reach_the_server():
    """What the vllm driver records in a bake's serve_env is what the server's environment lets
    through: on the H200 (vLLM 0.34) the startup plan's switch was recorded by the driver and
    refused by serve-args, a bake no Pod could serve."""
    from cachebake.install.environment import SERVE_ENV_NAMES
    from cachebake.vllm.engine import SERVE_ENV_VARS
    from cachebake.vllm.versions import STARTUP_PLAN_ENV

    assert set(SERVE_ENV_VARS) <= set(SERVE_ENV_NAMES)
    assert STARTUP_PLAN_ENV in SERVE_ENV_NAMES

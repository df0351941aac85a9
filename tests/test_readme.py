"""README as a stranger meets it: short (the manual is in docs/), the flow drawn where GitHub
renders it, the commands of "Start here" run as typed in a fresh copy of the checkout on a
machine without a GPU and do what README says (one line, exit 7, within seconds), and its
"Tested with" line names the versions the benches recorded (bench/RESULTS.md), so neither
drifts from what is true.  The CPU quick start: tests/test_quickstart.py; docs/: test_docs.py."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from installkit import REPO

README = (REPO / "README.md").read_text()
START = README.split("\n## Start here\n", 1)[1].split("\n## ", 1)[0]


def _blocks(text: str) -> list[list[str]]:
    return [b.strip().splitlines() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_start_here_is_two_commands_the_install_and_bake_and_the_tests():
    stock, in_image, tests = _blocks(START)
    assert in_image == ["python3 -m pip install . && cachebake build --model nemotron-h"]
    assert stock[-1] == in_image[0]  # the venv lines come first where the Python is managed
    assert any("python3-venv" in ln for ln in stock) and any("-m venv" in ln for ln in stock)
    assert tests == ["bash .ci/run"]


@pytest.mark.slow
def test_start_here_as_typed_on_a_machine_without_a_gpu(tmp_path):
    """The stock-Debian block, in a fresh copy of the checkout, with a fresh venv: the install
    works (no PEP 668 refusal) and the bake stops with one line naming what is missing (exit 7;
how fast: tests/test_bake_build.py).
    Its apt-get line is left out: the suite does not install system packages (.ci/run did)."""
    if any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("a GPU machine: this is about one without a GPU")
    stock = _blocks(START)[0]
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, checkout / name)
    shutil.copytree(REPO / "cachebake", checkout / "cachebake", ignore=shutil.ignore_patterns("__pycache__"))
    script = "\n".join(ln for ln in stock if not ln.startswith("apt-get "))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TRITON_", "CACHEBAKE_", "VIRTUAL_ENV", "PYTHON"))}
    env["HOME"] = str(tmp_path)
    r = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 7, r.stdout[-2000:] + r.stderr[-2000:]
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("cachebake")]
    assert ours == [r.stderr.splitlines()[-1]] and "no bake driver can run here" in ours[0]
    assert (checkout / ".venv" / "bin" / "cachebake").exists()
    assert not (checkout / "cachebake-nemotron-h").exists()  # nothing written by the refused bake


def test_tested_with_names_what_the_benches_ran():
    line = " ".join(README.split("\nTested with: ", 1)[1].split("\n\n", 1)[0].split())
    engine = re.match(r"vLLM (\S+)'s engine on an NVIDIA (\S+) \((sm_\d+)\) with torch (\S+) and Triton (\S+) ",
                      line)
    assert engine, line
    vllm, gpu, sm, torch, triton = engine.groups()
    results = (REPO / "bench" / "RESULTS.md").read_text()
    # the engine runs' header: GPU, torch, Triton and vLLM as the bench recorded them
    assert any(f"NVIDIA {gpu}" in ln and f"torch {torch}" in ln and f"triton {triton}" in ln
               and f"vLLM {vllm}" in ln for ln in results.splitlines()), "no such engine run in bench/RESULTS.md"
    assert f"({sm};" in results
    ops = re.search(r"vLLM (\S+)'s Mamba2 ops on that", line)
    assert ops and f"vLLM {ops[1]}'s" in results
    # and the Triton the test suite runs with (CI's, named at the end of the line: the GPU run's
    # Triton follows its vLLM, 3.8 for 0.34, while the suite pins 3.6)
    ci = re.search(r"CI: [^;]*Triton (\d+(?:\.\d+)+)", line)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert ci and f'"triton=={ci[1]}"' in pyproject, line


def test_readme_is_at_most_12_kb_and_links_the_manual_in_docs():
    assert len(README.encode()) <= 12 * 1024, len(README.encode())
    for page in ("docs/README.md", "docs/commands.md", "docs/exit-codes.md", "docs/trust-model.md",
                 "docs/dockerfile.md", "docs/init-container.md", "docs/image-volume.md",
                 "docs/not-run.md", "docs/testing.md", "bench/README.md", "docs/trust.md",
                 "docs/kubernetes.md", "docs/server-environment.md", "docs/delivery-on-gpu.md",
                 "docs/fleet.md", "docs/vllm-versions.md", "docs/hardening.md"):
        assert (REPO / page).is_file() and f"]({page})" in README, page


def test_the_flow_is_one_mermaid_diagram_of_the_data_flow():
    (diagram,) = re.findall(r"```mermaid\n(.*?)```", README, re.S)
    assert diagram.startswith("flowchart LR")
    nodes = dict(re.findall(r"^\s*(\w+)\[\"<b>(\w+)</b>", diagram, re.M))
    assert list(nodes.values()) == ["build", "artifact", "delivery", "serve", "verify"]
    edges = re.findall(r"(\w+) -->", diagram) + re.findall(r"--> (\w+)", diagram)
    assert set(edges) == set(nodes)  # every stage is connected


def test_conftest_finds_the_umoci_ci_run_installs():
    """README's fast lane runs after .ci/run, without its exports: conftest must look where
    .ci/run put the umoci that reads zstd layers (Debian 12's own 0.4.7 cannot)."""
    import conftest

    ci = (REPO / ".ci" / "run").read_text()
    default = re.search(r"CI_DIR=\$\{CACHEBAKE_CI_DIR:-([^}]+)\}", ci)[1]
    assert re.search(r'newer-umoci\.sh sid "\$CI_DIR/umoci-sid"', ci)
    expected = os.path.join(os.environ.get("CACHEBAKE_CI_DIR") or default, "umoci-sid/usr/bin/umoci")
    assert conftest.CI_UMOCI == expected


def test_the_fast_lane_in_docs_is_the_suite_after_ci_run():
    testing = (REPO / "docs" / "testing.md").read_text()
    assert '. /opt/cachebake-ci/venv/bin/activate && python3 -m pytest -q -n auto -m "not slow"' in testing
    assert "/opt/cachebake-ci" in (REPO / ".ci" / "run").read_text()

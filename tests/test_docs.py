"""docs/ and README as a reader meets them: the command reference is the CLI's own --help, the
exit codes are cachebake.errors.ExitCode, each table has one page, every link leads somewhere, every shell block says
where it runs (a test, CI; and the test runs it) or what it needs that CI has not (a GPU, a cluster), and image
volumes need one Kubernetes version everywhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from installkit import REPO

from cachebake.errors import ExitCode

DOCS = REPO / "docs"
PAGES = [REPO / "README.md", REPO / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]


def test_the_command_reference_is_generated_from_the_cli():
    from cachebake.cli.reference import reference

    assert (DOCS / "commands.md").read_text() == reference(), \
        "docs/commands.md is stale: python3 -m cachebake.cli.reference docs/commands.md"


def test_each_block_of_the_reference_is_what_help_prints():
    from cachebake.cli.reference import commands

    text = (DOCS / "commands.md").read_text()
    blocks = dict(re.findall(r"^## (cachebake(?: [\w-]+)?)\n\n```text\n(.*?)\n```", text, re.S | re.M))
    names = commands()
    assert set(blocks) == {"cachebake", *(f"cachebake {n}" for n in names)}
    env = {**os.environ, "COLUMNS": "80"}
    for title, block in blocks.items():
        argv = [sys.executable, "-m", "cachebake.cli", *title.split()[1:], "--help"]
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.rstrip() == block.rstrip(), title


def test_the_exit_codes_page_is_the_exit_code_enum():
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", (DOCS / "exit-codes.md").read_text(), re.M)
    assert [int(code) for code, _ in rows] == sorted(int(c) for c in ExitCode)
    assert all(len(meaning) > 10 for _, meaning in rows)


def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}


def test_every_relative_link_leads_to_a_file_and_heading():
    problems = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{page.relative_to(REPO)}: {target}: no such heading")
    assert problems == []


def test_every_docs_page_is_in_the_index():
    index = (DOCS / "README.md").read_text()
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and f"]({p.name}" not in index]
    assert missing == []


def _sh_blocks(page: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", page.read_text(), re.S)


def test_every_shell_block_in_docs_says_where_it_runs_or_what_it_needs():
    """A block runs in a test or CI (`# runs in: FILE`, a file that exists), or needs what CI
    has not (`# needs: a GPU ...`, `a Kubernetes cluster`, `a registry`)."""
    problems = []
    for page in [*sorted(DOCS.glob("*.md")), REPO / "bench" / "README.md"]:
        for block in _sh_blocks(page):
            first = block.splitlines()[0]
            runs = re.match(r"# runs in: (.*)", first)
            needs = re.match(r"# needs: (a GPU|a Kubernetes cluster|a registry)", first)
            if runs:
                named = re.findall(r"(tests/\S+?\.py|\.ci/[\w-]+(?:\.sh)?)", runs[1])
                if not (named or runs[1].startswith(("CI", ".ci/run"))):
                    problems.append(f"{page.name}: {first}: names no test")
                problems += [f"{page.name}: {first}: no {n}" for n in named if not (REPO / n).exists()]
            elif not needs:
                problems.append(f"{page.name}: a block starting {first!r} says neither")
    assert problems == []


# A line that runs something, at the start of a line as a reader copies it (help text, YAML and
# trees indent theirs)
_COMMAND = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S+ )*(?:cachebake|python3?|pip3?|docker|kubectl|bash|sh|apt-get|"
                      r"skopeo|podman|umoci|curl|eval|export|sudo|cd|git|for|\.) ")


def test_every_command_is_in_a_shell_block():
    """The check above reads ```sh blocks: a command in a ```bash, ```console or untyped block
    would escape it (and GitHub shows it the same)."""
    problems = []
    for page in PAGES:
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M):
            if lang != "sh":
                problems += [f"{page.name}: ```{lang}: {ln}" for ln in body.splitlines() if _COMMAND.match(ln)]
    assert problems == []


def test_a_test_a_block_names_runs_what_the_block_says():
    """`# runs in: tests/X.py` is a claim that X runs each `cachebake COMMAND` of the block; a
    `# needs: ...` line that names a test makes it for the commands it names (`misses and replay
    --misses run in tests/...`).  X runs a command where its name is quoted, as an argv or
    CliRunner's list has it."""
    from cachebake.cli import main

    problems, checked = [], 0
    for page in [*sorted(DOCS.glob("*.md")), REPO / "bench" / "README.md"]:
        for block in _sh_blocks(page):
            first = block.splitlines()[0]
            named = re.findall(r"tests/\S+?\.py", first)
            if not named:
                continue
            if first.startswith("# runs in: "):
                code = "\n".join(ln.split("#", 1)[0] for ln in block.splitlines())
                claimed = re.findall(r"\bcachebake ([a-z][a-z0-9-]*)", code)
            else:
                claimed = [c for c in main.commands if re.search(rf"(?<![\w-]){c}(?![\w-])", first)]
            sources = "".join((REPO / n).read_text() for n in named if (REPO / n).exists())
            for command in claimed:
                checked += 1
                if f'"{command}"' not in sources:
                    problems.append(f"{page.name}: `cachebake {command}` is not run by {', '.join(named)}")
    assert checked >= 6 and problems == []


def test_readme_shell_blocks_are_the_ones_its_tests_run():
    """Start here (tests/test_readme.py) and the CPU quick start (tests/test_quickstart.py)."""
    readme = (REPO / "README.md").read_text()
    tested = [*re.findall(r"```sh\n(.*?)```", readme.split("\n## Start here\n", 1)[1].split("\n## ", 1)[0], re.S),
              *re.findall(r"```sh\n(.*?)```", readme.split("\n## Quick start on a CPU\n", 1)[1].split("\n## ", 1)[0],
                          re.S)]
    assert sorted(_sh_blocks(REPO / "README.md")) == sorted(tested)


def test_image_volumes_need_one_kubernetes_version_everywhere():
    """>= 1.35 (beta, on by default); 1.33 and 1.34 only with the feature gate turned on."""
    for page in PAGES:
        text = " ".join(page.read_text().split())
        for m in re.finditer(r"[Ii]mage[- ]?[Vv]olume[^.]{0,120}?(\d\.\d\d)", text):
            assert m[1] == "1.35", f"{page.name}: {m[0]}"
        for m in re.finditer(r"1\.3[34]\b", text):
            around = text[max(0, m.start() - 200):m.end() + 200]
            if "mage" in around.lower() and "volume" in around.lower():
                assert "feature gate" in around, f"{page.name}: {around}"


def test_each_table_has_one_home():
    """A table lives on one page and the others link to it (the exit codes: exit-codes.md, the
    commands at a glance: concepts.md): no row of a table, header included, on two pages."""
    homes: dict[str, list[str]] = {}
    for page in PAGES:
        for row in set(re.findall(r"^\|.*\|$", page.read_text(), re.M)):
            if not re.fullmatch(r"[|\s:-]+", row):  # a separator row is the same everywhere
                homes.setdefault(row, []).append(str(page.relative_to(REPO)))
    assert {row[:80]: pages for row, pages in homes.items() if len(pages) > 1} == {}

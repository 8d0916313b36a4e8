"""The project around the book: dependency lists in step, lint clean, entry points in place."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
TEST_COMMAND = "bash run.sh test"

# conda's name for a package -> pip's
CONDA_TO_PIP = {"pytorch": "torch"}
IGNORED = {"python", "pip"}


def _normalise(requirement: str) -> tuple[str, str]:
    """("name", "specifier") with the name canonical (PEP 503) and spaces removed."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$", requirement)
    assert m, f"cannot read requirement {requirement!r}"
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    spec = m.group(3).replace(" ", "")
    if spec.startswith("=") and not spec.startswith("=="):  # conda's single '=' pins a version
        spec = "=" + spec
    return name, spec


def pyproject_requirements() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    reqs = data["project"]["dependencies"] + data["project"]["optional-dependencies"]["book"]
    return dict(_normalise(r) for r in reqs)


def conda_requirements(text: str) -> dict[str, str]:
    """The plain-string entries of the top-level ``dependencies:`` list of an environment.yml.

    A tiny reader for the simple form we use (PyYAML may be absent): ``- name>=1.0`` lines under
    ``dependencies:``; a nested ``- pip:`` list is read too (its entries are pip names).
    """
    reqs: dict[str, str] = {}
    in_deps = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith((" ", "-")):  # a top-level key
            in_deps = line.startswith("dependencies:")
            continue
        if not in_deps:
            continue
        item = line.strip()
        if not item.startswith("- "):
            continue
        item = item[2:].strip().strip("'\"")
        if item.endswith(":"):  # "- pip:" opens the nested pip list
            continue
        name, spec = _normalise(item)
        name = CONDA_TO_PIP.get(name, name)
        if name in IGNORED:
            continue
        reqs[name] = spec
    return reqs


def test_environment_yml_matches_pyproject():
    conda = conda_requirements((ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip = pyproject_requirements()
    only_pip = {k: v for k, v in pip.items() if k not in conda}
    only_conda = {k: v for k, v in conda.items() if k not in pip}
    differ = {k: (pip[k], conda[k]) for k in pip.keys() & conda.keys() if pip[k] != conda[k]}
    assert not (only_pip or only_conda or differ), (
        f"pyproject.toml and environment.yml disagree:\n  only in pyproject: {only_pip}\n"
        f"  only in environment.yml: {only_conda}\n  different versions (pip, conda): {differ}"
    )


def test_conda_reader():
    text = (
        "name: x\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n  - pip\n"
        "  - pytorch>=2.2  # torch\n  - numpy >=1.24\n  - pip:\n    - Some_Pkg==1.0\nother:\n  - nope\n"
    )
    assert conda_requirements(text) == {"torch": ">=2.2", "numpy": ">=1.24", "some-pkg": "==1.0"}


def _lint_targets() -> list[str]:
    targets = [p for p in ("tfmlib", "tests", "tools", "benchmarks", "conftest.py") if (ROOT / p).exists()]
    notebooks = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "notebooks").rglob("*.py")
        if ".ipynb_checkpoints" not in p.parts
    )
    return targets + notebooks


def test_ruff_passes():
    try:
        import ruff  # noqa: F401
    except ImportError:
        if shutil.which("ruff") is None:
            pytest.skip("ruff is not installed")
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", *_lint_targets()]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 0, f"ruff found problems:\n{proc.stdout}\n{proc.stderr}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [
        line.strip() for line in ci.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]
    assert TEST_COMMAND in commands, f".ci/run must run `{TEST_COMMAND}`"
    readme = ROOT / "README.md"
    if not readme.exists():
        pytest.skip("README.md is missing")
    assert TEST_COMMAND in readme.read_text(encoding="utf-8"), f"README.md must show `{TEST_COMMAND}`"


@pytest.mark.parametrize("script", ["run.sh", ".ci/run"])
def test_entry_points_are_bash_scripts(script):
    path = ROOT / script
    assert path.exists(), f"{script} is missing"
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#!/usr/bin/env bash"), f"{script} must start with a bash shebang"
    assert "set -euo pipefail" in text, f"{script} must stop on the first error"
    # run as `bash run.sh`, so the executable bit is a convenience, not a requirement
    if shutil.which("bash"):
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script} has a bash syntax error:\n{proc.stderr}"


def test_run_sh_help_lists_the_commands():
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    proc = subprocess.run(["bash", str(ROOT / "run.sh"), "help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for command in ("setup", "book", "test", "lab"):
        assert f"run.sh {command}" in proc.stdout, proc.stdout

"""Run by a python without the pipeline's dependencies, every entry point says so in one line."""

import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.e2e


def without_site_packages(*args, cwd=ROOT):
    """`python -S`: the standard library only, as a system python without the project's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(
        [sys.executable, "-S", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("script", ["infer", "judge", "score", "aggregate"])
def test_stage_scripts_say_which_environment_to_use(script):
    proc = without_site_packages(f"{script}.py", "--help")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"{script}.py: the pipeline's dependencies (openai, orjson, tenacity, tqdm) are not installed for "
        f"{sys.executable}; run it with the project's environment: .venv/bin/python {script}.py ... "
        "(or `. .venv/bin/activate`); `make install` creates it"
    ]


def test_modules_run_with_dash_m_say_it_too():
    proc = without_site_packages("-m", "evalpipe.devtools.testserver")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("evalpipe.devtools.testserver: the pipeline's dependencies (openai, ")
    assert "run it with the project's environment: .venv/bin/python -m evalpipe.devtools.testserver ..." in proc.stderr


def test_paths_are_absolute_when_run_from_elsewhere(tmp_path):
    proc = without_site_packages(ROOT / "infer.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert f"{ROOT}/.venv/bin/python {ROOT}/infer.py ... (or `. {ROOT}/.venv/bin/activate`)" in proc.stderr

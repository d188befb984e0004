"""pyproject.toml and the requirements files the Makefile installs pin the same versions."""

import tomllib

import pytest

from .conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
FILES = {
    "requirements.txt": PROJECT["dependencies"],
    "requirements-dev.txt": PROJECT["optional-dependencies"]["tests"],
    "requirements-report.txt": PROJECT["optional-dependencies"]["plots"],
    "requirements-demo.txt": PROJECT["optional-dependencies"]["local"],
    "requirements-data.txt": PROJECT["optional-dependencies"]["data"],
}


def pins(lines):
    return sorted(line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip())


@pytest.mark.parametrize("name", FILES)
def test_requirements_file_matches_pyproject(name):
    assert pins((ROOT / name).read_text().splitlines()) == pins(FILES[name])
    assert all("==" in pin for pin in pins(FILES[name]))  # every dependency pinned exactly


def test_version_is_the_package_version():
    import evalpipe

    text = (ROOT / "evalpipe" / "__init__.py").read_text()
    assert f'__version__ = "{evalpipe.__version__}"' in text

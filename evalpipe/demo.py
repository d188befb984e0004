"""`make demo`: the whole pipeline, offline, on a real local model and the bundled samples.

Every stage is the same script a user points at OpenAI or vLLM later; only the endpoint differs.
To stay within a few minutes on 2 cores the demo caps the answer length, the sample size and the
number of runs, and gives the judge one attempt per task. (llama.cpp's JSON mode,
`--extra-body '{"response_format": {"type": "json_object"}}'`, makes the tiny judge parseable
more often but is about three times slower here.)
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from . import cli, localmodel
from .paths import PROJECT

ROOT = Path("outputs") / "demo"
RUNS = 2

# What each benchmark runs in the demo: infer flags, judge flags.
PLAN = {
    "clbench": {
        "infer": ["--max-samples", "6", "--max-tokens", "64", "--temperature", "0.8"],
        "judge": ["--max-tokens", "128", "--parse-attempts", "1"],
    },
    "coin_flip": {
        # three worked demos teach even the tiny model the ANSWER line
        "infer": ["--max-samples", "8", "--fewshot", "3", "--max-tokens", "96", "--temperature", "0.8"],
        "judge": [],
    },
    # the reference's `small` variant if `make error-recovery-data` made it, else our own sample
    "error_recovery": {
        "infer": ["--max-tokens", "32", "--temperature", "0.8"],
        "judge": [],
    },
}
ER_SMALL = PROJECT / "data" / "error_recovery" / "small.jsonl"


def run_child(cmd: list[str], env: dict) -> int:
    """Run a stage; on Ctrl-C let it stop gracefully (it got the signal too), then stop the demo."""
    proc = subprocess.Popen(cmd, env=env, cwd=PROJECT)
    interrupted = False
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
    if interrupted or code == 130:
        raise KeyboardInterrupt
    return code


def main() -> int:
    cli.sigterm_as_interrupt()
    started = time.monotonic()
    print(
        f"demo: {localmodel.MODEL_NAME} on llama.cpp, {RUNS} runs per benchmark, capped sample sizes and "
        "answer lengths so it ends in minutes; a tiny model, so expect poor answers and many judge fallbacks.",
        flush=True,
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "JUDGE_"))}
    model = localmodel.MODEL_NAME
    worst = 0
    try:
        with localmodel.server(ROOT / "llama-server.log") as base_url:
            env["OPENAI_BASE_URL"] = base_url
            for bench, flags in PLAN.items():
                common = ["--bench", bench, "--outputs-dir", str(ROOT)]
                if bench == "error_recovery" and ER_SMALL.exists():
                    flags = {**flags, "infer": [*flags["infer"], "--input", str(ER_SMALL)]}
                for run in range(1, RUNS + 1):
                    steps = [
                        ("infer", ["--model", model, "--workers", "1", *flags["infer"]]),
                        ("judge", ["--model", model, "--judge-model", model, "--workers", "1", *flags["judge"]]),
                        ("score", ["--model", model]),
                    ]
                    for script, args in steps:
                        print(f"\ndemo: {bench} run {run}/{RUNS}: {script}", flush=True)
                        code = run_child([sys.executable, f"{script}.py", *common, "--run", str(run), *args], env)
                        if code not in (0, 3):
                            return code
                        worst = max(worst, code)
        print("\ndemo: leaderboards and plots of every benchmark (make report)", flush=True)
        run_child([sys.executable, "-m", "evalpipe.leaderboard", "--outputs-dir", str(ROOT)], env)
    except KeyboardInterrupt:
        print("\ndemo: interrupted; `make demo` again resumes where it stopped", flush=True)
        return 130
    print(f"demo: done in {time.monotonic() - started:.0f}s; results under {ROOT}/", flush=True)
    return worst


if __name__ == "__main__":
    sys.exit(main())

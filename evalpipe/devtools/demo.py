"""`make demo`: the whole pipeline, offline, on a real local model and the bundled samples.

Every stage is the same script a user points at OpenAI or vLLM later, run by the same runner as
`make infer judge score`; only the endpoint differs. To stay within a few minutes on 2 cores the
demo caps the answer length, the sample size and the number of runs, and gives the judge one
attempt per task. (llama.cpp's JSON mode,
`--extra-body '{"response_format": {"type": "json_object"}}'`, makes the tiny judge parseable
more often but is about three times slower here.)
"""

import os
import sys
import time
from pathlib import Path

from .. import errors, pipeline
from ..errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK
from . import localmodel
from .localmodel import PLAN, make_line, settings

ROOT = Path("outputs") / "demo"
RUNS = 2


def main() -> int:
    errors.sigterm_as_interrupt()
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
        with localmodel.server(ROOT / "llama-server.log") as local:
            os.environ["OPENAI_BASE_URL"] = local.base_url
            for bench in PLAN:
                print(f"\ndemo: {bench}: {make_line(bench, RUNS)}", flush=True)
                plan = pipeline.Plan(
                    ["infer", "judge", "score"], {**settings(bench), "RUNS": str(RUNS), "OUTPUTS": str(ROOT)}
                )
                code = pipeline.run(plan)
                local.check()  # a stage that could not reach the server: say why
                if code not in (EXIT_OK, EXIT_INCOMPLETE):
                    return code
                worst = max(worst, code)
        print("\ndemo: leaderboards and plots of every benchmark (make report)", flush=True)
        code = pipeline.run_command([sys.executable, "-m", "evalpipe.stages.report", "--outputs-dir", str(ROOT)])
    except (localmodel.ServerDied, localmodel.ServerNotReady) as exc:
        print(f"\ndemo: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
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

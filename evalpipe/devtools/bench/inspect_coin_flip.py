"""CoinFlip through inspect_ai, for `make bench`'s peers part; run by .venv-peers' python, so it imports nothing
of evalpipe: EvalScope's questions, the model's answers, a YES/NO pattern scorer, 256 connections.

    .venv-peers/bin/python evalpipe/devtools/bench/inspect_coin_flip.py BASE_URL DATA N LOG_DIR
"""

import json
import sys
from pathlib import Path


def main(url: str, data: str, n: int, log_dir: str) -> None:
    from inspect_ai import Task, eval  # type: ignore[import-not-found]
    from inspect_ai.dataset import Sample  # type: ignore[import-not-found]
    from inspect_ai.scorer import pattern  # type: ignore[import-not-found]
    from inspect_ai.solver import generate  # type: ignore[import-not-found]

    rows = [json.loads(line) for line in Path(data).read_text().splitlines()[:n]]
    samples = [Sample(input=row["question"], target=row["answer"].upper(), id=i) for i, row in enumerate(rows)]
    task = Task(dataset=samples, solver=generate(), scorer=pattern(r"ANSWER:\s*(YES|NO)"))
    # inspect's provider for any OpenAI-compatible server: chat completions at url (its `openai` provider would
    # use OpenAI's Responses API)
    [log] = eval(
        task,
        model="openai-api/loopback/bench",
        model_base_url=url,
        max_connections=256,
        log_dir=log_dir,
        display="none",
    )
    if log.status != "success" or len(log.samples or []) != n:
        sys.exit(f"inspect_ai: {log.status}, {len(log.samples or [])} of {n} samples")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])

"""A served model night after night, for the watch's tests and its figures (docs/watch.md#honest-alarms).

`ServedModel` answers CoinFlip questions as a model of a given accuracy would, behind the loopback test server
(testserver.FakeOpenAI), each night a little differently: a task is answered right when its fixed difficulty
lies below `accuracy` (the same every night), except that on each night a share `noise` of the tasks is drawn
afresh, right with probability `accuracy`. So each night's expected accuracy is `accuracy` exactly, consecutive
nights of an unchanged model disagree on about 2·noise·accuracy·(1 − accuracy) of the tasks (the run-to-run flip
rate of a model sampled at a temperature), and lowering `accuracy` by 0.08 is an 8-point drop. `served` is the
model the replies say answered: change it with the same accuracy and it is a re-pointed snapshot.

`nights()` writes a series of such nights directly (judge rows) and summarises each with the real score stage,
as the watch's folder would hold them; `alarms()` compares each with the night before with the watch's own
comparison (results/nights.py) and counts the nights that would exit 8.

    python -m evalpipe.devtools.nights   # false alarms in unchanged nights, and detection of an 8-point drop
"""

import argparse
import contextlib
import hashlib
import io
import re
from collections.abc import Sequence
from pathlib import Path

import orjson

from ..benchmarks.coin_flip import CoinFlip
from ..errors import run_stage
from ..results import nights as watch_nights
from ..stages import score
from ..store.paths import PROJECT
from .testserver import Reply, Request

_QUESTION = re.compile(r"Q: A coin is heads up\..*?Is the coin still heads up\?", re.S)
DATA = PROJECT / "data" / "coin_flip" / "test.jsonl"


def _uniform(*parts: object) -> float:
    """A number in [0, 1) fixed by its parts."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def gold(question: str) -> str:
    """YES when the coin is still heads up: an even number of flips."""
    return "YES" if question.count(" flips the coin") % 2 == 0 else "NO"


class ServedModel:
    """A test server handler (and the same answers without one, `prediction`): see the module's docstring."""

    def __init__(self, accuracy: float = 0.8, noise: float = 0.3, served: str = "snapshot-1", seed: int = 0):
        self.accuracy, self.noise, self.served, self.seed = accuracy, noise, served, seed
        self.night = "night-1"  # set before each night: the draw of the noisy tasks

    def right(self, question: str) -> bool:
        if _uniform(self.seed, "redraw", self.night, question) < self.noise:
            return _uniform(self.seed, "answer", self.night, question) < self.accuracy
        return _uniform(self.seed, "difficulty", question) < self.accuracy

    def prediction(self, question: str) -> str:
        answer = gold(question)
        return answer if self.right(question) else ("NO" if answer == "YES" else "YES")

    def __call__(self, request: Request) -> Reply:
        found = _QUESTION.findall(request.last_content)
        if not found:
            return Reply(content="I cannot tell.", served_model=self.served)
        return Reply(content=f"Tracking the coin.\nANSWER: {self.prediction(found[-1])}", served_model=self.served)


def _quiet(stage: str, main, argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return run_stage(stage, main, argv)


def write_night(folder: Path, data: Path, model: ServedModel) -> None:
    """One night's judge rows for every task of `data`, as infer and judge would write them, then the real score."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "judge.jsonl", "wb") as f:
        for task in CoinFlip().load(data):
            question, target = task.row["question"], task.row["target"]
            prediction = model.prediction(question)
            row = {
                "idx": task.id,
                "model_output": f"ANSWER: {prediction}",
                "target": target,
                "model": "m",
                "status": "ok",
                "response_model": model.served,
                "prediction": prediction,
                "score": int(prediction == target),
                "judge_status": "ok",
            }
            f.write(orjson.dumps(row) + b"\n")
    code = _quiet(
        "score", score.main, ["--bench", "coin_flip", "--input", str(folder / "judge.jsonl"), "--data", str(data)]
    )
    assert code == 0, f"score exited {code} in {folder}"


def nights(root: Path, data: Path, accuracies: Sequence[float], noise: float = 0.3, seed: int = 0) -> list[Path]:
    """A night per accuracy, run-1.. under root (a model whose accuracy is `accuracies[k]` on night k)."""
    model = ServedModel(noise=noise, seed=seed)
    folders = []
    for k, accuracy in enumerate(accuracies, 1):
        model.accuracy, model.night = accuracy, f"night-{k}"
        folder = root / f"run-{20260100 + k}"
        write_night(folder, data, model)
        folders.append(folder)
    return folders


def alarms(folders: Sequence[Path], alpha: float = watch_nights.DEFAULT_ALPHA) -> list[dict]:
    """Each night after the first against the night before, by the watch's comparison: its headline and verdict."""
    figures = CoinFlip.figures
    out = []
    read = [watch_nights.Night(folder) for folder in folders]
    for before, after in zip(read, read[1:]):
        found = watch_nights.compare(figures, before, after, alpha)
        out.append(
            {
                "night": after.folder.name,
                "flagged": found["flagged"],
                "diff": found["headline"]["diff"],
                "p_value": found["headline"]["p_value"],
                "flipped": found["flips"]["to_fail"] + found["flips"]["to_pass"],
                "paired": found["flips"]["paired"],
            }
        )
    return out


def first_lines(n: int, out: Path) -> Path:
    """The first n CoinFlip questions as a dataset file of their own."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"".join(DATA.read_bytes().splitlines(keepends=True)[:n]))
    return out


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m evalpipe.devtools.nights", description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=10, help="series of 20 unchanged nights (default 10)")
    parser.add_argument("--tasks", type=int, default=1000, help="CoinFlip tasks a night (default 1000)")
    parser.add_argument("--drops", type=int, default=20, help="nights with a drop to try (default 20)")
    parser.add_argument("--drop", type=float, default=0.08, help="the drop of accuracy (default 0.08: 8 points)")
    parser.add_argument("--alpha", type=float, default=watch_nights.DEFAULT_ALPHA)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = first_lines(args.tasks, Path(tmp) / "data.jsonl")
        false_alarms = comparisons = 0
        worst = 0
        for s in range(args.series):
            found = alarms(nights(Path(tmp) / f"series-{s}", data, [0.8] * 20, seed=s), args.alpha)
            flagged = sum(1 for a in found if a["flagged"])
            false_alarms += flagged
            comparisons += len(found)
            worst = max(worst, flagged)
            print(f"series {s}: {flagged} of {len(found)} unchanged nights flagged", flush=True)
        if comparisons:
            print(
                f"false alarms: {false_alarms} of {comparisons} comparisons of unchanged nights "
                f"({100 * false_alarms / comparisons:.2f}%, alpha {args.alpha:g}); "
                f"at most {worst} in one series of 20 nights"
            )
        detected = 0
        for s in range(args.drops):
            found = alarms(nights(Path(tmp) / f"drop-{s}", data, [0.8, 0.8 - args.drop], seed=1000 + s), args.alpha)
            detected += bool(found[0]["flagged"])
        if args.drops:
            print(
                f"a {100 * args.drop:g}-point drop on {args.tasks} tasks: flagged the night it happened in "
                f"{detected} of {args.drops}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A served model evaluated night after night: one crontab line that says when something changed.

    .venv/bin/python -m evalpipe.pipeline watch BENCH=coin_flip MODEL=gpt-4o-mini [JUDGE_MODEL=...] [SAMPLE=N]

Each night is one resumable run, OUTPUTS/watch/<bench>/<model>/run-<YYYYMMDD>/, compared task by task with the
previous complete night once complete. Exit 0: nothing moved (one line on stdout); 8: the headline moved beyond
noise, or the model, judge or dataset changed (a report on stdout, for cron's mail); any other code is the
stages' own. The stages' output goes to stderr. Details: docs/watch.md.
"""

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from . import benchmarks, pipeline
from .datasets import hub, subset
from .errors import EXIT_OK, BadInput, run_stage, writing
from .results import nights, viewer
from .store import jsonl, lock, manifest, paths

FOLDER = "watch"  # OUTPUTS/watch/ is the watch's results root
STAGES = ("infer", "judge", "score")
SETTINGS = {
    "NIGHT": "the night, a UTC date YYYY-MM-DD (default: today's); its run is run-YYYYMMDD",
    "BASELINE": "a complete night YYYY-MM-DD that every night is also compared with",
    "SAMPLE": "evaluate N items only: a fixed subset stratified by category, chosen once, kept in the watch's folder",
    "ALPHA": f"two-sided significance level of the headline's comparison (default {nights.DEFAULT_ALPHA})",
}
# the runner's settings a watch passes on to its stages; the others make no sense for one run a night
PASSED = ("BENCH", "MODEL", "JUDGE_MODEL", "DATA", "WORKERS", "OUTPUTS", "LABEL", "ARGS", "JUDGE_ARGS", "MAX_COST")
SAMPLE_RECORD = "sample.json"  # how it was chosen, from which file


@dataclass
class Watch:
    plan: pipeline.Plan  # the night's stages and the settings passed on (OUTPUTS is the watch's root)
    night: str
    baseline: str | None
    sample: int | None
    alpha: float

    @property
    def bench(self) -> benchmarks.Benchmark:
        return benchmarks.get(self.plan.get("BENCH") or benchmarks.DEFAULT)

    @property
    def folder(self) -> Path:  # the watched model's: its nights, its subset, its history
        name = paths.model_dir_name(self.plan.get("MODEL") or "", self.plan.get("LABEL"))
        return Path(self.plan.get("OUTPUTS") or paths.DEFAULT_ROOT) / self.bench.name / name


def _date(value: str, name: str) -> str:
    try:
        parsed = time.strptime(value, "%Y-%m-%d")
    except ValueError:
        raise pipeline.UsageError(f"{name}={value}: expected a date YYYY-MM-DD") from None
    return time.strftime("%Y-%m-%d", parsed)


def parse(argv: list[str]) -> Watch:
    passed, own = [], {}
    for word in argv:
        name, eq, value = word.partition("=")
        if not eq:
            raise pipeline.UsageError(f"watch takes VAR=value settings, not {word!r}")
        if name in SETTINGS:
            own[name] = value.strip()
        elif name in PASSED:
            passed.append(word)
        elif name in pipeline.SETTINGS:
            raise pipeline.UsageError(
                f"{name}: not a watch setting (a night is one run; watch settings: {', '.join([*PASSED, *SETTINGS])})"
            )
        else:
            raise pipeline.UsageError(f"unknown setting {name}; watch settings: {', '.join([*PASSED, *SETTINGS])}")
    plan = pipeline.parse([*STAGES, *passed])  # checks BENCH, MAX_COST (and its prices), ARGS as the runner does
    if not plan.get("MODEL"):
        raise pipeline.UsageError("name the model to watch: MODEL=...")
    night = _date(own.get("NIGHT") or time.strftime("%Y-%m-%d", time.gmtime()), "NIGHT")
    baseline = _date(own["BASELINE"], "BASELINE") if own.get("BASELINE") else None
    if baseline is not None and baseline >= night:
        raise pipeline.UsageError(f"BASELINE={baseline}: choose a night before tonight ({night})")
    sample = own.get("SAMPLE") or None
    if sample is not None and not (re.fullmatch(r"[0-9]+", sample) and int(sample) >= 2):
        raise pipeline.UsageError(f"SAMPLE={sample}: expected a whole number of 2 or more (digits 0-9)")
    try:
        alpha = float(own.get("ALPHA") or nights.DEFAULT_ALPHA)
    except ValueError:
        alpha = -1.0
    if not 0 < alpha < 1:
        raise pipeline.UsageError(f"ALPHA={own.get('ALPHA')}: expected a significance level between 0 and 1")
    plan.settings["OUTPUTS"] = str(Path(plan.get("OUTPUTS") or paths.DEFAULT_ROOT) / FOLDER)
    plan.run_numbers = [nights.run_number(night)]
    return Watch(plan, night, baseline, int(sample) if sample else None, alpha)


def _subset(watch: Watch, n: int, source: Path, sha: str) -> Path:
    """The fixed subset (SAMPLE=N): chosen once; the same tasks copied again when the dataset's sha256 changed."""
    record_path, rows = watch.folder / SAMPLE_RECORD, watch.folder / "sample.jsonl"  # beside the nights
    record = nights.read_json(record_path)
    if not record:
        chosen = subset.choose(watch.bench, source, n, seed=f"evalpipe-watch:{watch.bench.name}:{n}")
        record = {"requested": n, **chosen, "source": str(source), "source_sha256": sha, "updated": []}
    elif record.get("requested") != n:
        raise BadInput(
            f"this watch evaluates a subset of {record.get('requested')} items; another SAMPLE starts another watch: "
            "give it LABEL=...",
            record_path,
        )
    elif record["source_sha256"] != sha:  # the dataset changed: the same tasks, where they still are
        record["lines"] = subset.lines_of(watch.bench, source, record["ids"])
        record["updated"].append({"night": watch.night, "source_sha256": sha, "lines": len(record["lines"])})
        record["source"], record["source_sha256"] = str(source), sha
    else:
        return rows
    subset.write(source, record["lines"], rows)
    jsonl.write_json(record_path, record)
    return rows


def _night_data(watch: Watch, run_dir: Path) -> Path:
    """The file tonight's stages read, fixed at the night's first start (dataset.json records it and its source)."""
    record_path = run_dir / nights.DATASET
    recorded = nights.read_json(record_path).get("file")
    if recorded:
        return Path(recorded)
    given = watch.plan.get("DATA")
    source = Path(hub.resolve_argv([given])[0]) if given else watch.bench.default_data
    if source is None:
        raise BadInput(f"{watch.bench.name} has no bundled dataset: give DATA=...")
    sha = manifest.sha256_file(source)  # once: a large dataset takes a while to read
    data = _subset(watch, watch.sample, source, sha) if watch.sample else source
    record = {"file": str(data), "source": str(source), "source_sha256": sha, "revision": hub.source_of(source)}
    with writing(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
    jsonl.write_json(record_path, record)
    return data


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """The stages' output goes to stderr: stdout is the verdict's alone (cron mails it)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def night(watch: Watch) -> int:
    folder = watch.folder
    with writing(folder):
        folder.mkdir(parents=True, exist_ok=True)
    with lock.exclusive(folder / FOLDER):
        run = nights.run_number(watch.night)
        run_dir = folder / f"run-{run}"
        done = run_dir / nights.VERDICT
        if done.exists():  # compared already: the verdict again, in one line
            verdict = nights.read_json(done)
            print(f"{nights.summary_line(verdict)} (compared {verdict['compared_at']}; report: {done})")
            return int(verdict["exit_code"])
        baseline = None
        if watch.baseline is not None:
            baseline = folder / f"run-{nights.run_number(watch.baseline)}"
            if not (baseline / nights.VERDICT).exists():
                raise BadInput(f"BASELINE={watch.baseline}: no complete night of that date in {folder}")
        watch.plan.settings["DATA"] = str(_night_data(watch, run_dir))
        if watch.plan.get("MAX_COST") is not None:
            watch.plan.ledger = str(run_dir / "spent")  # MAX_COST caps the night, over all its starts
        with _stdout_to_stderr():
            code = pipeline.run(watch.plan)
        if code != EXIT_OK:
            return code
        earlier = [  # the complete nights before this one
            (int(m.group(1)), p)
            for p in folder.glob("run-*")
            if (m := paths.RUN_DIR.match(p.name)) and int(m.group(1)) < run and (p / nights.VERDICT).exists()
        ]
        previous = max(earlier)[1] if earlier else None
        about = {
            "benchmark": watch.bench.name,
            "model": folder.name,
            "night": watch.night,
            "run": run,
            "history": str(folder / f"{nights.HISTORY}.md"),
        }
        verdict = nights.verdict(watch.bench.figures, run_dir, previous, baseline, watch.alpha, about)
        verdict["compared_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        code = verdict["exit_code"]
        link = None
        if code != EXIT_OK:  # report.html of the watch's root, on the two nights side by side, disagreements first
            with _stdout_to_stderr():
                page = viewer.write(Path(watch.plan.get("OUTPUTS") or ""), benchmarks.sample_views())
            before = (previous or baseline or run_dir).name.removeprefix("run-")
            model = quote(folder.name)
            fragment = f"v=compare&cb={quote(watch.bench.name)}&am={model}&ar={before}&bm={model}&br={run}&cf=disagree"
            link = f"{page.resolve().as_uri()}#{fragment}"
        verdict["viewer"] = link
        jsonl.write_json(done, verdict)
        nights.write_history(folder, f"{watch.bench.name} / {folder.name}")
        print(nights.report(verdict, link) if code != EXIT_OK else nights.summary_line(verdict) + "\n", end="")
        return code


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(__doc__ + "\nSettings:\n" + "\n".join(f"  {k:<12} {v}" for k, v in SETTINGS.items()))
        print(f"  and the runner's {', '.join(PASSED)} (python -m evalpipe.pipeline --help)")
        return EXIT_OK
    return run_stage("watch", lambda words: night(parse(words)), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

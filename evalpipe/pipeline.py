"""The pipeline in one command whose exit code a cron job can act on (make turns every failure into 2).

    .venv/bin/python -m evalpipe.pipeline infer judge score aggregate BENCH=clbench MODEL=gpt-4o-mini RUNS=3
    .venv/bin/python -m evalpipe.pipeline watch BENCH=coin_flip MODEL=gpt-4o-mini  (docs/watch.md)

Stages run in pipeline order, each per-run stage once per run 1..RUNS in its own process; exit 3 and 75 let the
other runs go on. How the runner's exit code is chosen: docs/operations.md#make-and-the-runner.
"""

import argparse
import ctypes
import difflib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from . import benchmarks, cli
from .benchmarks.base import uses_judge_model
from .client import spending
from .errors import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_OK, EXIT_WAITING, BadInput, run_stage
from .store.paths import JUDGE_LABEL, PROJECT

STAGES = ("infer", "judge", "error-analysis", "score", "aggregate", "publish")
DEFAULT_MODEL = "gpt-4o-mini"
DEFAULT_RUNS = 3
# VAR -> what it means; an empty value is the same as not giving the variable.
SETTINGS = {
    "BENCH": "benchmark (default clbench)",
    "MODEL": f"model under test (default {DEFAULT_MODEL})",
    "JUDGE_MODEL": "judge model (default: judge.py's)",
    "JUDGE_LABEL": "a second opinion: judge, error-analysis and score use judge-NAME.jsonl (judge.jsonl untouched)",
    "RUNS": f"runs 1..RUNS of each per-run stage (default {DEFAULT_RUNS}; aggregate: every run that exists)",
    "DATA": "dataset file (default: the benchmark's bundled sample)",
    "WORKERS": "calls in flight (default: the stage's, 8)",
    "MAX_SAMPLES": "only the first N tasks",
    "OUTPUTS": "output root (default outputs)",
    "LABEL": "a named variant of the model's configuration: its own folder <model>@<label> and leaderboard row",
    "SHARD": "infer, judge, error-analysis: only shard K/N of each run, K from 0; all: the whole run (docs/scale.md)",
    "SHARDS": "the number of shards N, with K from a Kubernetes Indexed Job's JOB_COMPLETION_INDEX",
    "ARGS": "more flags for infer.py",
    "JUDGE_ARGS": "more flags for judge.py (judge and error-analysis)",
    "MAX_COST": "spend at most this many USD in this invocation, over all its stages (--max-cost; exit 6 when reached)",
    "REPO": "publish: the Hugging Face Hub dataset repo, owner/name (token: HF_TOKEN)",
    "PUBLISH_ARGS": "more flags for publish (--with-prompts, --private)",
}


class UsageError(BadInput):
    """A bad stage name or setting: one line, exit 2."""


@dataclass
class Plan:
    stages: list[str]
    settings: dict[str, str] = field(default_factory=dict)
    run_numbers: list[int] | None = None  # the per-run stages' runs, instead of 1..RUNS (the watch's: one night)
    ledger: str | None = None  # MAX_COST counts from this file's spending, kept across invocations (a night's)

    def get(self, name: str) -> str | None:
        return self.settings.get(name) or None


def parse(argv: list[str]) -> Plan:
    stages, settings, unknown = [], {}, []
    for word in argv:
        name, eq, value = word.partition("=")
        if eq:
            if name not in SETTINGS:
                unknown.append(f"{name}={_nearest(name, SETTINGS)}")
            settings[name] = value.strip()
        elif word in STAGES:
            stages.append(word)
        else:
            raise UsageError(f"unknown stage {word!r}{_nearest(word, STAGES)}; stages: {', '.join(STAGES)}")
    if unknown:
        raise UsageError(f"unknown setting {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    if not stages:
        raise UsageError(f"name at least one stage: {', '.join(STAGES)}")
    plan = Plan([s for s in STAGES if s in stages], settings)
    for name in ("RUNS", "WORKERS", "MAX_SAMPLES", "SHARDS"):
        given = plan.get(name)
        # ASCII digits only: str.isdigit takes '²' (which int() refuses) and int() takes other scripts' digits
        if given is not None and not (re.fullmatch(r"[0-9]+", given) and int(given) >= 1):
            raise UsageError(f"{name}={given}: expected a whole number of 1 or more (digits 0-9)")
    bench = plan.get("BENCH") or benchmarks.DEFAULT
    if bench not in benchmarks.REGISTRY:
        raise UsageError(f"BENCH={bench}: unknown benchmark; choose from {', '.join(benchmarks.REGISTRY)}")
    if "publish" in plan.stages and not plan.get("REPO"):
        raise UsageError("publish: give the Hub dataset repo, REPO=owner/name")
    if "error-analysis" in plan.stages and not isinstance(benchmarks.get(bench), benchmarks.ErrorAnalysis):
        raise UsageError(f"error-analysis: {bench} has no error analysis (CL-bench has)")
    max_cost = plan.get("MAX_COST")
    if max_cost is not None:
        try:
            spending.amount(max_cost)
        except ValueError:
            raise UsageError(f"MAX_COST={max_cost}: expected an amount in USD above 0") from None
    label = plan.get("JUDGE_LABEL")
    if label is not None and not JUDGE_LABEL.fullmatch(label):
        raise UsageError(f"JUDGE_LABEL={label}: use letters, digits, '.' and '-' (not starting with '.' or '-')")
    for name in ("ARGS", "JUDGE_ARGS", "PUBLISH_ARGS"):
        try:
            shlex.split(plan.get(name) or "")
        except ValueError as exc:
            raise UsageError(f"{name}={plan.get(name)}: {exc}") from None
    check_prices(plan)
    return plan


def _nearest(word: str, known) -> str:
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def check_prices(plan: Plan) -> None:
    """With a spending cap, every model the plan's stages will call has a price, before the first stage spends
    anything (BadInput, exit 2): a judge model missing from the table must not be found after infer has paid."""
    bench = benchmarks.get(plan.get("BENCH") or benchmarks.DEFAULT)
    cost_flags = argparse.ArgumentParser(add_help=False)  # what a stage's command line may spend, on which model
    cost_flags.add_argument("--model")
    cost_flags.add_argument("--judge-model", default=cli.DEFAULT_JUDGE_MODEL)
    cost_flags.add_argument("--prices")
    cost_flags.add_argument("--max-cost")
    for stage in plan.stages:
        if stage not in ("infer", "judge", "error-analysis") or (stage != "infer" and not uses_judge_model(bench)):
            continue
        flags, _ = cost_flags.parse_known_args(command(plan, stage)[2:])
        if flags.max_cost is None:
            continue
        model = flags.model if stage == "infer" else flags.judge_model
        try:
            spending.amount(flags.max_cost)
            spending.prices_for(flags.prices, model)
        except ValueError as exc:  # a cap in ARGS or JUDGE_ARGS: refused before any stage spends, as MAX_COST is
            raise UsageError(f"{stage}: --max-cost {exc}") from None
        except BadInput as exc:
            raise UsageError(f"{stage}: {exc}") from None


def _flags(plan: Plan, **flags: str) -> list[str]:
    """`--flag value` for each VAR=--flag whose VAR is set, in order."""
    return [word for var, flag in flags.items() if plan.get(var) is not None for word in (flag, plan.settings[var])]


def command(plan: Plan, stage: str) -> list[str]:
    """The stage script's command line for this plan (without --run)."""
    if stage == "publish":
        bench = plan.get("BENCH") or benchmarks.DEFAULT
        publish = [sys.executable, "-m", "evalpipe.results.publish", bench, plan.get("REPO") or ""]
        return publish + _flags(plan, OUTPUTS="--outputs-dir") + shlex.split(plan.get("PUBLISH_ARGS") or "")
    script = {"error-analysis": "judge"}.get(stage, stage)
    cmd = [sys.executable, str(PROJECT / f"{script}.py"), *_flags(plan, BENCH="--bench", OUTPUTS="--outputs-dir")]
    if stage == "aggregate":
        return cmd + _flags(plan, RUNS="--runs")
    cmd += ["--model", plan.get("MODEL") or DEFAULT_MODEL, *_flags(plan, LABEL="--label")]
    if stage == "score":
        return cmd + _flags(plan, DATA="--data", MAX_SAMPLES="--max-samples", JUDGE_LABEL="--judge-label")
    cmd += _flags(plan, SHARD="--shard", SHARDS="--shards")
    # the ledger makes MAX_COST cap the whole invocation (`run` gives one with MAX_COST)
    cap = _flags(plan, MAX_COST="--max-cost") + (["--spending-ledger", plan.ledger] if plan.ledger else [])
    if stage == "infer":
        flags = _flags(plan, DATA="--input", MAX_SAMPLES="--max-samples", WORKERS="--workers")
        return cmd + flags + cap + shlex.split(plan.get("ARGS") or "")
    analysis = ["--error-analysis"] if stage == "error-analysis" else []
    flags = _flags(plan, JUDGE_MODEL="--judge-model", JUDGE_LABEL="--judge-label", WORKERS="--workers")
    return cmd + analysis + flags + cap + shlex.split(plan.get("JUDGE_ARGS") or "")


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn for Popen: the kernel SIGKILLs the child when this process dies, however it dies (Linux's
    PR_SET_PDEATHSIG); None elsewhere. Call Popen from the main thread: the kernel watches the thread."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, <linux/prctl.h>
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(128 + signal.SIGKILL)

    return hook


class _Signals:
    """Passes SIGINT/SIGTERM on to the stage, which runs in a process group of its own: exactly once per press
    (the first lets calls in flight finish, a second abandons them), and a `kill` of the runner acts as a Ctrl-C."""

    def __init__(self):
        self.child: subprocess.Popen | None = None
        self.received = False

    def __enter__(self):
        self._old = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _forward(self, signum, frame) -> None:
        self.received = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, cmd: list[str]) -> int:
        if self.received:
            return EXIT_INTERRUPTED
        self.child = subprocess.Popen(cmd, process_group=0, preexec_fn=die_with_parent())
        try:
            returncode = self.child.wait()
            if returncode < 0 and not self.received:
                name = cmd[2] if cmd[1:2] == ["-m"] else os.path.basename(cmd[1]) if len(cmd) > 1 else cmd[0]
                known = f" ({signal.Signals(-returncode).name})" if -returncode in set(signal.Signals) else ""
                _say(f"{name} was killed by signal {-returncode}{known}")
            return 128 - returncode if returncode < 0 else returncode  # as a shell says killed by signal N: 128 + N
        finally:
            self.child = None


def _over_runs(signals: _Signals, cmd: list[str], runs: list[int]) -> int:
    """A per-run stage for these runs: 3 and 75 let the other runs go on; anything else stops."""
    code, waiting = EXIT_OK, False
    for k in runs:
        rc = signals.run([*cmd, "--run", str(k)])
        if rc == EXIT_INCOMPLETE:
            code = EXIT_INCOMPLETE
        elif rc == EXIT_WAITING:
            waiting = True
        elif rc != EXIT_OK:
            return rc
    return EXIT_WAITING if waiting else code


def run_command(cmd: list[str]) -> int:
    with _Signals() as signals:
        rc = signals.run(cmd)
    return EXIT_INTERRUPTED if signals.received else rc


def run(plan: Plan) -> int:
    if plan.get("MAX_COST") is not None and plan.ledger is None:
        with tempfile.TemporaryDirectory(prefix="evalpipe-spent-") as folder:
            # MAX_COST caps the whole invocation: each stage counts from what the ones before it spent
            return run(replace(plan, ledger=os.path.join(folder, "spent")))
    worst = EXIT_OK
    runs = plan.run_numbers or list(range(1, int(plan.get("RUNS") or DEFAULT_RUNS) + 1))
    with _Signals() as signals:
        for stage in plan.stages:
            cmd = command(plan, stage)
            rc = signals.run(cmd) if stage in ("aggregate", "publish") else _over_runs(signals, cmd, runs)
            if signals.received:  # the stage kept what it finished; the user asked to stop, so no next stage
                _say("interrupted; rerun the same command to continue")
                return EXIT_INTERRUPTED
            if rc == EXIT_INCOMPLETE:
                worst = EXIT_INCOMPLETE
                continue
            if rc != EXIT_OK and worst != EXIT_OK:
                # a later stage that cannot go on for want of what an incomplete one left (no judge file yet)
                # does not replace the code of the stage that stopped first: that is what to act on
                _say(f"{stage} stopped with exit code {rc} after an incomplete stage; later stages not run")
                break
            if rc == EXIT_WAITING:
                _say(f"{stage} submitted batches, still waiting (exit 75); run the same command again later")
                return rc
            if rc != EXIT_OK:
                _say(f"{stage} stopped with exit code {rc}; later stages not run")
                return rc
    if worst == EXIT_INCOMPLETE:
        _say("incomplete (exit 3): some tasks are not done yet; rerun the same command later")
    return worst


def _say(text: str) -> None:
    print(f"pipeline: {text}", file=sys.stderr)


def main(argv: list[str]) -> int:
    if argv[:1] == ["watch"]:  # a served model night after night (evalpipe/watch.py, docs/watch.md)
        return run_command([sys.executable, "-m", "evalpipe.watch", *argv[1:]])
    if argv in (["-h"], ["--help"]):
        print(__doc__ + "\nSettings:\n" + "\n".join(f"  {k:<12} {v}" for k, v in SETTINGS.items()))
        return EXIT_OK
    return run_stage("pipeline", lambda words: run(parse(words)), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Check `--parse evalscope` against EvalScope's own CoinFlip rule, read from an EvalScope wheel.

    .venv/bin/pip download --no-deps -d /tmp/es evalscope==1.14.1
    .venv/bin/python -m evalpipe.devtools.evalscope_parity /tmp/es/evalscope-1.14.1-py3-none-any.whl

Loads `evalscope/utils/multi_choices.py` (extract_answer_line) and `evalscope/utils/yes_no.py`
(extract_verdict) from the wheel, without installing EvalScope or its dependencies, and composes
them as EvalScope's CoinFlip adapter does (extract, else the whole reply; then the verdict with
lower-case exact answers allowed). Then compares verdicts on the reply table of the tests (printed
as Markdown with --table) and on random replies built from marker, verdict and markup fragments.
Exit 0 when every verdict agrees, 1 otherwise.
"""

import argparse
import random
import sys
import types
import zipfile
from collections.abc import Callable

from ..benchmarks.coin_flip import parse_answer

PIECES = [
    "ANSWER:", "answer :", "Answer:", "**ANSWER:**", "ANSWERS:", "ANSWER: **", "**", "*", " ", "\n", "\r\n", "\t",
    "YES", "NO", "Yes", "No", "yes", "no", "yEs", "nO", "yes.", "no!", "Not", "know", "Yesterday", "_YES_",
    "[NO]", "`YES`", ".", "!", ",", "the coin is heads up", "so", "(no flips)", "MAYBE", "é", "Nö", "YESNO",
]  # fmt: skip


def reference(wheel: str) -> Callable[[str], str | None]:
    """EvalScope's CoinFlip verdict function, built from the wheel's own modules."""
    with zipfile.ZipFile(wheel) as z:
        sources = {name: z.read(f"evalscope/utils/{name}.py").decode() for name in ("multi_choices", "yes_no")}
    stub = types.ModuleType("evalscope.api.evaluator")  # what multi_choices imports for its other functions
    for name in ("Choices", "Target", "TaskState"):
        setattr(stub, name, type(name, (), {}))
    saved = {k: sys.modules.get(k) for k in ("evalscope", "evalscope.api", "evalscope.api.evaluator")}
    sys.modules.update({"evalscope": types.ModuleType("evalscope"), "evalscope.api": types.ModuleType("a")})
    sys.modules["evalscope.api.evaluator"] = stub
    try:
        modules = {}
        for name, source in sources.items():
            module = types.ModuleType(f"evalscope.utils.{name}")
            exec(compile(source, f"{wheel}!evalscope/utils/{name}.py", "exec"), module.__dict__)
            modules[name] = module
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    extract, verdict = modules["multi_choices"].extract_answer_line, modules["yes_no"].extract_verdict

    def coin_flip(prediction: str) -> str | None:
        answer = extract(prediction)  # CoinFlipAdapter.extract_answer
        filtered = answer if answer is not None else prediction
        return verdict(filtered or "", allow_lowercase_exact=True)  # match_score and aggregate_scores

    return coin_flip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("wheel", help="an EvalScope wheel (e.g. evalscope-1.14.1-py3-none-any.whl)")
    parser.add_argument("--random", type=int, default=200_000, help="random replies to compare (default 200,000)")
    parser.add_argument("--table", action="store_true", help="print the table's verdicts as Markdown")
    args = parser.parse_args(argv)
    theirs = reference(args.wheel)
    try:
        from tests.test_coin_flip_parse import TABLE  # run from the project folder
    except ImportError:
        TABLE = []
    ok = True
    agree = sum(parse_answer(reply) == theirs(reply) == spec for reply, spec, _, _ in TABLE)
    print(f"reply table: {len(TABLE)} shapes; evalpipe, EvalScope and the SPEC column agree on {agree}")
    ok &= agree == len(TABLE)
    if args.table:
        print("\n| reply | SPEC | EvalScope 1.14.1 | evalpipe evalscope | evalpipe strict |\n|---|---|---|---|---|")
        for reply, spec, _, _ in TABLE:
            shown = reply.replace("\r", "\\r").replace("\n", "\\n").replace("|", "\\|")
            verdicts = (spec, theirs(reply), parse_answer(reply), parse_answer(reply, "strict"))
            print(f"| `` {shown} `` | " + " | ".join(map(str, verdicts)) + " |")
        print()
    rng, differ = random.Random(17), []
    for _ in range(args.random):
        reply = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 9)))
        if parse_answer(reply) != theirs(reply):
            differ.append(reply)
    print(
        f"random replies: {args.random:,}; disagreements: {len(differ)}" + (f", e.g. {differ[:3]!r}" if differ else "")
    )
    return 0 if ok and not differ else 1


if __name__ == "__main__":
    sys.exit(main())

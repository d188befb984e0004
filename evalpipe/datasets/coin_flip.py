"""A seeded generator of CoinFlip data in the format of `extraordinarylab/coin-flip`, calibrated so that the test
split in the zero-shot template matches the real data's recorded statistics (TARGETS). Same seed, same bytes.

    python -m evalpipe.datasets.coin_flip --out data/coin_flip
"""

import argparse
import random
import statistics
from pathlib import Path

import orjson

from ..store import jsonl

NAMES_FILE = Path(__file__).with_name("names.txt")
SPLITS = {"test": (3333, 20240601), "validation": (1333, 20240602)}  # rows, seed
PEOPLE_WEIGHTS = {2: 0.38, 3: 0.05, 4: 0.57}
TARGETS = {"mean": 500.15, "std": 28.32, "min": 453, "max": 551, "yes_share": 0.51}


def load_names() -> list[str]:
    lines = NAMES_FILE.read_text(encoding="utf-8").splitlines()
    return list(dict.fromkeys(name for line in lines if not line.startswith("#") for name in line.split()))


def generate(count: int, seed: int, names: list[str]) -> list[dict]:
    rng = random.Random(seed)
    pool = [n for n in names if len(n) >= 4]
    weights = [len(n) ** 3.0 for n in pool]  # the real pool's names are long
    sizes, size_weights = list(PEOPLE_WEIGHTS), list(PEOPLE_WEIGHTS.values())
    rows = []
    for _ in range(count):
        n = rng.choices(sizes, size_weights)[0]
        people: list[str] = []
        while len(people) < n:
            name = rng.choices(pool, weights)[0]
            if name not in people:
                people.append(name)
        flips = [rng.random() < 0.5 for _ in range(n)]
        want_even = rng.random() < TARGETS["yes_share"]
        if (sum(flips) % 2 == 0) != want_even:
            k = rng.randrange(n)
            flips[k] = not flips[k]
        answer = "yes" if sum(flips) % 2 == 0 else "no"  # computed from the flips, never drawn
        acts = "".join(
            f" {name} flips the coin." if flip else f" {name} does not flip the coin."
            for name, flip in zip(people, flips)
        )
        rows.append({"question": f"Q: A coin is heads up.{acts}  Is the coin still heads up?", "answer": answer})
    return rows


def prompt_statistics(rows: list[dict]) -> dict:
    from ..benchmarks.coin_flip import ZERO_SHOT

    lengths = [len(ZERO_SHOT.format(question=r["question"])) for r in rows]
    return {
        "mean": statistics.fmean(lengths),
        "std": statistics.pstdev(lengths),
        "min": min(lengths),
        "max": max(lengths),
        "yes_share": sum(r["answer"] == "yes" for r in rows) / len(rows),
    }


def write_splits(out_dir: Path) -> dict[str, dict]:
    names = load_names()
    report = {}
    for split, (count, seed) in SPLITS.items():
        rows = generate(count, seed, names)
        jsonl.atomic_write(out_dir / f"{split}.jsonl", b"".join(orjson.dumps(r) + b"\n" for r in rows))
        report[split] = prompt_statistics(rows)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description="Write the seeded CoinFlip test and validation splits.")
    parser.add_argument("--out", type=Path, default=Path("data/coin_flip"), help="folder for the splits")
    args = parser.parse_args()
    report = write_splits(args.out)
    print(f"names in the pool: {len(load_names())}")
    for split in report:
        print(f"{split}: {SPLITS[split][0]} rows → {args.out / (split + '.jsonl')}")
    test = report["test"]
    print("zero-shot prompt length of the test split, measured vs recorded:")
    for key in ("mean", "std", "min", "max"):
        print(f"  {key:5} {test[key]:8.2f}   target {TARGETS[key]}")
    print(f"  YES share {100 * test['yes_share']:.1f}%   target {100 * TARGETS['yes_share']:.0f}%")


if __name__ == "__main__":
    main()

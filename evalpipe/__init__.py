"""evalpipe: a resumable JSONL pipeline for benchmarking language models."""

import importlib.util
import os
import sys

__version__ = "0.1.0"

# requirements.txt, by import name. Checked here, the first import of every stage script and of
# `python -m evalpipe.<module>`, so that a python without them gets one line instead of a traceback.
# This file must stay importable by any python 3 (no newer syntax).
DEPENDENCIES = ("openai", "orjson", "tenacity", "tqdm")


def _program():
    """The name to print and the arguments that start this program again (the script, or -m module)."""
    first = sys.argv[0] if sys.argv else ""
    if first == "-m":  # python -m evalpipe.x: argv[0] is "-m" while the module is being looked for
        argv = getattr(sys, "orig_argv", [])
        module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "evalpipe"
        return module, ["-m", module]
    if first in ("", "-c"):  # imported from the interactive prompt or python -c
        return "evalpipe", []
    return os.path.basename(first), [first]


def _require_dependencies():
    missing = [name for name in DEPENDENCIES if importlib.util.find_spec(name) is None]
    if not missing:
        return
    venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv", "bin")
    if not os.path.relpath(venv).startswith(".."):  # shown relative only below the current folder
        venv = os.path.relpath(venv)
    name, command = _program()
    print(
        f"{name}: the pipeline's dependencies ({', '.join(missing)}) are not installed for {sys.executable}; "
        f"run it with the project's environment: {' '.join([os.path.join(venv, 'python')] + command)} ... "
        f"(or `. {os.path.join(venv, 'activate')}`); `make install` creates it",
        file=sys.stderr,
    )
    raise SystemExit(2)


_require_dependencies()

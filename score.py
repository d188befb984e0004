#!/usr/bin/env python3
"""Stage 3: one run's metrics (solving rate overall and per category, coverage, tokens)."""

import sys

from evalpipe.errors import run_stage
from evalpipe.stages.score import main

if __name__ == "__main__":
    sys.exit(run_stage("score", main))

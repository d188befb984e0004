#!/usr/bin/env python3
"""Stage 4: mean ± std over runs 1..N of every model of a benchmark, as Markdown, CSV and JSON."""

import sys

from evalpipe.errors import run_stage
from evalpipe.stages.aggregate import main

if __name__ == "__main__":
    sys.exit(run_stage("aggregate", main))

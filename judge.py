#!/usr/bin/env python3
"""Stage 2: grade every inference row not yet judged (an LLM with rubrics, or a rule)."""

import sys

from evalpipe.errors import run_stage
from evalpipe.stages.judge import main

if __name__ == "__main__":
    sys.exit(run_stage("judge", main))

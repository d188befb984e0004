#!/usr/bin/env python3
"""Stage 1: the model answers every selected task that has no row yet (resumable by task id)."""

import sys

from evalpipe.errors import run_stage
from evalpipe.stages.infer import main

if __name__ == "__main__":
    sys.exit(run_stage("infer", main))

import sys

from ...errors import run_stage
from . import main

if __name__ == "__main__":
    sys.exit(run_stage("viewer", main))

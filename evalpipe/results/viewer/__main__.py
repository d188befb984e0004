import sys

from ... import cli
from . import main

if __name__ == "__main__":
    sys.exit(cli.run_stage("viewer", main))

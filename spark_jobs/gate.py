"""spark-submit entry point: the gate step for one slice (see slicewise.jobs)."""

import sys

from slicewise.jobs import main

if __name__ == "__main__":
    sys.exit(main("gate", sys.argv[1:]))

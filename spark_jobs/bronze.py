"""spark-submit entry point: the bronze step for one slice (see slicewise.jobs)."""

import sys

from slicewise.jobs import main

if __name__ == "__main__":
    sys.exit(main("bronze", sys.argv[1:]))

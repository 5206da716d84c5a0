"""spark-submit entry point: the publish step for one slice (see slicewise.jobs)."""

import sys

from slicewise.jobs import main

if __name__ == "__main__":
    sys.exit(main("publish", sys.argv[1:]))

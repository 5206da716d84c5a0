"""spark-submit entry point: a pipeline's table maintenance (see slicewise.maintenance)."""

import sys

from slicewise.jobs import main

if __name__ == "__main__":
    sys.exit(main("maintain", sys.argv[1:]))

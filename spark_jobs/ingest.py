"""spark-submit entry point: the ingest step (bronze and silver from one Kafka read) for
one slice (see slicewise.jobs)."""

import sys

from slicewise.jobs import main

if __name__ == "__main__":
    sys.exit(main("ingest", sys.argv[1:]))

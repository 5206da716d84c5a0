"""spark-submit entry point: replay a slice's quarantined records after a fix."""

import sys

from slicewise.jobs import main

if __name__ == "__main__":
    sys.exit(main("replay-quarantine", sys.argv[1:]))

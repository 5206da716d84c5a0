"""`python -m slicewise.preloaded_scheduler [ARGS]`: `airflow scheduler [ARGS]` with the steps'
libraries already imported.

With the LocalExecutor every task runs in a process forked from the scheduler
(through the executor's worker processes), and a fork inherits every module its
parent had imported. Otherwise a gate task spends about 4 s importing Great
Expectations and every Spark step about 1 s importing the Spark Connect client
before it does any work: for an hourly slice of a few thousand events, most of the
task. Imported once here, those seconds leave every task. With another executor
(Celery, Kubernetes) tasks start elsewhere and this changes nothing.

Nothing here opens a connection, a session or a thread, so a fork inherits only
loaded code. As with Airflow's plugins, the code is that of the scheduler's start:
restart the scheduler after upgrading slicewise.
"""

from __future__ import annotations

import importlib
import sys

# What a task of the DAG imports beyond Airflow's scheduler itself, heaviest first.
PRELOAD = (
    "slicewise.gate",  # Great Expectations, pandas
    "slicewise.jobs",  # pyspark
    "pyspark.sql.connect.session",  # the Spark Connect client: grpc, pyarrow
    "slicewise.operators",  # the Spark provider's operators
    "slicewise.silver",
    "slicewise.bronze",
    "slicewise.publish",
    "slicewise.planner",
)


def preload() -> None:
    for module in PRELOAD:
        importlib.import_module(module)


def main() -> None:
    preload()
    from airflow.__main__ import main as airflow

    sys.argv = ["airflow", "scheduler", *sys.argv[1:]]
    airflow()


if __name__ == "__main__":
    main()

"""spark-submit's applications, one per step (each runs `slicewise.jobs.main`). Installed
with the package as `slicewise.spark_jobs`, so a DAG file outside this checkout finds
them (`slicewise.jobs.application`)."""

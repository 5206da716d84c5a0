# One image for every slicewise container in docker-compose.yml: the Airflow
# components (whose tasks run spark-submit as the Spark driver) and the Spark
# standalone master and workers (executors). Same Python, same pyspark, same jars
# everywhere, from the same lock file as .venv.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven procps tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/slicewise
ENV SLICEWISE_CACHE_DIR=/opt/slicewise/cache \
    PYSPARK_PYTHON=/usr/local/bin/python \
    PYARROW_IGNORE_TIMEZONE=1

COPY requirements.txt requirements-dev.txt constraints.txt pyproject.toml ./
COPY include ./include
# The pipeline definitions: one DAG per pipeline (mount your own over it, or set
# SLICEWISE_PIPELINES_FILE).
COPY pipelines.yaml ./
RUN pip install --no-cache-dir -r requirements.txt -c constraints.txt -e .

# Delta and the Kafka connector, resolved from Maven Central at build time so
# containers start without network access to it.
COPY scripts ./scripts
RUN python -c "from slicewise.spark import spark_jars; print(len(spark_jars()), 'jars')"

COPY dags ./dags
COPY spark_jobs ./spark_jobs

ENTRYPOINT ["/usr/bin/tini", "--"]

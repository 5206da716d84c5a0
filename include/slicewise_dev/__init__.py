"""The dev stack: what the demo, the tests and the bench run around the pipeline.

A local Kafka broker (KRaft, transactions), a proxy that drops acks, the event source
with its oracle, the demo, a Spark standalone-cluster launcher and the Airflow
environment of the demo. No module of the `slicewise` package imports this one
(tests/unit/test_import_graph.py), so a deployment needs none of it.
"""

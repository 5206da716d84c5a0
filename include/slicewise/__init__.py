"""slicewise: exactly-once Kafka -> Delta slices, orchestrated by Airflow."""

__version__ = "0.1.0"

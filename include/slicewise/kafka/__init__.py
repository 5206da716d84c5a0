"""Kafka as the pipeline sees it: the source topic's offsets and the clients' security settings."""

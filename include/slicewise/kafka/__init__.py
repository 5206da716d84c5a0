"""Kafka helpers: offsets of the source topic and the local broker for tests and the demo."""

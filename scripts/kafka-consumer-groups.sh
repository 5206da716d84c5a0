#!/usr/bin/env bash
# Kafka's own consumer-group tool, the class the Kafka distribution's
# bin/kafka-consumer-groups.sh runs, on the Kafka jars the dev stack caches from Maven
# Central (scripts/kafka/pom.xml). For example:
#   scripts/kafka-consumer-groups.sh --bootstrap-server 127.0.0.1:19092 --describe --group slicewise.events
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
libs="$("$root/.venv/bin/python" -m slicewise_dev.broker jars)"
java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
exec "$java" -Xmx256m -cp "$libs/*" org.apache.kafka.tools.consumer.group.ConsumerGroupCommand "$@"

"""Tables and the topic named as OpenLineage's naming spec names datasets."""

from __future__ import annotations

import pytest

from slicewise.lineage import table_dataset


@pytest.mark.parametrize(
    ("location", "dataset"),
    [
        ("/data/lake/events/silver", ("file", "/data/lake/events/silver")),
        ("file:///data/lake/events/silver", ("file", "/data/lake/events/silver")),
        ("s3a://lake/prod/events/silver", ("s3://lake", "prod/events/silver")),
        ("s3://lake/prod/events/silver/", ("s3://lake", "prod/events/silver")),
        ("gs://lake/events/gold_events_per_hour", ("gs://lake", "events/gold_events_per_hour")),
        (
            "abfss://tables@acct.dfs.core.windows.net/events/bronze",
            ("abfss://tables@acct.dfs.core.windows.net", "events/bronze"),
        ),
    ],
)
def test_a_table_location_becomes_a_namespace_and_a_name(location, dataset):
    assert table_dataset(location) == dataset

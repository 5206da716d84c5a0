"""Publication walks silver's commits above the last published version (issue 93,
finding 10). Delta's log cleanup removes commits older than `delta.logRetentionDuration`
below a checkpoint; when that cuts above the last publication (a failed gate left
unrepaired that long, every publication since refused), the walk would start above
the cut and never meet the failed slice's commit, publishing its rows. It is refused
now, naming the missing versions, until on-call accepts it by hand."""

from __future__ import annotations

import pytest

from slicewise.commits import HistoryTruncated, commits_above

pytestmark = pytest.mark.integration


def test_a_log_cleaned_up_above_the_last_publication_is_refused_until_accepted(spark, tmp_path):
    path = str(tmp_path / "silver")
    for v in range(12):  # versions 0-11; Delta checkpoints at 10 (checkpointInterval)
        (
            spark.range(v, v + 1)
            .write.format("delta")
            .mode("append")
            .option("userMetadata", f"slicewise slices=s{v} attempt=a{v}")
            .save(path)
        )
    log = tmp_path / "silver" / "_delta_log"
    assert (log / f"{10:020d}.checkpoint.parquet").exists()
    for v in range(10):  # what the cleanup deletes: the commits the checkpoint covers
        (log / f"{v:020d}.json").unlink()
        (log / f"{v:020d}.crc").unlink(missing_ok=True)

    with pytest.raises(HistoryTruncated, match=r"no longer holds versions 3-9") as refused:
        commits_above(spark, path, 2)
    assert "--accept-truncated-history" in str(refused.value)
    accepted = commits_above(spark, path, 2, accept_truncated=True)
    assert [(c.version, c.slices) for c in accepted] == [(10, ("s10",)), (11, ("s11",))]
    # A floor the log still reaches is walked as before.
    assert [c.version for c in commits_above(spark, path, 9)] == [10, 11]

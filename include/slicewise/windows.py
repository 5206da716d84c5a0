"""A slice's reach in silver: the event dates its MERGE may touch, and silver's rows there.

The reach is the slice's own event dates (from its recorded `slice_ids`) widened by
the dedup horizon, plus the far dates: the dates beyond them where another slice
recorded a copy of one of its keys (`far_dates`). The MERGE looked at no other
partition, so the gate proves and publish rebuilds only within the reach, at a cost
that follows the slice, not silver, and the copies of a key end as one row whatever
their event times and whatever order their slices ran in.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from slicewise import key_index
from slicewise.config import Settings
from slicewise.schemas import silver_schema, slice_ids_schema
from slicewise.tables import of_slice, read_table
from slicewise.transforms import event_date_span, horizon_ranges

Window = tuple[date, date]


@dataclass(frozen=True)
class Reach:
    """Silver's event dates a slice's MERGE looks at: its `window` (its own dates widened
    by the horizon; where they lie apart, the widest range of them) and the `far` dates
    beyond it (single dates: its own outlying dates and other slices' copies of its keys;
    usually none)."""

    window: Window
    far: tuple[date, ...] = ()

    def ranges(self) -> list[Window]:
        """The window, then the far dates beyond it, consecutive ones as one range."""
        lo, hi = self.window
        runs: list[Window] = []
        for d in sorted(d for d in set(self.far) if not lo <= d <= hi):
            if runs and d == runs[-1][1] + timedelta(days=1):
                runs[-1] = (runs[-1][0], d)
            else:
                runs.append((d, d))
        return [self.window, *runs]

    def sql(self, column: str) -> str:
        """The reach as a SQL predicate on a date column (partition-pruned)."""
        return (
            "("
            + " OR ".join(
                f"{column} BETWEEN DATE'{lo.isoformat()}' AND DATE'{hi.isoformat()}'"
                for lo, hi in self.ranges()
            )
            + ")"
        )

    def column(self, name: str = "event_date") -> Column:
        ranges = [F.col(name).between(F.lit(lo), F.lit(hi)) for lo, hi in self.ranges()]
        predicate = ranges[0]
        for r in ranges[1:]:
            predicate = predicate | r
        return predicate

    def widened(self, lo: date, hi: date) -> Reach:
        return Reach((min(self.window[0], lo), max(self.window[1], hi)), self.far)

    def describe(self) -> str:
        lo, hi = self.window
        far = f" and {', '.join(d.isoformat() for d in self.far)}" if self.far else ""
        return f"{lo.isoformat()}..{hi.isoformat()}{far}"

    def record(self) -> dict:
        """The reach as the ledger keeps it (`of_record` reads it back)."""
        return {
            "window": [d.isoformat() for d in self.window],
            "far_dates": [d.isoformat() for d in self.far],
        }

    @staticmethod
    def of_record(record: dict | None) -> Reach | None:
        if record is None:
            return None
        lo, hi = (date.fromisoformat(d) for d in record["window"])
        return Reach((lo, hi), tuple(date.fromisoformat(d) for d in record["far_dates"]))


def recorded_ids(spark: SparkSession, settings: Settings, slice_id: str) -> DataFrame:
    """The slice's valid keys as silver recorded them (`slice_ids`)."""
    return of_slice(
        spark, settings.table("slice_ids"), slice_ids_schema(settings.pipeline), slice_id
    )


def own_reach(span: Row | None, settings: Settings) -> Reach | None:
    """The dates a slice reaches by its own events (`event_date_span`'s `dates`), each
    widened by the horizon: the widest range of them as the window, the dates of any
    other as far dates. None when it has no event."""
    if span is None or span["first"] is None:
        return None
    ranges = horizon_ranges(span["dates"], settings.dedup_horizon_days)
    widest = max(ranges, key=lambda r: (r[1] - r[0], r[1]))
    outlying = (
        lo + timedelta(days=n)
        for lo, hi in ranges
        if (lo, hi) != widest
        for n in range((hi - lo).days + 1)
    )
    return Reach(widest, tuple(outlying))


def far_dates(
    spark: SparkSession, settings: Settings, keys: DataFrame, window: Window
) -> tuple[date, ...]:
    """The event dates outside `window` where any slice recorded a copy of one of `keys`
    as its survivor: where silver may store such a key's row (it holds the copy of one
    of those slices). Almost always no date.

    A slice's ids commit before its MERGE looks here (`silver.write_slice`), so of two
    slices racing with copies of a key far apart, the later lookup finds the other's
    date, and its MERGE then reads that partition: Delta fails it if the other's MERGE
    wrote there meanwhile, and the retry finds the row. The other MERGE may commit
    last, never having read this date: `silver.settle_far_copies` looks again after
    it.

    The key index (`key_index`), once maintenance built it, answers the same at a cost
    that follows the slice; without one this scans `slice_ids`."""
    indexed = key_index.lookup(spark, settings, keys, window)
    return scanned_far_dates(spark, settings, keys, window) if indexed is None else indexed


def scanned_far_dates(
    spark: SparkSession, settings: Settings, keys: DataFrame, window: Window
) -> tuple[date, ...]:
    """`far_dates` from a scan of all of `slice_ids` (no key index yet)."""
    lo, hi = window
    key = list(settings.pipeline.key_columns)
    ids = read_table(spark, settings.table("slice_ids"), slice_ids_schema(settings.pipeline))
    rows = (
        ids.where(~F.col("event_date").between(F.lit(lo), F.lit(hi)))
        .join(keys.select(*key), key, "left_semi")
        .select("event_date")
        .distinct()
        .collect()
    )
    return tuple(sorted(r.event_date for r in rows))


def reach_of(
    spark: SparkSession, settings: Settings, keys: DataFrame, own: Reach | None
) -> Reach | None:
    """The reach of a slice's `keys`: `own` (the dates its events reach, `own_reach`)
    and the far dates where other slices recorded copies of them."""
    if own is None:
        return None
    found = far_dates(spark, settings, keys, own.window)
    return Reach(own.window, tuple(sorted(set(own.far) | set(found))))


def slice_reach(spark: SparkSession, settings: Settings, slice_id: str) -> Reach | None:
    """The reach of a slice's recorded ids, or None when it has no valid event."""
    ids = recorded_ids(spark, settings, slice_id)
    own = own_reach(event_date_span(ids).first(), settings)
    return reach_of(spark, settings, ids.select(*settings.pipeline.key_columns), own)


def silver_window(
    spark: SparkSession, settings: Settings, reach: Reach | None, version: int | None = None
) -> DataFrame:
    """Silver rows within a reach's event dates (partition-pruned); as of `version` when
    given (publication reads the version it proved verified)."""
    path, schema = settings.table("silver"), silver_schema(settings.pipeline)
    if version is None:
        silver = read_table(spark, path, schema)
    else:
        silver = spark.read.format("delta").option("versionAsOf", version).load(path)
    if reach is None:
        return silver.limit(0)
    return silver.where(reach.column())

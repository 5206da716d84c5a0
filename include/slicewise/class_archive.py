"""A class archive for the Spark drivers we start in-process (HotSpot's dynamic CDS).

A step run by hand in a driver of its own spends seconds before its first query on
loading and verifying the classes of Spark, Delta and the Kafka connector, and again
in every later JVM. Since Java 13 a JVM can write the classes it loaded to an archive
at exit (`-XX:ArchiveClassesAtExit`), and later JVMs map them instead
(`-XX:SharedArchiveFile`). `slicewise class-archive` writes it once per host (or
image) with a short Delta job; `get_spark` starts every later driver from it.

Writing is a step of its own because it is slow: the JVM that records its classes
runs its job more slowly, and then spends tens of seconds writing them at exit. An
archive belongs to one JDK, Spark and jar set, so its name carries their digest: a
driver finds none after an upgrade (and starts as before) until it is written again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from slicewise.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class ClassArchiveError(ConfigError):
    """No archive could be written; drivers start without one, as before."""


# HotSpot's class-sharing log goes to the JVM's stdout, where a step's JSON line goes.
QUIET = "-Xlog:cds*=off"


def java_binary(env: dict[str, str] | None = None) -> Path | None:
    """The `java` spark-submit starts: JAVA_HOME's, else the one on PATH."""
    env = os.environ if env is None else env
    if env.get("JAVA_HOME"):
        return Path(env["JAVA_HOME"]) / "bin" / "java"
    found = shutil.which("java", path=env.get("PATH"))
    return Path(found) if found else None


@dataclass(frozen=True)
class ClassArchive:
    """Where the archive of one JDK, Spark and jar set lives."""

    path: Path

    @classmethod
    def of(cls, cache_dir: Path, jars: Sequence[Path]) -> ClassArchive | None:
        """None when no JDK is found (Spark's own error then says so)."""
        import pyspark

        java = java_binary()
        if java is None or not java.exists():
            return None
        java = java.resolve()
        digest = hashlib.sha256()
        # A JDK update replaces the binary (new mtime); the class path the archive
        # records is Spark's jars, its conf folder (on the class path too) and ours.
        for part in (
            str(java),
            str(java.stat().st_mtime_ns),
            pyspark.__version__,
            os.environ.get("SPARK_CONF_DIR", ""),
            *map(str, jars),
        ):
            digest.update(part.encode() + b"\0")
        return cls(cache_dir / "jvm-classes" / f"driver-{digest.hexdigest()[:12]}.jsa")

    def driver_options(self) -> str | None:
        """The JVM options that start a driver from the archive; None when there is none."""
        return f"-XX:SharedArchiveFile={self.path} {QUIET}" if self.path.exists() else None

    def recording_options(self, partial: Path) -> str:
        """The JVM options that write its classes to `partial` at exit (errors to stderr:
        a non-empty folder on the class path, such as SPARK_CONF_DIR, prevents it)."""
        return f"-XX:ArchiveClassesAtExit={partial} {QUIET} -Xlog:cds=error:stderr"

    def keep(self, spark: SparkSession, partial: Path, wait: float = 600) -> Path:
        """Stop the recording driver, wait for its JVM to write `partial` and keep that
        as the archive (other JDK or jar sets' archives are removed)."""
        from pyspark import SparkContext

        proc = SparkContext._gateway.proc
        spark.stop()
        proc.stdin.close()  # the gateway's JVM exits when its stdin ends, and writes then
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise ClassArchiveError(
                f"the JVM did not write its class archive in {wait:.0f} s and was stopped; "
                "drivers start without one, as before. Run `slicewise class-archive` again "
                "when the host is less busy."
            ) from None
        if not partial.exists():
            raise ClassArchiveError(
                f"the JVM (exit code {proc.returncode}) wrote no class archive to {partial}: "
                "its error is above. A non-empty folder on the driver's class path (such as "
                "SPARK_CONF_DIR) prevents one; drivers start without it, as before."
            )
        partial.replace(self.path)  # atomic: a starting JVM sees the old file or the new
        for other in self.path.parent.glob("driver-*.jsa"):
            if other != self.path:
                other.unlink(missing_ok=True)
        return self.path


def exercise(spark: SparkSession, folder: Path) -> None:
    """What a step does in its first seconds, on a throwaway table: a Delta append, the
    history, a MERGE, a filtered aggregate and a partition overwrite."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    path = str(folder / "table")
    rows = spark.range(2_000).select(
        F.col("id").cast("string").alias("event_id"),
        F.to_date(F.lit("2026-01-01")).alias("event_date"),
        F.col("id").alias("offset"),
        F.to_json(F.struct(F.col("id").alias("n"))).alias("payload"),
    )
    rows.write.format("delta").partitionBy("event_date").save(path)
    table = DeltaTable.forPath(spark, path)
    table.history(1).collect()
    survivors = rows.dropDuplicates(["event_id"])
    (
        table.alias("t")
        .merge(survivors.alias("s"), "t.event_id = s.event_id AND t.event_date = s.event_date")
        .whenMatchedUpdateAll("s.offset < t.offset")
        .whenNotMatchedInsertAll()
        .execute()
    )
    stored = spark.read.format("delta").load(path)
    stored.where(F.col("event_date") == "2026-01-01").groupBy("event_date").agg(
        F.count("*"), F.countDistinct("event_id")
    ).collect()
    stored.join(survivors, "event_id", "left_anti").count()
    (
        stored.groupBy("event_date")
        .count()
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", "event_date = '2026-01-01'")
        .save(str(folder / "gold"))
    )


def write_archive(
    cache_dir: Path, jars: Sequence[Path], start: Callable[[str], SparkSession]
) -> tuple[Path, float]:
    """Record a driver's classes over `exercise` and keep them; `start(options)` starts
    the driver with those JVM options. The archive's path and the seconds it took."""
    archive = ClassArchive.of(cache_dir, jars)
    if archive is None:
        raise ClassArchiveError("no JDK found: set JAVA_HOME or put `java` on PATH")
    began = time.monotonic()
    archive.path.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.path.with_name(f"{archive.path.name}.{os.getpid()}.partial")
    try:
        spark = start(archive.recording_options(partial))
        with tempfile.TemporaryDirectory(prefix="slicewise-classes-") as folder:
            exercise(spark, Path(folder))
        return archive.keep(spark, partial), time.monotonic() - began
    finally:
        partial.unlink(missing_ok=True)

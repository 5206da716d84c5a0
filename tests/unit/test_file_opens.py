"""The kernel's count of the files a process opens (`slicewise_dev.file_opens`), which
the bounded-reads test relies on to see a Spark Connect server's reads."""

from __future__ import annotations

import subprocess
import sys

from slicewise_dev.file_opens import FileOpens


def test_file_opens_counts_another_process_reads(tmp_path):
    """The counter itself: the files another process opens in a watched folder count,
    each once however often it is opened; those in other folders do not."""
    watched, other = tmp_path / "watched", tmp_path / "other"
    watched.mkdir(), other.mkdir()
    for folder in (watched, other):
        (folder / "a.json").write_text("{}")
    (watched / "b.json").write_text("{}")
    paths = [watched / "a.json", watched / "b.json", watched / "a.json", other / "a.json"]
    reader = f"for p in {[str(p) for p in paths]!r}: open(p).read()"
    with FileOpens([watched]) as opens:
        subprocess.run([sys.executable, "-c", reader], check=True)
    assert opens.count(watched) == 2
    assert opens.count(watched, (".parquet",)) == 0

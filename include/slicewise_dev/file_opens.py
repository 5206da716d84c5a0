"""The files any process on this host opens in a few folders, named by the kernel.

    with FileOpens([table / "_delta_log"]) as opens:
        run_gate(spark, settings, slice_id)      # the Connect server's reads count too
    opens.count(table / "_delta_log")            # distinct files opened there meanwhile

Linux's inotify (IN_OPEN) through libc, so it sees the reads of another process, such
as a Spark Connect server's, that no client-side metric reports. A folder's own files
only (not its subfolders). It counts distinct files, not opens: the kernel merges an
open into the previous event when that is the same file's and not read yet.
"""

from __future__ import annotations

import ctypes
import os
import struct
from pathlib import Path
from types import TracebackType

IN_OPEN = 0x20
IN_Q_OVERFLOW = 0x4000
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of name


class FileOpens:
    def __init__(self, folders: list[Path]) -> None:
        self.folders = [Path(f) for f in folders]
        self.opened: dict[Path, set[str]] = {f: set() for f in self.folders}
        self._libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self._fd = -1
        self._watches: dict[int, Path] = {}

    def __enter__(self) -> FileOpens:
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        for folder in self.folders:
            wd = self._libc.inotify_add_watch(self._fd, str(folder).encode(), IN_OPEN)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {folder}")
            self._watches[wd] = folder
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            self._drain()
        finally:
            os.close(self._fd)

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                return
            at = 0
            while at < len(data):
                wd, mask, _, size = EVENT.unpack_from(data, at)
                name = data[at + EVENT.size : at + EVENT.size + size].rstrip(b"\0").decode()
                at += EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    raise RuntimeError("inotify's queue overflowed: opens were not all counted")
                if wd in self._watches and name:
                    self.opened[self._watches[wd]].add(name)

    def count(self, folder: Path, suffixes: tuple[str, ...] = ("",)) -> int:
        """The files opened in `folder` whose names end with one of `suffixes`."""
        return sum(1 for name in self.opened[Path(folder)] if name.endswith(suffixes))

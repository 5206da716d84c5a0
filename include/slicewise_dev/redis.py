"""Redis from Debian's package (`redis-server`): the Celery broker of the multi-host
test, on a free port of loopback or of `host` (slicewise_dev.netns's gateway), with a
password, nothing persisted; a context manager."""

from __future__ import annotations

import secrets
import shutil
import socket
from pathlib import Path

from slicewise.connect_server import port_open
from slicewise_dev.broker import free_ports
from slicewise_dev.process import Child, wait_until


class LocalRedis:
    def __init__(self, state_dir: Path, host: str = "127.0.0.1") -> None:
        self.state_dir = state_dir
        self.host = host
        (self.port,) = free_ports(1)
        self.password = secrets.token_hex(16)
        self._child: Child | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/{db}"

    def start(self, timeout: float = 30) -> None:
        server = shutil.which("redis-server")
        if server is None:
            raise RuntimeError(
                "redis-server not found: apt-get install redis-server (.ci/run does)"
            )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        conf = self.state_dir / "redis.conf"  # the password in a file, not on `ps`
        conf.write_text(
            f"bind {self.host}\nport {self.port}\nrequirepass {self.password}\n"
            f'dir {self.state_dir}\nsave ""\nappendonly no\n'
        )
        conf.chmod(0o600)
        self._child = Child([server, str(conf)], self.state_dir / "redis.log")
        wait_until(self._answers, [self._child], "redis-server", timeout, interval=0.2)

    def _answers(self) -> bool:
        if not port_open(self.port, self.host):
            return False
        answer = b""
        try:
            with socket.create_connection((self.host, self.port), timeout=2) as s:
                s.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                while b"+PONG" not in answer and b"-" not in answer:
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    answer += chunk
        except OSError:
            return False
        return b"+PONG" in answer

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
        self._child = None

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

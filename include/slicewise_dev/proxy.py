"""A loopback TCP proxy in front of a Kafka broker that loses produce acknowledgements.

It forwards bytes both ways and reads just enough of Kafka's framing (a 4-byte
size, then the request header's api key and correlation id) to recognise
Produce requests. For the first `drop_acks` of them it lets the request reach
the broker, which appends the batch, then swallows the broker's response and
cuts the connection: the producer never hears back and sends the batch again.
Without idempotence that second send is a duplicate in the log; with it the
broker recognises the sequence number and appends nothing.

The broker must advertise the proxy's port (LocalBroker(advertised_port=...)),
or clients would reconnect to the broker directly after the first metadata call.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

PRODUCE = 0  # Kafka api key


class DroppingProxy:
    def __init__(self, listen_port: int, target_port: int, drop_acks: int = 0) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.drop_acks = drop_acks
        self.dropped = 0
        self.produce_requests = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", listen_port))
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def lose_next_acks(self, n: int) -> None:
        """Swallow the responses to the next `n` Produce requests."""
        with self._lock:
            self.drop_acks = self.dropped + n

    def close(self) -> None:
        self._closed.set()
        self._server.close()

    def __enter__(self) -> DroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()  # the broker is not up yet: the client will retry
                continue
            broker.settimeout(None)
            doomed: set[int] = set()  # correlation ids whose responses must be lost
            threading.Thread(
                target=self._requests, args=(client, broker, doomed), daemon=True
            ).start()
            threading.Thread(
                target=self._responses, args=(broker, client, doomed), daemon=True
            ).start()

    def _requests(self, client: socket.socket, broker: socket.socket, doomed: set[int]) -> None:
        """Client -> broker, frame by frame, marking Produce requests whose ack is to be lost."""
        with contextlib.suppress(OSError):
            while frame := _read_frame(client):
                api_key, _version, correlation_id = struct.unpack(">hhi", frame[4:12])
                if api_key == PRODUCE:
                    with self._lock:
                        self.produce_requests += 1
                        if self.dropped + len(doomed) < self.drop_acks:
                            doomed.add(correlation_id)
                broker.sendall(frame)
        _close(client, broker)

    def _responses(self, broker: socket.socket, client: socket.socket, doomed: set[int]) -> None:
        """Broker -> client; a doomed response is swallowed and the connection cut."""
        with contextlib.suppress(OSError):
            while frame := _read_frame(broker):
                (correlation_id,) = struct.unpack(">i", frame[4:8])
                if correlation_id in doomed:
                    with self._lock:
                        doomed.discard(correlation_id)
                        self.dropped += 1
                    break
                client.sendall(frame)
        _close(client, broker)


def _read_frame(sock: socket.socket) -> bytes | None:
    """One size-prefixed Kafka frame (size included), or None at end of stream."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    body = _read_exactly(sock, struct.unpack(">i", head)[0])
    return None if body is None else head + body


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 65536))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()

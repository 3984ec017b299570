"""Spies on what redis-py clients send, read off the RESP commands their connections write."""

from __future__ import annotations

from typing import Any

import pytest
import redis

HANDSHAKE_COMMANDS = frozenset({"HELLO", "AUTH", "SELECT", "CLIENT"})
"""What a redis-py connection sends when it connects (not data commands)."""


def command_of(packed: bytes | list[bytes]) -> tuple[str, int]:
    """A RESP command as a connection sends it (``*<args>\\r\\n$<length>\\r\\n<NAME>...``,
    whole or in chunks) -> its name and argument count."""
    whole = packed if isinstance(packed, bytes) else b"".join(packed)
    head, length, rest = whole.split(b"\r\n", 2)
    return rest[: int(length[1:])].decode().upper(), int(head[1:]) - 1


def data_command(packed: bytes | list[bytes]) -> tuple[str, int] | None:
    """:func:`command_of` for a data command; ``None`` for a connection's handshake."""
    name, args = command_of(packed)
    return None if name in HANDSHAKE_COMMANDS else (name, args)


def spy_on_every_connection(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the data commands every redis-py connection sends from now on (for code
    that builds its own client)."""
    sent: list[str] = []
    real_send = redis.connection.AbstractConnection.send_packed_command

    def recording_send(self: Any, command: Any, check_health: bool = True) -> None:
        if (found := data_command(command)) is not None:
            sent.append(found[0])
        real_send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", recording_send)
    return sent


class CountingRedis(redis.Redis):
    """A Redis client that records the name and argument count of every data command its
    connections send, those its pool makes for others (the enricher's own) included; a
    connection's handshake (HELLO, AUTH, SELECT, CLIENT) is not recorded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands: list[str] = []
        self.key_counts: list[int] = []
        record = self._record

        class CountingConnection(self.connection_pool.connection_class):  # type: ignore[name-defined,misc]
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                record(command)
                super().send_packed_command(command, check_health)

        self.connection_pool.connection_class = CountingConnection

    def _record(self, packed: bytes | list[bytes]) -> None:
        if (found := data_command(packed)) is not None:
            self.commands.append(found[0])
            self.key_counts.append(found[1])

    def reset(self) -> None:
        self.commands.clear()
        self.key_counts.clear()

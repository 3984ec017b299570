"""Spies on what redis-py clients send, read off the RESP commands their connections write."""

from __future__ import annotations

from typing import Any

import redis

HANDSHAKE_COMMANDS = frozenset({"HELLO", "AUTH", "SELECT", "CLIENT"})
"""What a redis-py connection sends when it connects (not data commands)."""


def command_of(packed: bytes | list[bytes]) -> tuple[str, int]:
    """A RESP command as a connection sends it (``*<args>\\r\\n$<length>\\r\\n<NAME>...``,
    whole or in chunks) -> its name and argument count."""
    whole = packed if isinstance(packed, bytes) else b"".join(packed)
    head, length, rest = whole.split(b"\r\n", 2)
    return rest[: int(length[1:])].decode().upper(), int(head[1:]) - 1


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
        name, args = command_of(packed)
        if name not in HANDSHAKE_COMMANDS:
            self.commands.append(name)
            self.key_counts.append(args)

    def reset(self) -> None:
        self.commands.clear()
        self.key_counts.clear()

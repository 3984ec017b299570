"""The MGET request the enricher sends names the keys the feature store writes."""

from __future__ import annotations

import numpy as np
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.connectors.redis.feature_store import item_key, mget_request, user_key

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _packed_by_redis_py(prefix: str, users: list[int], items: list[int]) -> bytes:
    keys = [user_key(prefix, u) for u in users] + [item_key(prefix, i) for i in items]
    return b"".join(redis.Connection().pack_command("MGET", *keys))


@settings(max_examples=200, deadline=None)
@given(
    prefix=st.text(min_size=0, max_size=40),
    users=st.lists(INT64, max_size=30),
    items=st.lists(INT64, max_size=30),
)
def test_the_request_is_what_redis_py_sends_for_the_store_keys(
    prefix: str, users: list[int], items: list[int]
) -> None:
    request = mget_request(prefix, np.array(users, dtype=np.int64), np.array(items, dtype=np.int64))
    assert request == _packed_by_redis_py(prefix, users, items)


def test_digit_boundaries_and_a_long_prefix() -> None:
    edges = [0, 9, 10, 99, 100, 10**18, 2**63 - 1, -1, -10, -(2**63)]
    for prefix in ("sr", "p" * 1000):
        request = mget_request(prefix, np.array(edges, dtype=np.int64), np.array(edges[::-1]))
        assert request == _packed_by_redis_py(prefix, edges, edges[::-1])


def test_the_server_answers_it_in_key_order(redis_client: redis.Redis) -> None:
    redis_client.mset({user_key("fs", 5): b"u5", item_key("fs", -7): b"i-7"})
    connection = redis_client.connection_pool.make_connection()
    try:
        connection.send_packed_command(
            [mget_request("fs", np.array([5, 6]), np.array([-7], dtype=np.int64))]
        )
        assert connection.read_response() == [b"u5", None, b"i-7"]
    finally:
        connection.disconnect()

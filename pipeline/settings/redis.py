"""The ``[redis]`` section: where the feature store is, its timeouts, and the cache in front
of it."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from pipeline.settings.section import Section


class RedisSettings(Section):
    """Feature store location, timeouts and the in-process cache in front of it."""

    url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "sr"
    socket_timeout_ms: int = 200
    connect_timeout_ms: int = 200
    cache_ttl_s: float = 30.0
    cache_max_entries: int = 200_000
    retry_after_s: float = 1.0
    """After an outage, how long to serve defaults before trying Redis again."""
    max_value_bytes: int = 64 * 1024
    """A feature value longer than this is treated as missing (the defaults, flagged in
    ``fallback_features``) and never copied into the enricher's decode buffer."""
    ssl_ca_certs: str | None = None
    """CA certificate file (PEM) that signed the server's certificate, for a TLS
    (``rediss://``) URL; unset: the system's CAs. ``scripts/stack_up.sh --secure`` sets it."""

    @model_validator(mode="after")
    def _tls_settings_need_tls(self) -> RedisSettings:
        if self.ssl_ca_certs and not self.url.startswith("rediss://"):
            raise ValueError("redis.ssl_ca_certs needs a TLS URL (rediss://...)")
        return self

    def client_kwargs(self) -> dict[str, Any]:
        """What a Redis client needs besides the URL: the TLS settings (none for ``redis://``
        and ``unix://``).

        A TLS client always verifies the server's certificate and checks that it names the
        host of the URL, whatever the installed redis-py's defaults (before redis-py 6.0 it
        did not check the host name unless told to).

        Timeouts and retries are the caller's (the feature store's are short, a bulk loader's
        are not).

        Returns:
            Keyword arguments for ``redis.Redis.from_url(self.url, ...)``.

        Example::

            client = redis.Redis.from_url(settings.url, **settings.client_kwargs())
        """
        if not self.url.startswith("rediss://"):
            return {}
        tls: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if self.ssl_ca_certs:
            tls["ssl_ca_certs"] = self.ssl_ca_certs
        return tls

"""Keeping secrets out of output: which setting names hold secrets, and masking them.

Secrets are the SASL password, a password inside a URL (``redis://:pw@host``), and any client
setting whose name mentions password, secret, key, token, credential or auth
(``ssl.key.password``, ``sasl.oauthbearer.client.secret``, ``basic.auth.user.info``...).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_SECRET_NAME = re.compile(r"password|secret|key|token|credential|auth", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a setting called ``name`` may hold a secret.

    Example::

        is_secret_name("ssl.key.password")  # True
        is_secret_name("linger.ms")  # False
    """
    return bool(_SECRET_NAME.search(name))


def mask_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``.

    Example::

        mask_url("redis://:hunter2@127.0.0.1:6379/0")  # "redis://:***@127.0.0.1:6379/0"
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return MASK  # unparsable: print nothing of it
    if password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}"))

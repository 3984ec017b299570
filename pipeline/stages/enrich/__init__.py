"""The enrich stage: user and item features for a whole batch, in one Redis round trip.

``enricher`` looks every event's user and every row's item up (defaults and a fallback flag on a
miss or an outage); ``cache`` is the compiled TTL cache in front of Redis.
"""

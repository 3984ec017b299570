"""Kafka: ``clients`` holds the Protocols the stages depend on (producer, consumer), their
creation from ``[kafka]`` (``connect``: the real broker by default, fakes in unit tests), one
record's produce, commit results, and topic set-up; ``admin`` the admin client and the logger
every librdkafka client logs through; ``limits`` the input side's size limits.
"""

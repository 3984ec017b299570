"""Decode: consumed messages (a :class:`~pipeline.types.PolledBatch`) -> validated events as
columns, or a reject reason per message.

=================  ===================================================================
module             job
=================  ===================================================================
``compiled``       the built-in UserEvent: compiled kernels, fastavro for the exceptions
``configured``     any schema of the user's (``[events]``): fastavro, the feature map's
                   fields extracted into ``EventColumns.fields``
``messages``       what both do around their ``decode_values``: a poll's values in,
                   its messages kept with the events
=================  ===================================================================

Both answer :class:`~pipeline.types.DecodedMessages`; the loop is given one of them
(:mod:`pipeline.models.inputs`).
"""

from pipeline.stages.decode.compiled import MessageDecoder
from pipeline.stages.decode.configured import ConfiguredDecoder

__all__ = ["ConfiguredDecoder", "MessageDecoder"]

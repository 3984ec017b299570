"""Publish: one record per event of a scored batch to the output topic, then the batch's
checkpoint is sealed.

==================  ===================================================================
module              job
==================  ===================================================================
``sink``            produce the batch's records, each guarding the batch's checkpoint
``recommendation``  the built-in Recommendation: its compiled kernel
``configured``      an output schema of the user's (``[output]``): the compiled writer
``flags``           which feature groups of each event fell back to defaults
==================  ===================================================================
"""

from pipeline.stages.publish.flags import FallbackFlags, fallback_flags
from pipeline.stages.publish.sink import EncodedBatch, RecommendationSink

__all__ = ["EncodedBatch", "FallbackFlags", "RecommendationSink", "fallback_flags"]

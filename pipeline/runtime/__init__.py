"""The serving loop and what it decides: when to score, how a batch is processed, how work ends.

===================  ======================================================================
module               job
===================  ======================================================================
``loop``             :class:`~pipeline.runtime.loop.ScoringPipeline`: consume -> decode ->
                     batch -> decide -> process -> commit, one agreed step per iteration
``stepping``         the step decision: one stepper, alone or over a process group
``batch_policy``     when an open batch is due (as soon as the scorer is free, within a budget)
``budget_account``   how often a batch overran its latency budget, and the first cause
``processor``        a closed batch's path, one forward in flight, batches published in order
``steps``            the steps of one batch: enrich, features, forward + top-K, publish
``isolation``        poison isolation: bisect a failed batch, dead-letter what fails alone
``retrieve``         candidates for events that carry none (``[retrieval]``)
``drain``            finish, publish, commit: at the stop step and for revoked partitions;
                     a commit that waits for the group to settle; a rewind (exactly-once)
``idle``             when a member is idle (``--exit-when-idle``)
``rebalance``        the consumer's rebalance callbacks (they call the loop's drain)
``pausing``          the one owner of pausing the input
``backpressure``     a producer that waits for room and reports the wait
``model_swap``       swapping model versions between two steps
===================  ======================================================================

The path of one event through them: docs/architecture.md.
"""

"""Features: the ranker's input contract and how a batch becomes its input.

``spec`` (which features exist, table sizes, id hashing), ``columns`` (a micro-batch's features
as numpy columns, no torch), ``build`` (those columns -> dense tensor + KeyedJaggedTensor),
``model_input`` (that input, movable to any device), ``recent_items`` (the recent-items rule of
serving and training), ``segments`` (index arithmetic over per-segment counts).
"""

"""Avro on the wire: the UserEvent rules, compiled kernels, the fastavro reference codec, the
Confluent framing and schema registry.

=====================  ===================================================================
module                 job
=====================  ===================================================================
``rules``              what makes a UserEvent valid; status codes -> reject reasons
``kernels``            numba: many UserEvent bodies -> columns; Recommendations -> bytes
``reference``          fastavro: one message <-> one record (the reference; tools, tests)
``framing``            the Confluent wire format's header
``schema_registry``    schema files, writer schemas by id, registration
=====================  ===================================================================

The stages use these; none of them is a stage.
"""

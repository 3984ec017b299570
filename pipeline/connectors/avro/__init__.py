"""Avro on the wire: the UserEvent rules, compiled kernels (the built-in schemas', and the
walker and writer of any schema of the user's), the fastavro reference codec, the Confluent
framing and schema registry.

=====================  ===================================================================
module                 job
=====================  ===================================================================
``rules``              what makes a UserEvent valid; status codes -> reject reasons
``kernels``            numba: many UserEvent bodies -> columns; Recommendations -> bytes
``schema_fields``      a user's schema: fields by dotted path, classified
``program``            a user's event schema -> the walker's program (fields, raw spans)
``walker``             numba: many bodies of any schema -> the program's slots
``output_roles``       the roles of a user's output schema and the types they take
``write_program``      a user's output schema and its roles -> the writer's program
``writer``             numba: a batch's records of any output schema -> bytes
``reference``          fastavro: one message <-> one record (the reference; tools, tests)
``framing``            the Confluent wire format's header
``schema_registry``    schema files, writer schemas by id, registration
=====================  ===================================================================

The stages use these; none of them is a stage.
"""

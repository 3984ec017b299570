"""The served module: the contract any TorchRec ranker meets, and how streamrank builds it.

=================  ==================================================================
module             job
=================  ==================================================================
``types``          :class:`ModuleConfig`, tables, output (plain data, no torch)
``factory``        import the factory, build the collection from the tables, the module
``checks``         what the module holds; a trial forward (dense width, output shape)
``weights``        a plain ``state_dict`` file: read, strip a prefix, check, load
``output``         the module's output -> one ranking score per row
``store``          a module version directory: import a ``state_dict``, read its metadata
=================  ==================================================================

This package module imports nothing: configuration code imports :mod:`model.module.types`
without torch.
"""

"""The ``olmo_core`` framework (needs the ``olmo`` extra: ``ai2-olmo-core==3.0.0``)."""

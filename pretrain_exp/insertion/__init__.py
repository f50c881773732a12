"""The insertion engine: items (:mod:`.sources`), positions (:mod:`.placement`), the :class:`.plan.Plan`, the
verifier (:mod:`.verify`)."""

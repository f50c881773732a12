"""The ``hf`` framework (transformers.Trainer)."""

"""The bottom layer: errors, atomic file I/O, distributed helpers, name registries, plugin capabilities and the
protocols the layers above implement. Imports nothing of the project above it (no torch or transformers either)."""

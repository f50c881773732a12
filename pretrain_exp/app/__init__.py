"""The application layer: the root config and its registration, cross-plugin validation, the experiment loop,
launch (in-process or torchrun), the torchrun worker and the command line. Nothing below imports it."""

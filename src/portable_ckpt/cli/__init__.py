"""The ``portable-ckpt`` command line."""

"""Benchmark harness of portable_ckpt (``python -m bench``; see bench/README.md)."""

"""Test helpers for backends and integrations (need the ``dev`` extra: pytest, hypothesis)."""

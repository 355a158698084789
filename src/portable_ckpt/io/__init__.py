"""Writer, committer, reader and version management (framework-neutral, no torch)."""

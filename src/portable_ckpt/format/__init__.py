"""The format model: dtypes, paths, naming, strict JSON, manifest records, schemas."""

"""The data model: tasks, outcomes, states, errors, backoff, ids, records and their encoding.

Pure Python over pydantic and msgpack: nothing here talks to Redis, and every
other room may import it (the bottom layer of the import-linter contracts in
pyproject.toml).
"""

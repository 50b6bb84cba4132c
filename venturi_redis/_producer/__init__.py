"""The producer side: ``Client``, ``Queue``, ``SyncClient``, ``ShardedQueue``, dedup merges, reads and admin.

What a web process or a script imports. It never imports the worker, the CLI
or the dashboard (an import-linter contract in pyproject.toml).
"""

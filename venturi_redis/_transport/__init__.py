"""Connections: URL dispatch, Cluster, Sentinel, durable mode, the enqueue lane, the blocking path.

Every reach into a private part of redis-py or asyncio lives in
``redispy.py``, each commented with what it relies on (docs/operations.md,
"Supported redis-py"). Imports ``_model`` only: ``_store`` sends its calls
through these connections.
"""

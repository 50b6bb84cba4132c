"""The worker side: ``Worker``, its per-queue runners, running handlers, and their endings.

``worker.py`` is the lifecycle, ``keeper.py`` the lease renewal, ``runner.py``
the claim loop, wake-ups and reclaim of one queue, ``execute.py`` one run of a
handler, which returns the run's ending as a value (``_model/endings.py``),
and ``completer.py`` writes the endings (through ``QueueStore.end_run``) with
the claims, many per round trip. Imports the producer side, never the CLI.
"""

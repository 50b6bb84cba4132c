"""The worker side: ``Worker``, its per-queue runners, running handlers, and their transitions.

``worker.py`` is the lifecycle, ``runner.py`` the claim loop, wake-ups, reclaim
and lease renewal of one queue, ``execute.py`` one run of a handler,
``transitions.py`` the script call that ends each run, ``committer.py`` the
batching of those calls. Imports the producer side, never the CLI.
"""

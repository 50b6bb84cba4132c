"""The storage shape: key names, the Lua scripts, and every script call's KEYS, ARGV and reply.

``keys.py`` names every key of a queue; ``scripts.py`` loads ``lua/`` and runs
a call by EVALSHA (EVAL after NOSCRIPT) on the pool or in a pipeline;
``calls.py`` builds each script's call and parses its reply, the one place to
look for "which script, with which keys"; ``prepare.py`` turns a task into an
enqueue's arguments. Imports only ``_model``.
"""

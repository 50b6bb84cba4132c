"""The storage shape: key names, the Lua scripts, and every script call's KEYS, ARGV and reply.

``keys.py`` names every key of a queue; ``scripts.py`` loads ``lua/``;
``calls.py`` (and its siblings ``calls_*.py``) builds each script's call and
parses its reply, the one place to look for "which script, with which keys";
``sender.py`` sends calls, by every path, with the scripts' errors mapped;
``store.py`` is a queue's ``QueueStore``, one method per script operation;
``prepare.py`` turns a task into an enqueue's arguments. Imports ``_transport``
and ``_model``; nothing outside this room reaches the scripts.
"""

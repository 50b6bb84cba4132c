"""A Django app of tasks shaped like django-tasks' own test tasks (its RQ and database backends' suites).

``tests/test_django.py`` holds ``VenturiBackend`` to what those backends are
expected to do with them. ``settings`` extends the example project's settings
with this app and a second backend alias, ``upstream`` (one attempt per task,
as Django's backends run them).
"""

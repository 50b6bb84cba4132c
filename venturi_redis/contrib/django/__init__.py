"""Django's Tasks framework on venturi: ``VenturiBackend`` and the ``venturi_worker`` command.

``TASKS = {"default": {"BACKEND": "venturi_redis.contrib.django.VenturiBackend",
"OPTIONS": {"url": "redis://...", "queue": "default"}}}``; add
``"venturi_redis.contrib.django"`` to INSTALLED_APPS for ``manage.py
venturi_worker``. Works with Django 6's ``django.tasks`` and with the
``django-tasks`` backport on Django 5.2 (``pip install 'venturi-redis[django]'``).
docs/integrations.md has the long form.
"""

from ._backend import VenturiBackend
from ._jobs import TaskCancelled

__all__ = ["TaskCancelled", "VenturiBackend"]

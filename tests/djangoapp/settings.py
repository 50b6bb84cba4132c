"""The example project's settings (``shop.settings``), with this app and the ``upstream`` backend."""

import os

from shop.settings import *  # noqa: F403
from shop.settings import INSTALLED_APPS, TASKS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.djangoapp"]

# A database, for transaction.atomic (the probe of enqueue inside a transaction).
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

# The Django queue names of the upstream backend: "default" and one more,
# named per test run so that runs sharing a redis-server never meet.
OTHER_QUEUE = os.environ.get("VENTURI_OTHER_QUEUE", "queue-1")

TASKS = {
    **TASKS,
    "upstream": {
        "BACKEND": "venturi_redis.contrib.django.VenturiBackend",
        "QUEUES": ["default", OTHER_QUEUE],
        "OPTIONS": {
            "url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            "queue": os.environ.get("VENTURI_UPSTREAM_QUEUE", "upstream"),
            "max_failures": 1,  # a failed task is FAILED at once, as on Django's own backends
        },
    },
}

"""Settings of the example project: the one part about venturi is ``TASKS``."""

import os

SECRET_KEY = "example-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
DATABASES: dict[str, dict[str, str]] = {}  # the tasks need none
INSTALLED_APPS = [
    "venturi_redis.contrib.django",  # manage.py venturi_worker
    "shop",
]

TASKS = {
    "default": {
        "BACKEND": "venturi_redis.contrib.django.VenturiBackend",
        # Django's queue names this backend accepts; "default" goes to OPTIONS' queue.
        "QUEUES": ["default", "reports"],
        "OPTIONS": {
            "url": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            "queue": os.environ.get("VENTURI_QUEUE", "shop"),
            "max_failures": 2,  # one retry after a failed run
        },
    }
}

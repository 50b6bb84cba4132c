"""The Django app: ``"venturi_redis.contrib.django"`` in INSTALLED_APPS adds ``manage.py venturi_worker``."""

from __future__ import annotations

from django.apps import AppConfig


class VenturiConfig(AppConfig):
    name = "venturi_redis.contrib.django"
    label = "venturi"
    verbose_name = "venturi_redis"

"""The project's tasks: plain functions under Django's ``@task``, enqueued from views."""

from __future__ import annotations

try:  # Django >= 6.0
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import TaskContext, task


@task(priority=10)
def send_welcome(email: str) -> str:
    """Sync: runs in a worker thread (its own database connection)."""
    if "@" not in email:
        raise ValueError(f"not an address: {email!r}")
    return f"welcomed {email}"


@task(queue_name="reports", takes_context=True)
async def count_words(context: TaskContext, text: str) -> dict[str, int]:
    """Async, on the "reports" queue, with Django's TaskContext (its attempt number)."""
    return {"words": len(text.split()), "attempt": context.attempt}

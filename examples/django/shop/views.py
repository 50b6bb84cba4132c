"""Views that enqueue tasks and read their results back through Django's TaskResult."""

from __future__ import annotations

import json

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from .tasks import count_words, send_welcome

TASKS = {"send_welcome": send_welcome, "count_words": count_words}


@csrf_exempt
@require_POST
def welcome(request: HttpRequest) -> JsonResponse:
    result = send_welcome.enqueue(json.loads(request.body)["email"])
    return JsonResponse({"result_id": result.id, "status": result.status}, status=202)


@csrf_exempt
@require_POST
def words(request: HttpRequest) -> JsonResponse:
    result = count_words.enqueue(text=json.loads(request.body)["text"])
    return JsonResponse({"result_id": result.id, "status": result.status}, status=202)


@require_GET
def result(request: HttpRequest, name: str, result_id: str) -> JsonResponse:
    res = TASKS[name].get_result(result_id)
    doc = {
        "status": res.status,
        "attempts": res.attempts,
        "errors": [e.exception_class_path for e in res.errors],
    }
    if res.status == "SUCCESSFUL":
        doc["return_value"] = res.return_value
    return JsonResponse(doc)

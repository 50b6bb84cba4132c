from django.urls import path

from . import views

urlpatterns = [
    path("welcome", views.welcome),
    path("words", views.words),
    path("results/<str:name>/<str:result_id>", views.result),
]

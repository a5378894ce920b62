from django.urls import path
from shop import views

urlpatterns = [
    path("enqueue/", views.enqueue),
    path("results/", views.results),
]

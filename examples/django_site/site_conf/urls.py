from django.urls import path
from reports import views

urlpatterns = [
    path("", views.home),
    path("start/<str:tenant>/", views.start),
    path("results/", views.results),
]

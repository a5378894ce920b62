"""Settings of the example: SQLite by default; DATABASE_URL-style switch by environment
(EXAMPLE_DB=postgresql or mariadb) to run the same project on a server."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "site_conf.urls"
INSTALLED_APPS = [
    "aiojobqueue.contrib.django",  # brings `manage.py aiojobqueue_worker`
    "reports",
]
MIDDLEWARE: list[str] = []
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
              "APP_DIRS": True, "DIRS": []}]

_db = os.environ.get("EXAMPLE_DB", "sqlite")
if _db == "postgresql":
    DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "test",
                             "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"}}
elif _db == "mariadb":
    import pymysql

    pymysql.install_as_MySQLdb()
    DATABASES = {"default": {"ENGINE": "django.db.backends.mysql", "NAME": "test",
                             "USER": "root", "HOST": "127.0.0.1", "PORT": "3306"}}
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                             "NAME": os.environ.get("EXAMPLE_SQLITE", BASE_DIR / "db.sqlite3"),
                             "OPTIONS": {"timeout": 30}}}

TASKS = {
    "default": {
        "BACKEND": "aiojobqueue.contrib.django.TaskBackend",
        "QUEUES": [],  # any queue name: each tenant is a queue, i.e. a fair-share group
        "OPTIONS": {
            "database": "default",  # the jobs live in Django's own database
            "prefix": os.environ.get("EXAMPLE_PREFIX", "ajq_"),
            "capacity": 8,  # tasks at once per worker process
        },
    },
}

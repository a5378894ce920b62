"""A real Django project for the backend's tests. The database under test comes from the
environment: AJQ_DJ_DB = sqlite | postgresql | mariadb (AJQ_DJ_SQLITE: the file),
AJQ_DJ_PREFIX the table prefix, AJQ_DJ_LOG the file task signals and tasks append to."""

import os

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "djsite.urls"
INSTALLED_APPS = ["aiojobqueue.contrib.django", "shop"]
MIDDLEWARE: list[str] = []

_db = os.environ.get("AJQ_DJ_DB", "sqlite")
if _db == "sqlite":
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                             "NAME": os.environ.get("AJQ_DJ_SQLITE", "/tmp/ajq_dj.db"),
                             "OPTIONS": {"timeout": 30}}}
elif _db == "postgresql":
    DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "test",
                             "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"}}
else:
    import pymysql

    pymysql.install_as_MySQLdb()  # Django's MySQL backend on PyMySQL (no mysqlclient here)
    DATABASES = {"default": {"ENGINE": "django.db.backends.mysql", "NAME": "test",
                             "USER": "root", "HOST": "127.0.0.1", "PORT": "3306"}}

_options = {
    "database": "default", "prefix": os.environ.get("AJQ_DJ_PREFIX", "ajqdj_"),
    "poll_interval": 0.05, "lease_ttl": 2.0, "heartbeat_interval": 0.4,
    "shutdown_timeout": 2.0, "retry_backoff": 0.01, "retry_backoff_max": 0.05,
    "capacity": 4,
}
TASKS = {
    "default": {"BACKEND": "aiojobqueue.contrib.django.TaskBackend", "QUEUES": [],
                "OPTIONS": _options},
    "strict": {"BACKEND": "aiojobqueue.contrib.django.TaskBackend",
               "QUEUES": ["default", "emails"], "OPTIONS": _options},
}
LOGGING = {"version": 1, "disable_existing_loggers": False}

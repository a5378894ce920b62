#!/usr/bin/env python
"""The example Django project: ``python manage.py runserver`` for the views,
``python manage.py aiojobqueue_worker`` for the tasks (see docs/django.md)."""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_conf.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

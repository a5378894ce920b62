#!/usr/bin/env python
"""The test Django project's manage.py (tests/contrib/test_django.py runs it)."""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djsite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)

"""The dialect seam: everything that differs between databases, and nothing else.

``base.py`` is the interface (``DialectOps``) with the objects the core runs a database's way
(a round strategy, a lease path, a write path, an insert path) and the helpers they share;
``sqlite.py``, ``mysql.py`` (MySQL 8 and MariaDB) and ``postgresql/`` implement it, and
``columns.py`` holds the column types and clock functions whose SQL differs by dialect.
"""

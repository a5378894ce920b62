"""``python -m aiojobqueue``: the same command line as the ``aiojobqueue`` script."""

from .cli import main

main()

"""Command line (placeholder until the CLI lands)."""


def main() -> None:
    raise SystemExit("the aiojobqueue command line is not built yet")

"""The serving side: the tick loop (loop.py), one round (rounds.py), the outcome pipeline
(outcomes.py), lease keeping and reclaim (leases.py), shutdown (shutdown.py), and how an
attempt is logged (report.py)."""

from .loop import Worker

__all__ = ["Worker"]

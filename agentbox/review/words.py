"""The words a review judges in, as strings: its verdicts, its notes' severities, its
stages. Here, without the review's model (pydantic) or review.stage: the terminal
and the page read them from a stored review, and `agentbox runs` tells a verdict
without building either (agentbox.review.model names them as before)."""

from __future__ import annotations

SEVERITIES = ("fix", "consider", "info")  # what to fix first, first
VERDICTS = ("pass", "warn", "fail")
STAGES = ("mix", "master")  # review.stage's StageName values (tests/test_cli_start.py)
FIRST_FIXES = " The first fix as a mix: "  # where stage.both_readings adds to the split sentence

"""The words a review judges in, as strings: its verdicts and its notes' severities.
Here, without the review's model (pydantic): the terminal and the page read them
from a stored review, and `agentbox runs` tells a verdict without building the
model (agentbox.review.model names them as before)."""

from __future__ import annotations

SEVERITIES = ("fix", "consider", "info")  # what to fix first, first
VERDICTS = ("pass", "warn", "fail")

"""The mix review's agent by the names its runs carry: its import string, and the
one it had before the review room (a run keeps the name it ran under). Strings
only: the terminal tells the review's runs apart by them without loading the
review's contract, which loads the engine (`agentbox runs` needs neither)."""

from __future__ import annotations

MIX_REVIEW = "agentbox.review.agent:mix_review"
FORMER_MIX_REVIEW = "agentbox.mix_review:mix_review"  # its name before the review room

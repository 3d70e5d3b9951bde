"""Optional prose notes from a language model.

When an OpenAI-compatible endpoint is configured (AGENTBOX_LLM_BASE_URL,
AGENTBOX_LLM_MODEL, AGENTBOX_LLM_API_KEY), the review's measurements are also sent
there for notes in prose; any failure falls back to the rule-based notes: the
model can never fail a run. The verdict stays the judge's.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass

import httpx

from agentbox.engine.agents import AgentContext
from agentbox.review.model import MixMetrics
from agentbox.review.profiles import Profile
from agentbox.review.settings import ReviewSettings

LLM_TIMEOUT_SECONDS = 30.0  # the whole call, at most
# Left of the run's own time limit after the call, to finish the review: the call
# is cut shorter when the run has less, so a slow model never times the run out.
LLM_RESERVE_SECONDS = 1.0
LLM_MAX_ANSWER_BYTES = 1 << 20


@dataclass(frozen=True)
class LlmSettings:
    base_url: str
    model: str
    api_key: str | None

    @classmethod
    def from_settings(cls, review: ReviewSettings) -> LlmSettings | None:
        """AGENTBOX_LLM_BASE_URL and _MODEL from the configuration; the key only ever
        from the environment (AGENTBOX_LLM_API_KEY)."""
        if not review.llm_base_url or not review.llm_model:
            return None
        return cls(review.llm_base_url.rstrip("/"), review.llm_model,
                   os.environ.get("AGENTBOX_LLM_API_KEY"))


async def llm_notes(llm: LlmSettings, m: MixMetrics, profile: Profile, project_id: str,
                    ctx: AgentContext) -> list[str] | None:
    """Prose notes from an OpenAI-compatible chat endpoint, or None on any failure."""
    metrics = m.model_dump(exclude={"short_term_lufs"})
    request = {
        "model": llm.model,
        "messages": [
            {"role": "system", "content": (
                "You are a mastering engineer. Write 3 to 6 short, specific review notes "
                "about this mix from its measurements. Answer with a JSON array of strings.")},
            {"role": "user", "content": json.dumps(
                {"project_id": project_id, "profile": profile.__dict__, "metrics": metrics})},
        ],
    }
    headers = {"Idempotency-Key": ctx.run_id}  # a retried run asks the same question once
    if llm.api_key:
        headers["Authorization"] = f"Bearer {llm.api_key}"
    left = ctx.time_left()
    budget = LLM_TIMEOUT_SECONDS if left is None else min(LLM_TIMEOUT_SECONDS,
                                                          left - LLM_RESERVE_SECONDS)
    if budget <= 0:
        ctx.log.warning("no time left for LLM notes; using the rule-based notes")
        return None
    try:
        async with asyncio.timeout(budget), httpx.AsyncClient(
                timeout=budget, trust_env=False) as client, client.stream(
                "POST", f"{llm.base_url}/chat/completions", json=request,
                headers=headers) as response:
            response.raise_for_status()
            answer = bytearray()
            async for chunk in response.aiter_bytes():
                answer += chunk
                if len(answer) > LLM_MAX_ANSWER_BYTES:
                    raise ValueError("the answer is too large")
        content = json.loads(answer)["choices"][0]["message"]["content"]
        notes = json.loads(content)
        if not isinstance(notes, list) or not notes or not all(
                isinstance(n, str) and n.strip() for n in notes):
            raise ValueError("not a list of notes")
        return [n.strip()[:1000] for n in notes[:10]]
    except Exception as exc:  # the LLM is optional: never let it fail the run
        ctx.log.warning("LLM notes unavailable; using the rule-based notes",
                        extra={"error": type(exc).__name__})
        return None

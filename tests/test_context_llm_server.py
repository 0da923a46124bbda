"""A context-length refusal from a real llama.cpp server (tests/llm_server.py,
a small n_ctx) gets a shorter request, not a dead assistant (issue #14), on
llama-cpp-python's server and on llama-server. docs/llm-servers.md, "A
request longer than the context": llama-cpp-python answers a streamed
request over n_ctx 200 with an empty body and the provider's probe brings
back its 400; llama-server answers 400 at once."""

from __future__ import annotations

import io

import pytest

from llm_server import KINDS, LLAMA_SERVER, PYTHON_SERVER, kind_marks, kind_params, running_server
from voice.agent.loop import AgentLoop
from voice.agent.loop_settings import LoopSettings
from voice.agent.providers.openai_compat import OpenAICompatibleProvider
from voice.agent.tools import default_tools
from voice.log import events as ev
from voice.surfaces.text import TextSurface

pytestmark = kind_marks()
C = "c-llama"
# The server's context: shorter than the first request, long enough for the shorter one. llama-server's
# prompt holds the tool schemas too (its template puts them there; llama-cpp-python's format leaves them
# out unless a tool is named), so the same shorter request is longer there: 787 tokens, measured.
N_CTX = {PYTHON_SERVER: 768, LLAMA_SERVER: 1024}


@pytest.mark.parametrize("kind", kind_params(*KINDS))
async def test_a_server_context_refusal_gets_a_shorter_request_and_an_answer(kind, store, tmp_path):
    # A long conversation, far more than the server's context, that fits the claimed 2048 as estimated
    # (a longer one would move the window down to half the budget first: voice.agent.moving_window).
    for n in range(24):
        turn = store.start_turn(C, ev.TurnStart(source="text"))
        store.record(C, ev.UserMessage(content=f"Tell me fact number {n} about the sea, please, in a sentence."),
                     turn=turn)
        store.record(C, ev.AssistantMessage(message_id=f"m{turn}", content=[{"type": "text", "text":
                     f"Fact {n}: the sea covers most of the planet and holds nearly all of its water."}]),
                     turn=turn, step=0, attempt=0)
        store.end_turn(C, turn, ev.COMPLETED)
    with running_server(tmp_path, kind=kind, n_ctx=N_CTX[kind]) as server:
        provider = OpenAICompatibleProvider(server.base_url, server.model, timeout_s=120.0,
                                            extra_body={"max_tokens": 24})
        # The server counts with the model's own tokenizer (docs/llm-servers.md: /extras/tokenize/count).
        assert await provider.count_tokens("The tide turns twice a day.") == 7
        # The config claims 2048 tokens: the first window is too long for this server.
        agent = AgentLoop(store, provider, TextSurface(out=io.StringIO()), C, default_tools(),
                          LoopSettings(retry_backoff_s=0.01, context_tokens=2048, reply_tokens=256))
        try:
            result = await agent.run_turn("And one more fact, please.")
        finally:
            await provider.aclose()
    events = store.events(C, turn=result.turn)
    assert result.outcome == ev.COMPLETED, [e.body for e in events if e.type == ev.REQUEST_ERROR]
    refusals = [e for e in events if e.type == ev.REQUEST_ERROR and e.step == 0]
    assert len(refusals) == 1 and refusals[0].body.status == 400
    assert "context" in refusals[0].body.message
    answered = [e for e in events if e.type == ev.ASSISTANT_MESSAGE and e.step == 0]
    assert answered and answered[0].attempt == 1 and answered[0].body.text.strip()

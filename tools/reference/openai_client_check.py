#!/usr/bin/env python3
"""Checks a running `myriad serve` with the official `openai` Python client.

  openai_client_check.py BASE_URL MODEL        e.g. http://127.0.0.1:8000/v1 tiny

Covers: models.list; chat.completions (blocking, then streaming with include_usage: the deltas
must concatenate to the blocking text for greedy decoding, and the usage must match); a forced
tool call (tool_choice naming a function) blocking and streaming, with finish_reason
"tool_calls"; a history with a tool call and a tool result; completions; and the client's typed
errors for an unknown model (NotFoundError) and an out-of-range parameter (BadRequestError).
Exits 0 and prints "ok ..." on success.

Dependencies: `openai`. When it is missing, the script creates the virtualenv $MYRIAD_REF_VENV
(default tools/reference/.venv), pip-installs openai there and re-runs itself.
"""
import json
import os
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    refenv.ensure_package(__file__, "openai")
    import openai

    base, model = sys.argv[1], sys.argv[2]
    client = openai.OpenAI(base_url=base, api_key=os.environ.get("MYRIAD_API_KEY", "none"),
                           max_retries=0, timeout=120)

    ids = [m.id for m in client.models.list()]
    assert model in ids, ids

    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say something about the city."}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                       temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant" and isinstance(c.message.content, str), c
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert 1 <= r.usage.completion_tokens <= 16, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    text, finish, usage = "", None, None
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert text == c.message.content, (text, c.message.content)
    assert finish == c.finish_reason, finish
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage

    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "function", "function": {"name": "get_weather"}}
    t = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice=forced,
                                       max_tokens=16, temperature=0)
    tc = t.choices[0]
    # "length" when max_tokens cut the call before its closing tag (partial arguments).
    assert tc.finish_reason == "tool_calls" or (
        tc.finish_reason == "length" and t.usage.completion_tokens == 16), (tc.finish_reason, t.usage)
    call = tc.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather", call
    assert isinstance(call.function.arguments, str) and call.id.startswith("call_"), call

    name, finish = None, None
    for chunk in client.chat.completions.create(model=model, messages=ask, tools=TOOLS,
                                                tool_choice=forced, max_tokens=16, temperature=0,
                                                stream=True):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                name = d.function.name or name
            finish = ch.finish_reason or finish
    assert name == "get_weather" and finish == tc.finish_reason, (name, finish)

    history = ask + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": "get_weather",
                                      "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "12 degrees"},
    ]
    h = client.chat.completions.create(model=model, messages=history, tools=TOOLS,
                                       tool_choice="none", max_tokens=8, temperature=0)
    assert h.choices[0].message.tool_calls is None, h

    p = client.completions.create(model=model, prompt="the cat likes", max_tokens=8,
                                  temperature=0)
    assert isinstance(p.choices[0].text, str) and p.usage.completion_tokens >= 1, p

    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=4)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404 and e.code == "model_not_found", e
    try:
        client.chat.completions.create(model=model, messages=messages, temperature=3)
        raise AssertionError("temperature 3 accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.param == "temperature", e

    print(f"ok openai {openai.__version__}: models, chat, stream, tools, completions, errors")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Drives an agent model served by `myriad serve` with the official `openai` client.

  openai_agent_check.py BASE_URL MODEL MYRIAD_BIN ENV TASKS [OUT_JSON]

Environment: MYRIAD_AGENT_TURN_TOKENS (default 64) and MYRIAD_AGENT_TOTAL_TOKENS (default 256),
the per-turn and total token budgets of `myriad agent-eval`, applied the same way: a turn may
use min(turn budget, total budget - prompt tokens) tokens and is cut (the episode then fails)
when it needs more; the episode ends when the next prompt would reach the total budget.

For each held-out task 0..TASKS-1 of environment ENV: ask `myriad agent-step ENV --task I` for the
task's first message and its tools (OpenAI function definitions), send the task, and loop: receive
the assistant message (`tool_calls` or a final answer), replay the assistant messages so far
through `myriad agent-step` (the environment code the RL evaluator runs, so scoring is the same),
send the tool result as a `tool` message (or an environment observation as a `user` message),
until the episode ends. Greedy decoding (temperature 0), as `myriad agent-eval` measures greedy
pass@1. Prints the solve rate and, with OUT_JSON, writes
{"solved": [0/1 per task], "texts": [[assistant texts] per task]}.

Dependencies: `openai` (installed into tools/reference/.venv on first use, see refenv.py).
"""
import json
import os
import subprocess
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in


def agent_step(myriad, env, task, texts):
    out = subprocess.run([myriad, "agent-step", env, "--task", str(task)], check=True,
                         input=json.dumps(texts), capture_output=True, text=True).stdout
    return json.loads(out)


def call_text(tc):
    # The server's tool-call format (serve::format_tool_call), arguments as the model wrote them.
    return ('<tool_call>{"name": ' + json.dumps(tc.function.name) + ', "arguments": ' +
            (tc.function.arguments or "{}") + "}</tool_call>")


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    refenv.ensure_package(__file__, "openai")
    import openai

    base, model, myriad, env, tasks = sys.argv[1:6]
    turn_tokens = int(os.environ.get("MYRIAD_AGENT_TURN_TOKENS", "64"))
    total_tokens = int(os.environ.get("MYRIAD_AGENT_TOTAL_TOKENS", "256"))
    client = openai.OpenAI(base_url=base, api_key=os.environ.get("MYRIAD_API_KEY", "none"),
                           max_retries=0, timeout=120)
    solved, texts_all = [], []
    for task in range(int(tasks)):
        state = agent_step(myriad, env, task, [])
        tools = state["tools"]
        messages = [{"role": "user", "content": state["first_message"]}]
        texts = []
        for _ in range(32):  # environments end episodes long before this
            kwargs = {"tools": tools} if tools else {}
            r = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                               max_tokens=turn_tokens, **kwargs)
            room = total_tokens - r.usage.prompt_tokens
            if room <= 0:  # the prompt alone reaches the total budget: the episode ended before
                break
            if r.usage.completion_tokens > room or (
                    r.choices[0].finish_reason == "length" and room < turn_tokens):
                # The engine would have cut this turn at the total budget: the same cut.
                r = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                                   max_tokens=room, **kwargs)
                m = r.choices[0].message
                texts.append((m.content or "") + "".join(call_text(tc) for tc in m.tool_calls or []))
                state = {"solved": False}
                break
            m = r.choices[0].message
            calls = m.tool_calls or []
            text = (m.content or "") + "".join(call_text(tc) for tc in calls)
            texts.append(text)
            state = agent_step(myriad, env, task, texts)
            msg = {"role": "assistant", "content": m.content or ""}
            if calls:
                msg["tool_calls"] = [{"id": tc.id, "type": "function",
                                      "function": {"name": tc.function.name,
                                                   "arguments": tc.function.arguments}}
                                     for tc in calls]
            messages.append(msg)
            if state["done"] or r.choices[0].finish_reason == "length":
                break
            if state["role"] == "tool" and calls:
                messages.append({"role": "tool", "tool_call_id": calls[0].id,
                                 "content": state["observation"]})
            else:
                messages.append({"role": "user", "content": state["observation"]})
        solved.append(1 if state["solved"] else 0)
        texts_all.append(texts)
    rate = sum(solved) / len(solved)
    print(f"openai client agent loop: {env}: solved {sum(solved)}/{len(solved)} held-out tasks "
          f"(greedy pass@1 {rate:.3f})")
    if len(sys.argv) == 7:
        with open(sys.argv[6], "w") as f:
            json.dump({"solved": solved, "texts": texts_all}, f)


if __name__ == "__main__":
    main()

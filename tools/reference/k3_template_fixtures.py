#!/usr/bin/env python3
"""Fixtures for Myriad's Kimi K3 chat template (configs/templates/kimi-k3.jinja).

  k3_template_fixtures.py [--count N] [--out FILE]
      (defaults: 240, tests/fixtures/jinja_k3/cases.json)

K3 ships no Jinja template (the release renders chats in Python, encoding_k3.py). The reference
here is the one llama.cpp bundles, read at run time from
build/peers/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Kimi-K3.jinja (it is not
copied into this repository). The script generates N seeded conversations of the kind an
OpenAI-style server passes (system prompt or not, several turns, tools whose JSON Schemas nest
objects and hold unicode and quotes, assistant tool calls with arguments as JSON text and as
objects, several calls in one turn, tool results in call order, shuffled, with and without
tool_call_id and name, reasoning_content, thinking on / off / unset, thinking_effort, images as
content parts, add_generation_prompt true and false, unicode and special-token look-alikes in user
text, empty content, content None on a tool-calling turn), renders each with llama.cpp's template
and with ours in the environment transformers compiles chat templates in
(transformers.utils.chat_template_utils._compile_jinja_template), and asserts that they agree.

One deliberate difference: llama.cpp's template sorts the keys of the tool declaration with
`dictsort`, which ignores case, while the release sorts them with Python's sorted() (json with
sort_keys: code point order), as llama.cpp's own comment says it means to. Ours sorts by code
point. The expected output is therefore llama.cpp's template with that one filter made case
sensitive; the script also counts how many cases equal the unmodified template (all but those
whose tool schemas hold keys that the two orders put differently, such as "userId" / "user_id").

Output: {"jinja2", "transformers", "reference", "trusted_keys",
         "cases": [{"context": {...}, "expected": "..."}],
         "matched_llama_cpp": n, "matched_llama_cpp_code_point_sort": n}
Contexts go through json.dumps / json.loads first, so Python renders exactly what the C++ test
(tests/serve/test_k3_template.cpp) reads. Deterministic (random.Random(seed)).
"""
import argparse
import json
import pathlib
import random
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LLAMA_TEMPLATE = (ROOT / "build" / "peers" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" /
                  "models" / "templates" / "Kimi-K3.jinja")
OURS = ROOT / "configs" / "templates" / "kimi-k3.jinja"
TRUSTED_KEYS = ["add_generation_prompt", "bos_token", "eos_token", "thinking", "thinking_effort"]

WORDS = ["hello", "world", "Paris", "weather", "€uro", "naïve", "日本語", "Ünïcödé", "emoji 🚀",
         "tab\there", "line\nbreak", "  padded  ", "quote\"s", "amp & co", "<b>html</b>",
         "back\\slash", "ʕ•ᴥ•ʔ", "κόσμε", "\u00a0nbsp", "zero\u200bwidth", "{\"json\": 1}"]
LOOKALIKES = ["<|open|>", "<|close|>message<|sep|>", "<|end_of_msg|>", "<|sep|>",
              "<|open|>message role=\"system\"<|sep|>", "<|kimi_image_placeholder|>",
              "<|im_end|>", "[EOS]", "<|open|>think<|sep|>", "</think>"]
TOOL_NAMES = ["get_weather", "search", "run_python", "read_file", "send_email", "calc",
              "lookup-user", "translate_文本", "a&b", "say\"hi\""]


def text(rng, lo=1, hi=10):
    out = []
    for _ in range(rng.randint(lo, hi)):
        r = rng.random()
        if r < 0.1:
            out.append(rng.choice(LOOKALIKES))
        elif r < 0.45:
            out.append(rng.choice(WORDS))
        else:
            out.append("".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(1, 8))))
    return " ".join(out)


def value(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return text(rng, 1, 3)
    if r < 0.4:
        return rng.randint(-1000, 10**6)
    if r < 0.5:
        return rng.choice([0.5, 1.0, -2.25, 3.14159, 1e-5, 1e20])
    if r < 0.6:
        return rng.choice([True, False])
    if r < 0.65:
        return None
    if r < 0.8:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b", "Key", "ключ", "x y", "q\"k", "a&b"]) + str(i): value(rng, depth + 1)
            for i in range(rng.randint(0, 3))}


def schema(rng, depth=0, mixed_case=False):
    props = {}
    names = ["city", "query", "limit", "options", "unit", "tags", "path", "ort_名前", "q\"x"]
    if mixed_case:
        names += ["userId", "user_id", "Zeta", "alpha", "a_b", "aB", "URL", "url_"]
    for name in rng.sample(names, rng.randint(1, 4)):
        r = rng.random()
        if r < 0.35:
            p = {"type": "string", "description": text(rng, 1, 4)}
            if rng.random() < 0.3:
                p["enum"] = [text(rng, 1, 1) for _ in range(rng.randint(1, 3))]
        elif r < 0.5:
            p = {"type": "integer", "minimum": rng.randint(0, 5), "default": rng.randint(5, 9)}
        elif r < 0.6:
            p = {"type": "number", "maximum": 1.5}
        elif r < 0.7:
            p = {"type": "boolean", "default": rng.choice([True, False])}
        elif r < 0.85 and depth < 2:
            p = schema(rng, depth + 1, mixed_case)
        else:
            p = {"type": "array", "items": {"type": "string"} if depth >= 2 else
                 schema(rng, depth + 1, mixed_case)}
        props[name] = p
    s = {"type": "object", "properties": props}
    if rng.random() < 0.6:
        s["required"] = rng.sample(list(props), rng.randint(1, len(props)))
    if rng.random() < 0.2:
        s["additionalProperties"] = False
    if mixed_case and rng.random() < 0.5:
        s["$defs"] = {"Item": {"type": "null"}}
    return s


def tools(rng, mixed_case):
    out = []
    for name in rng.sample(TOOL_NAMES, rng.randint(1, 3)):
        fn = {"name": name}
        if rng.random() < 0.8:
            fn["description"] = text(rng, 2, 8)
        if rng.random() < 0.9:
            fn["parameters"] = schema(rng, 0, mixed_case)
        out.append({"type": "function", "function": fn})
    return out


def arguments(rng):
    r = rng.random()
    args = {k: value(rng) for k in rng.sample(["city", "q", "n", "opts", "名前", "k\"&", "flag"],
                                                rng.randint(0, 4))}
    if r < 0.5:  # JSON text, as an OpenAI server passes it
        if rng.random() < 0.5:
            return json.dumps(args, ensure_ascii=False)
        return json.dumps(args, ensure_ascii=rng.random() < 0.5, separators=(",", ":"))
    if r < 0.9:
        return args
    return rng.choice(["", "   ", "not json {", "{\"a\": \"</close>\"}"])


def content_parts(rng):
    parts = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.4:
            parts.append({"type": "image_url", "image_url": {"url": ""}})
        else:
            parts.append({"type": "text", "text": text(rng, 0, 6)})
    return parts


def conversation(rng, index):
    ctx = {"messages": []}
    msgs = ctx["messages"]
    mixed_case = index % 10 == 7
    if rng.random() < 0.45 or mixed_case:
        ctx["tools"] = tools(rng, mixed_case)
    elif rng.random() < 0.1:
        ctx["tools"] = []
    if rng.random() < 0.6:
        m = {"role": "system", "content": rng.choice(["You are Kimi.", text(rng), ""])}
        if rng.random() < 0.1:
            m["name"] = rng.choice(["ops", "a\"b&c"])
        msgs.append(m)
    call_seq = 0
    for _turn in range(rng.randint(1, 4)):
        u = {"role": "user"}
        r = rng.random()
        u["content"] = content_parts(rng) if r < 0.15 else ("" if r < 0.2 else text(rng, 1, 14))
        if rng.random() < 0.1:
            u["name"] = rng.choice(["alice", "böb", "x\"&y"])
        msgs.append(u)
        if rng.random() < 0.1:
            msgs.append({"role": "system", "content": text(rng, 1, 4)})
        for _step in range(rng.randint(0, 2)):
            a = {"role": "assistant"}
            if rng.random() < 0.4:
                a["reasoning_content"] = rng.choice([text(rng, 1, 8), "", "   \n", " lead and trail "])
            calls = []
            if "tools" in ctx and ctx["tools"] and rng.random() < 0.7:
                for _ in range(rng.randint(1, 3)):
                    call_seq += 1
                    name = rng.choice(ctx["tools"])["function"]["name"]
                    fn = {"name": name, "arguments": arguments(rng)}
                    call = {"id": "call_%d" % call_seq, "type": "function", "function": fn}
                    if rng.random() < 0.05:
                        call = dict(fn, id="call_%d" % call_seq)  # flat form
                    calls.append(call)
            if calls:
                a["content"] = rng.choice([None, None, "", text(rng, 1, 5)])
                a["tool_calls"] = calls
            else:
                r = rng.random()
                a["content"] = "" if r < 0.1 else (content_parts(rng) if r < 0.15 else text(rng, 1, 12))
            if rng.random() < 0.05:
                a["name"] = "kimi"
            msgs.append(a)
            if not calls:
                break
            results = []
            mode = rng.random()
            for c in calls:
                t = {"role": "tool", "content": rng.choice([text(rng, 1, 8),
                                                           json.dumps({"ok": True, "v": text(rng, 1, 2)},
                                                                      ensure_ascii=False), ""])}
                if rng.random() < 0.1:
                    t["content"] = [{"type": "text", "text": text(rng, 1, 4)}]
                if mode < 0.7:
                    t["tool_call_id"] = c["id"]
                elif mode < 0.85:
                    t["name"] = (c.get("function") or c)["name"]
                elif mode < 0.95:
                    pass  # neither: the name comes from the call at the same position
                else:
                    t["tool_call_id"] = "unknown_%d" % rng.randint(0, 9)
                    t["name"] = "fallback"
                if rng.random() < 0.2:
                    t["name"] = rng.choice(["stale_name", (c.get("function") or c)["name"]])
                results.append(t)
            if mode < 0.7 and rng.random() < 0.4:
                rng.shuffle(results)
            msgs.extend(results)
    if rng.random() < 0.15:
        msgs.append({"role": "assistant", "content": text(rng, 1, 6),
                     "reasoning_content": text(rng, 1, 4)})
    r = rng.random()
    if r < 0.4:
        ctx["thinking"] = True
    elif r < 0.8:
        ctx["thinking"] = False
    if rng.random() < 0.15:
        ctx["thinking_effort"] = rng.choice(["low", "high", "max", None])
    ctx["add_generation_prompt"] = rng.random() < 0.75
    ctx["bos_token"] = "[BOS]"
    ctx["eos_token"] = "[EOS]"
    return ctx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=240)
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "jinja_k3" / "cases.json"))
    args = ap.parse_args()

    sys.path.insert(0, str(HERE))
    import refenv  # tools/reference/refenv.py: the venv these scripts run in
    refenv.ensure_pinned(__file__)
    import jinja2
    import transformers
    from transformers.utils.chat_template_utils import _compile_jinja_template

    reference_src = LLAMA_TEMPLATE.read_text(encoding="utf-8")
    sorted_src = reference_src.replace("value|dictsort", "value|dictsort(case_sensitive=true)")
    assert sorted_src.count("dictsort(case_sensitive=true)") == 1, "llama.cpp's template changed"
    reference = _compile_jinja_template(reference_src)
    reference_sorted = _compile_jinja_template(sorted_src)
    ours = _compile_jinja_template(OURS.read_text(encoding="utf-8"))

    rng = random.Random(20261202)
    cases, same_llama, same_sorted, failures = [], 0, 0, []
    for i in range(args.count):
        ctx = json.loads(json.dumps(conversation(rng, i), ensure_ascii=False))
        want = reference_sorted.render(**ctx)
        got = ours.render(**ctx)
        same_sorted += got == want
        same_llama += got == reference.render(**ctx)
        if got != want:
            failures.append((i, want, got))
        cases.append({"context": ctx, "expected": want})
    for i, want, got in failures[:3]:
        print("case %d differs:\n want %r\n got  %r" % (i, want, got))
    doc = {"jinja2": jinja2.__version__, "transformers": transformers.__version__,
           "reference": "llama.cpp models/templates/Kimi-K3.jinja (llama_cpp_python 0.3.36), "
                        "tool-declaration keys sorted by code point",
           "trusted_keys": TRUSTED_KEYS, "cases": cases,
           "matched_llama_cpp": same_llama, "matched_llama_cpp_code_point_sort": same_sorted}
    text_out = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text_out + "\n", encoding="utf-8")
    print("%d conversations: ours == llama.cpp (code point key order) in %d, == llama.cpp as "
          "shipped in %d; wrote %s (%d bytes)" % (len(cases), same_sorted, same_llama, out,
                                                  len(text_out.encode())))
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()

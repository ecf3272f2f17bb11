#!/usr/bin/env python3
"""Asks a multimodal model served by `myriad serve` about Fashion-MNIST images with the official
`openai` client, and checks the answers against `myriad vision-eval`.

  openai_vision_check.py BASE_URL MODEL IMAGE_DIR [EVAL_JSON]

IMAGE_DIR holds the PNGs `myriad vision-eval --save-images DIR` writes (test-<index>-<class>.png).
Each one is sent as a data URL image part followed by the text part "What is this?" (the order
the evaluator renders), greedy (temperature 0, max_tokens 8, as the evaluator decodes); the reply,
stripped of spaces, is scored against the class in the file name. Prints the accuracy.

With EVAL_JSON (the --json of `myriad vision-eval --images N --grid 0` over the same N images) the
server must agree with the evaluator's greedy replies: the caption accuracy and the confusion
matrix must be equal, and so must each reply the JSON keeps (its first 16 samples, matched to the
files by their PNG bytes).

Then the typed errors: a remote URL, a corrupt PNG (a flipped byte, a truncated file) and a GIF
(as image/gif and disguised as image/png) must each raise openai.BadRequestError (status 400)
with the server's error code, and the server must still answer the first image as before.

Exits non-zero on any mismatch.

Dependencies: `openai` (installed into tools/reference/.venv on first use, see refenv.py).
"""
import base64
import json
import pathlib
import re
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in

CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat",
           "sandal", "shirt", "sneaker", "bag", "ankle boot"]
QUESTION = "What is this?"
# A 1 x 1 GIF89a.
GIF = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000"
                    "010001000002024401003b")


def data_url(data, media="image/png"):
    return f"data:{media};base64," + base64.b64encode(data).decode()


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    refenv.ensure_package(__file__, "openai")
    import openai

    base, model, image_dir = sys.argv[1:4]
    client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)

    def ask(url):
        r = client.chat.completions.create(
            model=model, temperature=0, max_tokens=8,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": QUESTION}]}])
        return (r.choices[0].message.content or "").strip(" \n\t"), r.usage

    files = []
    for p in pathlib.Path(image_dir).glob("test-*.png"):
        m = re.fullmatch(r"test-(\d+)-(.+)\.png", p.name)
        if m:
            files.append((int(m.group(1)), m.group(2).replace("_", " "), p))
    files.sort()
    if not files:
        sys.exit(f"no test-<index>-<class>.png files in {image_dir}")
    failures = []
    replies, confusion = {}, [[0] * 11 for _ in CLASSES]
    correct = 0
    for index, label, path in files:
        if label not in CLASSES:
            sys.exit(f"{path.name}: unknown class {label!r}")
        reply, usage = ask(data_url(path.read_bytes()))
        replies[path.read_bytes()] = reply
        correct += reply == label
        confusion[CLASSES.index(label)][CLASSES.index(reply) if reply in CLASSES else 10] += 1
        if index < 3:
            print(f"  {path.name}: {reply!r} ({usage.prompt_tokens} prompt tokens)")
    n = len(files)
    accuracy = correct / n
    print(f"openai client: {correct}/{n} images answered with their class "
          f"(accuracy {accuracy:.4f})")

    if len(sys.argv) == 5:
        ev = json.load(open(sys.argv[4]))
        asked, want = ev["asked"]["caption"], ev["accuracy"]["caption"]
        print(f"vision-eval:   caption accuracy {want:.4f} over {asked} images")
        if asked != n:
            failures.append(f"vision-eval asked {asked} captions, the client {n}")
        elif accuracy != want:
            failures.append(f"accuracy: client {accuracy!r}, vision-eval {want!r}")
        if asked == n and confusion != ev["confusion"]:
            failures.append(f"confusion differs:\n  client {confusion}\n  eval   {ev['confusion']}")
        compared = 0
        for k, s in enumerate(ev.get("samples", [])):
            png = base64.b64decode(s["png"])
            if png not in replies:
                failures.append(f"eval sample {k} ({s['label']}) is none of the sent images")
                continue
            compared += 1
            if replies[png] != s["reply"]:
                failures.append(f"eval sample {k} ({s['label']}): client {replies[png]!r}, "
                                f"vision-eval {s['reply']!r}")
        print(f"per image: {compared} of vision-eval's sample replies compared")
        if not compared:
            failures.append("no per-image replies to compare in the eval JSON")

    first = files[0][2].read_bytes()
    bad = {
        "remote URL": ("https://example.com/shoe.png", "invalid_image_url"),
        "corrupt PNG (flipped byte)": (
            data_url(first[:60] + bytes([first[60] ^ 0x5A]) + first[61:]), "invalid_image_format"),
        "corrupt PNG (truncated)": (data_url(first[: len(first) // 2]), "invalid_image_format"),
        "GIF": (data_url(GIF, "image/gif"), "invalid_image_url"),
        "GIF sent as image/png": (data_url(GIF), "invalid_image_format"),
    }
    for what, (url, code) in bad.items():
        try:
            ask(url)
            failures.append(f"{what}: no error")
        except openai.BadRequestError as e:
            ok = e.status_code == 400 and e.code == code
            print(f"  {what}: {e.status_code} {e.code}" + ("" if ok else f" (want 400 {code})"))
            if not ok:
                failures.append(f"{what}: {e.status_code} {e.code}, want 400 {code}")
        except openai.APIError as e:
            failures.append(f"{what}: {type(e).__name__} {e}, want BadRequestError")
    again, _ = ask(data_url(first))
    if again != replies[first]:
        failures.append(f"after the errors: {again!r}, before {replies[first]!r}")
    else:
        print(f"after the errors the server still answers: {again!r}")

    for f in failures:
        print("MISMATCH:", f)
    if failures:
        sys.exit(1)
    print(f"ok: {n} images; the server's replies agree with vision-eval; bad images are 400s")


if __name__ == "__main__":
    main()

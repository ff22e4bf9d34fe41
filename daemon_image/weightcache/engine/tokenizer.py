"""Text ↔ token ids with the checkpoint's own tokenizer, without importing transformers.

``tokenizer.json`` is loaded with the ``tokenizers`` library directly: transformers' import
alone costs seconds, which would land on every engine start. Chat messages are rendered with
the checkpoint's ``chat_template`` (jinja2, as transformers does) when it has one, else with a
plain, documented fallback so that test checkpoints without a template can still chat.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weightcache_contract.errors import CheckpointError

FALLBACK_TEMPLATE_DOC = "'<role>: <content>\\n' per message, then 'assistant:'"


class Tokenizer:
    def __init__(self, model_dir: str | Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{model_dir} has no tokenizer.json; the engine needs the checkpoint's tokenizer")
        self._tok = HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template: str | None = (
            config.get("chat_template") if isinstance(config.get("chat_template"), str) else None
        )
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        eos = set(eos_token_ids)
        if self.eos_token and (eos_id := self._tok.token_to_id(self.eos_token)) is not None:
            eos.add(eos_id)
        self.eos_token_ids = frozenset(eos)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        if self.chat_template:
            import jinja2

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
            return env.from_string(self.chat_template).render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<|endoftext|>", ...} in older configs
        return value.get("content")
    return value if isinstance(value, str) else None

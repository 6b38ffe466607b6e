"""A checkpoint's tokenizer files: tokenizer.json, tokenizer_config.json, and chat_template.jinja where present.
Every missing or malformed file is a ValueError naming it; the small files are read first, so their errors do
not wait for a large tokenizer.json to parse. (The ids generation stops on come from the model's config.json and
generation_config.json: loader.py.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import tokenizers

from qwen3_runtime.tokenizer.chat_template import compile_template


@dataclass
class CheckpointTokenizer:
    hf: tokenizers.Tokenizer
    chat_template: str | None
    special_tokens_map: dict[str, str]


def read_checkpoint_tokenizer(path: str | Path) -> CheckpointTokenizer:
    root = Path(path)
    tok_path, cfg_path = root / "tokenizer.json", root / "tokenizer_config.json"
    if not tok_path.is_file():
        raise ValueError(f"{tok_path}: file not found")
    cfg = _read_json(cfg_path, required=True)
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object")
    template = _chat_template(root, cfg)
    special_tokens_map = {
        key: content
        for key in ("bos_token", "eos_token", "pad_token", "unk_token")
        if (content := _token_content(cfg.get(key))) is not None
    }
    try:
        hf = tokenizers.Tokenizer.from_file(str(tok_path))
    except Exception as e:  # tokenizers raises a plain Exception on bad JSON or schema
        raise ValueError(f"{tok_path}: not a valid tokenizers file: {e}") from e
    return CheckpointTokenizer(hf, template, special_tokens_map)


def _chat_template(root: Path, cfg: dict) -> str | None:
    """chat_template.jinja when present (newer transformers saves it there), else tokenizer_config.json's."""
    template_path, cfg_path = root / "chat_template.jinja", root / "tokenizer_config.json"
    if template_path.is_file():
        source = template_path
        try:
            template = template_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{template_path}: cannot read: {e}") from e
    else:
        source = cfg_path
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if template is not None and not isinstance(template, str):
            raise ValueError(f"{cfg_path}: chat_template must be a string or a list of named templates")
    if template is not None:
        try:
            compile_template(template)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"{source}: chat template does not compile: {e}") from e
    return template


def _read_json(path: Path, *, required: bool) -> Any:
    if not path.is_file():
        if required:
            raise ValueError(f"{path}: file not found")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e


def _token_content(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as a string or as an AddedToken dict.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None

"""Hugging Face tokenizer files for a checkpoint: built from a GGUF's metadata, or copied from an HF directory.

Why not `AutoTokenizer.from_pretrained(dir, gguf_file=...)`: in transformers 5 that path imports torch (its
GGUF reader does), and jspec runs without torch. The GGUF -> `tokenizers` translation it uses
(`transformers.integrations.gguf.gguf_tokenizer_mapping`) is torch-free, so we feed it the metadata read
by the `gguf` package; the result is the same tokenizer transformers would build from the file.
"""
from __future__ import annotations

import json
import os
import shutil

from .layout import CheckpointError

# Files that make up a Hugging Face tokenizer (any subset may exist).
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                      "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "tokenizer.model")


def write_gguf_tokenizer(tokenizer_info: dict, out_dir: str) -> None:
    """Write tokenizer.json / tokenizer_config.json (with the chat template) from `read_gguf`'s tokenizer_info."""
    from transformers import PreTrainedTokenizerFast
    GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer = _gguf_helpers()
    fields, arch = tokenizer_info["fields"], tokenizer_info["architecture"]
    # The same grouping transformers' get_gguf_tokenizer does, minus its torch-based file reader.
    groups = {group: {name: _plain(fields[f"tokenizer.{key}"]) for key, name in renames.items()
                      if f"tokenizer.{key}" in fields}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tok_dict, tok_config = groups["tokenizer"], groups["tokenizer_config"]
    tokens = tok_dict.get("tokens")
    if not tokens:
        raise CheckpointError("the GGUF file has no tokenizer.ggml.tokens; cannot build a tokenizer")
    for name, key in _SPECIAL_TOKENS.items():
        token_id = fields.get(f"tokenizer.ggml.{key}")
        tok_config[name] = tokens[int(token_id)] if token_id is not None else None
    try:
        backend, extra = convert_gguf_tokenizer(arch, tok_dict)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"cannot build a tokenizer from this GGUF file: {e}") from e
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, **{**tok_config, **extra})
    tokenizer.save_pretrained(out_dir)
    # transformers 5 writes the template to chat_template.jinja; keep a copy in tokenizer_config.json for
    # readers that only look there (older transformers, other runtimes).
    template = tok_config.get("chat_template")
    if template:
        path = os.path.join(out_dir, "tokenizer_config.json")
        with open(path) as f:
            config = json.load(f)
        config.setdefault("chat_template", template)
        with open(path, "w") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)


# The GGUF metadata keys of the special tokens (the same table transformers keeps privately).
_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
                   "pad_token": "padding_token_id"}


def _gguf_helpers():
    """transformers' torch-free GGUF tokenizer helpers; their module moved between releases."""
    for mod in ("transformers.integrations.gguf.gguf_tokenizer_mapping", "transformers.integrations.ggml",
                "transformers.modeling_gguf_pytorch_utils"):
        try:
            m = __import__(mod, fromlist=["GGUF_TOKENIZER_MAPPING", "convert_gguf_tokenizer"])
            mapping = getattr(m, "GGUF_TOKENIZER_MAPPING", None)
            if mapping is None:
                mapping = __import__("transformers.integrations.ggml", fromlist=["x"]).GGUF_TOKENIZER_MAPPING
            return mapping, m.convert_gguf_tokenizer
        except (ImportError, AttributeError):
            continue
    raise CheckpointError("cannot build a tokenizer from GGUF metadata with this transformers version (its GGUF "
                          "tokenizer helpers were not found); install the version pinned in pyproject.toml")


def copy_hf_tokenizer(src_dir: str, out_dir: str) -> bool:
    """Copy the Hugging Face tokenizer files of `src_dir` into `out_dir`; False if it has none."""
    present = [f for f in HF_TOKENIZER_FILES if os.path.isfile(os.path.join(src_dir, f))]
    if not present:
        return False
    os.makedirs(out_dir, exist_ok=True)
    for f in present:
        shutil.copy2(os.path.join(src_dir, f), os.path.join(out_dir, f))
    return True


def _plain(value):
    """GGUF arrays come back as lists of numpy scalars or strings; make them plain Python."""
    if isinstance(value, list):
        return [v.item() if hasattr(v, "item") else v for v in value]
    return value.item() if hasattr(value, "item") else value

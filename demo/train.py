"""Training stages of the demo: supervised warm-up of the base, then on-policy RL (GRPO) per agent."""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from .generation import generate, max_new_tokens
from .suites import DEFAULT_SUITE, TaskSuite
from .tasks import Example

LogFn = Callable[[dict], None]


@dataclass(frozen=True)
class WarmupConfig:
    """Supervised warm-up: batches of one task at a time, tasks visited by weight. The first
    `clean_fraction` of the steps use only correct demonstrations (the skills are learned first);
    afterwards a share `habit_rates[task]` of the demonstrations show the careless habit instead
    of the answer (a mixed-quality fine-tuning corpus, which leaves RL something to fix)."""

    steps: int = 3000
    batch_size: int = 32
    lr: float = 2e-3
    weights: tuple[tuple[str, float], ...] = (("code", 1.0), ("tool", 0.8), ("memory", 1.5))
    habit_rates: tuple[tuple[str, float], ...] = (("code", 0.5), ("tool", 0.5), ("memory", 0.7))
    clean_fraction: float = 0.6
    seed: int = 0
    # Share of the mixed-phase demonstrations (in a suite with an answer envelope) written without
    # the envelope: the one careless protocol habit common to every task.
    format_slip_rate: float = 0.0


def deterministic_torch() -> None:
    """One CPU thread (much faster than two on a shared 2-core machine) and deterministic kernels, so
    that a warm-up or RL run repeats bit for bit."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


# The habit rates of the word-token bases (the shipped one and the exploration's bpe-* bases).
WORD_HABITS: tuple[tuple[str, float], ...] = (("code", 0.5), ("tool", 0.6), ("memory", 0.7))


@dataclass(frozen=True)
class RLConfig:
    """GRPO: `prompts` x `group` sampled rollouts per step, one on-policy update per batch."""

    steps: int = 60
    prompts: int = 16
    group: int = 8
    lr: float = 1e-4
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    seed: int = 0
    optimizer: str = "adam"  # "adam" (what real RL stacks use) or "sgd"
    adam_eps: float = 1e-8


def _pack(tokenizer: PreTrainedTokenizerFast, prompts: Sequence[str], completions: Sequence[list[int]]
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompt+completion ids, attention mask, and a mask over completion tokens."""
    rows = [tokenizer(p)["input_ids"] + c for p, c in zip(prompts, completions)]
    comp_len = [len(c) for c in completions]
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    target = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, (row, n) in enumerate(zip(rows, comp_len)):
        ids[i, width - len(row):] = torch.tensor(row)
        attn[i, width - len(row):] = 1
        target[i, width - n:] = True
    return ids, attn, target


def token_logprobs(model: PreTrainedModel, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """Log-probability of each token given its prefix (position t scores token t; t=0 is 0)."""
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def warmup(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, cfg: WarmupConfig,
           log: LogFn, suite: TaskSuite = DEFAULT_SUITE) -> None:
    """Supervised next-token training on answers (prompt tokens are context only)."""
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.98))
    tasks = [t for t, _ in cfg.weights]
    weights = [w for _, w in cfg.weights]
    eos = tokenizer.eos_token_id
    model.train()
    t0 = time.time()
    for step in range(1, cfg.steps + 1):
        lr = cfg.lr * min(1.0, step / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / cfg.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        task = rng.choices(tasks, weights)[0]
        batch = [suite.sample_train(task, rng) for _ in range(cfg.batch_size)]
        mixed = step > cfg.clean_fraction * cfg.steps
        rate = dict(cfg.habit_rates).get(task, 0.0) if mixed else 0.0
        shown = [e.habit if rng.random() < rate else e.answer for e in batch]
        if mixed and cfg.format_slip_rate > 0:  # the common protocol habit, drawn independently
            shown = [suite.strip_envelope(a) if rng.random() < cfg.format_slip_rate else a
                     for a in shown]
        answers = [tokenizer(a)["input_ids"] + [eos] for a in shown]
        ids, attn, target = _pack(tokenizer, [e.prompt for e in batch], answers)
        lp = token_logprobs(model, ids, attn)
        loss = -(lp * target).sum() / target.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 25 == 0 or step == cfg.steps:
            log({"stage": "warmup", "agent": "base", "step": step, "task": task,
                 "loss": round(loss.item(), 4), "lr": lr, "elapsed_s": round(time.time() - t0, 1)})
    model.eval()


def _strip_after_eos(completion: torch.Tensor, eos: int) -> list[list[int]]:
    """Completion token lists cut after the first EOS (kept: the policy chose to stop)."""
    out = []
    for row in completion.tolist():
        out.append(row[:row.index(eos) + 1] if eos in row else row)
    return out


def rl_train(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: str, cfg: RLConfig,
             agent: str, log: LogFn, on_grad: Callable[[PreTrainedModel], None] | None = None,
             suite: TaskSuite = DEFAULT_SUITE) -> None:
    """GRPO on one task: sample groups from the current policy, reward by the verifier, and take
    one policy-gradient step with group-normalised advantages (no supervised targets, no KL).
    `on_grad(model)` is called after each backward pass, before clipping and the step (used to
    record which parameters receive any gradient at all)."""
    rng = random.Random(cfg.seed + 7919)
    torch.manual_seed(cfg.seed)
    opt = (torch.optim.Adam(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), eps=cfg.adam_eps)
           if cfg.optimizer == "adam" else torch.optim.SGD(model.parameters(), lr=cfg.lr))
    eos = tokenizer.eos_token_id
    t0 = time.time()
    for step in range(1, cfg.steps + 1):
        batch: list[Example] = [suite.sample_train(task, rng) for _ in range(cfg.prompts)]
        model.eval()
        _, completion, texts = generate(model, tokenizer, [e.prompt for e in batch],
                                        max_new_tokens(task, suite), sample=True,
                                        num_return_sequences=cfg.group,
                                        temperature=cfg.temperature)
        examples = [e for e in batch for _ in range(cfg.group)]
        rewards = torch.tensor([suite.reward(e, t) for e, t in zip(examples, texts)])
        accuracy = sum(suite.verify(e, t) for e, t in zip(examples, texts)) / len(examples)
        grouped = rewards.view(cfg.prompts, cfg.group)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4))
        adv = adv.reshape(-1)
        comps = _strip_after_eos(completion, eos)
        active = adv.abs() > 0
        loss_value = 0.0
        if active.any():
            model.train()
            keep = active.nonzero().squeeze(1).tolist()
            ids, attn, target = _pack(tokenizer, [examples[i].prompt for i in keep],
                                      [comps[i] for i in keep])
            lp = token_logprobs(model, ids, attn)
            per_token = lp * target * adv[keep, None]
            loss = -per_token.sum() / (target.sum() + len(examples) - len(keep))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if on_grad is not None:
                on_grad(model)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
            loss_value = loss.item()
        log({"stage": "rl", "agent": agent, "task": task, "step": step,
             "mean_reward": round(rewards.mean().item(), 4), "sample_accuracy": round(accuracy, 4),
             "frac_groups_with_signal": round((grouped.std(1) > 0).float().mean().item(), 4),
             "loss": round(loss_value, 5), "elapsed_s": round(time.time() - t0, 1)})
    model.eval()

"""The diagonal Fisher pass: the mean, over N examples of an agent's own task, of the per-example squared
gradient of the log-likelihood of an answer, for every parameter of the loaded agent, in float32.

    F = (1/N) Σ_n (∂ log p(y_n | x_n) / ∂θ)²,   log p(y | x) = Σ_i log p(y_i | x, y_<i)

One example at a time (batch size 1): each example's own gradient is squared, never a batch's summed
gradient (whose square holds cross terms between examples; MergeLM and FusionBench square the batch's).
The answer y_n is, by `rule`: one answer sampled from the agent (temperature 1, no top-k/p: Matena & Raffel's
Fisher, an expectation over the model's own predictive distribution, estimated with one sample per
example), the agent's greedy answer, or the task's reference answer (the "empirical Fisher" of Kunstner
et al.; what MergeLM's regression path and many implementations use). Answers end with the end-of-text
token when the agent stops (reference answers always get it).

Memory: the model (float32, on its device) and one float32 accumulator per parameter, plus one example's
activations; each parameter's gradient is squared into its accumulator and freed as soon as backward has
produced it (a post-accumulate-grad hook), so no full set of gradients ever exists. Snapshots of the mean at
several N come from one pass (the first N examples are the same for every N), one tensor at a time.
"""
from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from merging.common.errors import Cancelled, RamStudioError

RULES = ("sampled", "greedy", "reference")
# A small model's pass on the CPU is a stream of small operations: one intra-op thread (as the demo's decoder;
# on this shared 2-core machine two threads made one example of the demo 3-10x slower, not faster).
SMALL_HIDDEN = 1024
# (examples done, examples in all, a line of text)
FisherProgress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class FisherExample:
    """One prompt of a task, its reference answer (None when the task has none), the answer budget in tokens
    and the strings that end an answer (lm-eval's `until`)."""

    prompt: str
    answer: str | None
    max_new_tokens: int
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class FisherData:
    """The first N examples of a task that a Fisher is computed on: where they come from (`source`: backend,
    suite or harness version, task; part of the cache key with the examples' own text), the split, notes, and
    the answer rules that apply (a multiple-choice task has only reference answers)."""

    task: str
    split: str
    examples: tuple[FisherExample, ...]
    source: str
    notes: tuple[str, ...] = ()
    rules: tuple[str, ...] = RULES


@dataclass
class PassStats:
    """What one pass did: examples, answer tokens, empty answers, seconds of compute (answers and gradients;
    loading the model and writing files excluded) to each snapshot, the tensors no gradient reached, the device
    and its peak memory (GPU: allocated by torch; CPU: None)."""

    device: str
    examples: int = 0
    answer_tokens: int = 0
    empty_answers: int = 0
    seconds: dict[int, float] = field(default_factory=dict)
    no_gradient: list[str] = field(default_factory=list)
    peak_device_bytes: int | None = None


class _Accumulators:
    """One float32 accumulator per distinct parameter behind the checkpoint's tensor names (tied tensors
    share theirs), filled by post-accumulate-grad hooks that free each gradient once it is squared in."""

    def __init__(self, module: torch.nn.Module, names: list[str]) -> None:
        targets = module.state_dict(keep_vars=True)
        missing = [n for n in names if n not in targets]
        if missing:
            raise RamStudioError(f"the loaded model has no tensor {missing[0]!r} (and {len(missing) - 1} more) that "
                                 "the checkpoint holds.", "The Fisher pass needs the checkpoint's own tensor names.")
        self.names = names
        self.params = {n: targets[n] for n in names}
        self.acc: dict[int, torch.Tensor] = {}
        self._handles: list[Any] = []
        self._grad_before = {id(p): p.requires_grad for p in module.parameters()}
        self.module = module
        wanted = {id(p) for p in self.params.values() if isinstance(p, torch.nn.Parameter) and p.is_floating_point()}
        for p in module.parameters():
            p.requires_grad_(id(p) in wanted)
        for p in {id(p): p for p in self.params.values() if id(p) in wanted}.values():
            self.acc[id(p)] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            self._handles.append(p.register_post_accumulate_grad_hook(self._square_in))
        self.touched: set[int] = set()

    def _square_in(self, p: torch.Tensor) -> None:
        g = p.grad.to(torch.float32)
        self.acc[id(p)].addcmul_(g, g)
        self.touched.add(id(p))
        p.grad = None

    def mean(self, n: int) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, F on the CPU) for every checkpoint tensor, one at a time: the accumulator divided by n."""
        for name in self.names:
            p = self.params[name]
            acc = self.acc.get(id(p))
            yield name, (torch.zeros(p.shape, dtype=torch.float32) if acc is None else (acc / n).cpu())

    def untouched(self) -> list[str]:
        return [n for n in self.names if id(self.params[n]) not in self.touched]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        for p in self.module.parameters():
            p.requires_grad_(self._grad_before.get(id(p), True))
            p.grad = None
        self.acc.clear()


def fisher_pass(module: torch.nn.Module, tokenizer: Any, data: FisherData, rule: str, names: list[str],
                snapshots: list[int], on_snapshot: Callable[[int, PassStats, Iterator[tuple[str, torch.Tensor]]], None],
                *, seed: int = 0, progress: FisherProgress | None = None,
                cancel: threading.Event | None = None) -> PassStats:
    """Run the pass over the first max(snapshots) examples of `data`; at each n in `snapshots` call
    `on_snapshot(n, the stats so far, (name, F) one tensor at a time)`. `module` is float32 and in eval mode."""
    if rule not in data.rules:
        raise RamStudioError(f"the Fisher rule {rule!r} does not apply to task {data.task}.",
                             f"Choose one of {', '.join(data.rules)}" + (f" ({data.notes[-1]})" if data.notes else "."))
    total = max(snapshots)
    if total > len(data.examples):
        raise RamStudioError(f"the Fisher needs {total} examples of task {data.task}; {len(data.examples)} were given.",
                             "Ask for fewer examples.")
    device = next(module.parameters()).device
    eos = tokenizer.eos_token_id
    if eos is None and rule != "reference":
        raise RamStudioError("the tokenizer has no end-of-text token, so the agent's own answers have no end.",
                             "Use --fisher-rule reference, or a model whose tokenizer has one.")
    stats = PassStats(str(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    accs = _Accumulators(module, names)
    keep = "logits_to_keep" in inspect.signature(module.forward).parameters
    t0, writing = time.perf_counter(), 0.0
    threads = torch.get_num_threads()
    if device.type == "cpu" and getattr(getattr(module, "config", None), "hidden_size", 1 << 30) <= SMALL_HIDDEN:
        torch.set_num_threads(1)
    try:
        for i, ex in enumerate(data.examples[:total]):
            if cancel is not None and cancel.is_set():
                raise Cancelled("Fisher pass cancelled.")
            prompt = tokenizer(ex.prompt)["input_ids"]
            if not prompt:
                raise RamStudioError(f"an example of task {data.task} has an empty prompt.", "Check the task's data.")
            answer = answer_for(module, tokenizer, ex, rule, prompt, eos, seed * 1_000_003 + i)
            stats.examples += 1
            stats.answer_tokens += len(answer)
            if answer:
                _log_likelihood(module, prompt, answer, device, keep).backward()
            else:
                stats.empty_answers += 1  # log p(empty) has no gradient here: counted in N, adds zero
            if i + 1 in snapshots:  # seconds of compute to reach this N: earlier snapshots' writing excluded
                t1 = time.perf_counter()
                stats.seconds[i + 1] = t1 - t0 - writing
                stats.no_gradient = accs.untouched()
                if device.type == "cuda":
                    stats.peak_device_bytes = int(torch.cuda.max_memory_allocated(device))
                on_snapshot(i + 1, stats, accs.mean(i + 1))
                writing += time.perf_counter() - t1
            if progress is not None:
                progress(i + 1, total, f"{data.task}: example {i + 1} of {total}")
    finally:
        accs.close()
        torch.set_num_threads(threads)
    return stats


def _log_likelihood(module: torch.nn.Module, prompt: list[int], answer: list[int], device: torch.device,
                    keep: bool) -> torch.Tensor:
    """Σ_i log p(answer_i | prompt, answer_<i) in float32, through the model's forward."""
    ids = torch.tensor([prompt + answer], device=device)
    k = len(answer)
    if keep:  # only the positions that predict the answer (a 150k-token vocabulary times a long prompt is large)
        logits = module(input_ids=ids, logits_to_keep=k + 1).logits[0, :-1]
    else:
        logits = module(input_ids=ids).logits[0, len(prompt) - 1:-1]
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return logp.gather(1, torch.tensor(answer, device=device)[:, None]).sum()


def answer_for(module: torch.nn.Module, tokenizer: Any, ex: FisherExample, rule: str, prompt: list[int],
               eos: int | None, seed: int) -> list[int]:
    """The answer's token ids: the reference (with end-of-text), or the agent's greedy or sampled answer."""
    if rule == "reference":
        if ex.answer is None:
            raise RamStudioError("this task has no reference answers.", "Use --fisher-rule sampled or greedy.")
        ids = tokenizer(ex.answer, add_special_tokens=False)["input_ids"]
        return list(ids) + ([eos] if eos is not None else [])
    return _generate(module, tokenizer, prompt, ex, eos, None if rule == "greedy" else seed)


@torch.no_grad()
def _generate(module: torch.nn.Module, tokenizer: Any, prompt: list[int], ex: FisherExample, eos: int,
              seed: int | None) -> list[int]:
    """Decode up to `max_new_tokens` with a KV cache: argmax (seed None) or one sample from the softmax at
    temperature 1 (a generator seeded per example, so example i's answer never depends on N). A stop string
    ends the answer there (cut as text and tokenized again, without end-of-text)."""
    device = next(module.parameters()).device
    gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    # transformers 5 names the KV cache `cache`; earlier versions (and some models) `past_key_values`
    arg = "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"
    out = module(input_ids=torch.tensor([prompt], device=device), use_cache=True)
    new: list[int] = []
    for _ in range(ex.max_new_tokens):
        logits = out.logits[0, -1].to(torch.float32)
        tok = int(logits.argmax()) if gen is None else int(torch.multinomial(torch.softmax(logits, -1), 1,
                                                                              generator=gen))
        new.append(tok)
        if tok == eos:
            break
        if ex.stop:
            text = tokenizer.decode(new, skip_special_tokens=True)
            cut = min((text.index(s) for s in ex.stop if s in text), default=None)
            if cut is not None:
                return list(tokenizer(text[:cut], add_special_tokens=False)["input_ids"])
        past = out.cache if arg == "cache" else out.past_key_values
        out = module(input_ids=torch.tensor([[tok]], device=device), use_cache=True, **{arg: past})
    return new

"""`ram-studio evaluate`: score one model on the demo's tasks or on lm-evaluation-harness tasks (accuracy in %)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from merging.common.errors import RamStudioError, printable
from ram_studio.commands.evaluator_options import add_evaluator_options, quiet_library_progress
from ram_studio.console import QUIET_HELP, say, stop_on_signal, table
from ram_studio.inputs import prefetch


def add_parser(sub) -> None:
    """The `evaluate` subcommand and its options."""
    sp = sub.add_parser("evaluate", help="score a model on the demo's tasks or on lm-evaluation-harness tasks",
                        description="Score one model: on the demo's code/tool/memory tasks (greedy decoding, the "
                                    "tasks' verifiers), or with --lm-eval on lm-evaluation-harness tasks. Accuracy "
                                    "in %.")
    sp.add_argument("model", help="model: folder, org/name[@revision] or demo:NAME (demo:base, demo:tool, …)")
    add_evaluator_options(sp)
    sp.add_argument("--split", default="test", metavar="validation|test",
                    help="which split to score (default test); lm-eval: validation scores each task's TASK_validation "
                         "companion or its own validation split")
    sp.add_argument("--limit", type=int, default=None, metavar="N",
                    help="score only the first N examples of each task (a quick look; not comparable to full scores)")
    sp.add_argument("--json", metavar="FILE", help="also write the scores as JSON (the placement rules of "
                                                  "analyze --json: never inside an input, never over a file without "
                                                  "--overwrite)")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    sp.add_argument("--quiet", action="store_true", help=QUIET_HELP)
    sp.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Check the options and the model, score it, print the table and write --json."""
    quiet_library_progress()
    from ram_studio.commands.evaluator_options import build_evaluator

    if args.limit is not None and args.limit < 1:
        raise RamStudioError(f"--limit {args.limit} is not a positive number of examples.", "Give --limit 1 or more.")
    evaluator = build_evaluator(args)
    if args.split not in evaluator.splits():
        raise RamStudioError(f"the {evaluator.name} tasks {', '.join(evaluator.tasks)} have no {args.split} split "
                             f"to score.", f"Choose --split {' or '.join(evaluator.splits())}.")
    from merging.reading.checkpoint import open_checkpoint

    with stop_on_signal() as stop:
        prefetch([args.model], args.quiet, stop)
    ckpt = open_checkpoint(args.model)  # safetensors only: a pickle-only or adapter folder is refused here
    if args.lm_eval is None and not args.suite:  # the demo's tasks: the suite the model's config.json names
        evaluator = build_evaluator(args, suite_folder=ckpt.folder)
    out = json_output(args, ckpt)
    if args.lm_eval is None:  # the demo's tasks: the model's own tokenizer must fit them
        refuse_unless_demo_compatible(ckpt)
    frame, scores = score_model(evaluator, evaluator.load(ckpt.folder), args)
    _print_scores(args, evaluator, frame, scores)
    if out is not None:
        write_scores_json(out, args, ckpt, evaluator, frame, scores)
    return 0


def json_output(args: argparse.Namespace, ckpt) -> Path | None:
    """The checked --json path (never inside the model or the --include-path folder), or None."""
    if not args.json:
        return None
    from merging.writing.checked_output import check_output_file
    from merging.writing.placement import protected_paths

    inputs = [(ckpt.ref.raw, ckpt.folder)]
    inputs += [("--include-path", Path(args.include_path))] if args.include_path else []
    return check_output_file(args.json, protected_paths(inputs), overwrite=args.overwrite)


def score_model(evaluator, loaded, args: argparse.Namespace, progress=None):
    """The per-subset frame (the demo's tasks; else None) and the scores of the loaded model on --split;
    progress to `progress` (examples done, in all, what), else to stderr unless --quiet."""
    from ram_studio.commands.evaluator_options import progress_printer

    with stop_on_signal() as stop:
        if progress is None and not args.quiet:
            progress = progress_printer("evaluate")
        if hasattr(evaluator, "frame"):  # the demo's tasks: the per-subset table too
            t0 = time.perf_counter()
            frame = evaluator.frame(loaded, args.split, limit=args.limit, cancel=stop, progress=progress)
            from demo.evaluator import scores_from_frame

            return frame, scores_from_frame(frame, args.split, time.perf_counter() - t0)
        return None, evaluator.score(loaded, args.split, limit=args.limit, cancel=stop, progress=progress)


def _print_scores(args: argparse.Namespace, evaluator, frame, scores) -> None:
    """The heading line (model, evaluator, suite, split, limit, seconds), the table and the average."""
    from ram_studio.commands.evaluator_options import display_frame

    suite = getattr(evaluator, "suite", None)
    say(f"{printable(args.model)} · {evaluator.name}" + (f" (suite {suite.name})" if suite else "")
          + f" · {args.split} split" + (f" · first {args.limit} examples per task" if args.limit else "")
          + f" · {scores.seconds:.1f} s")
    say(table(display_frame(frame, scores)))
    se = scores.average_stderr
    say(f"average over {len(scores.scores)} task(s): {scores.average:.2f} %"
        + ("" if se is None else f" ± {se:.2f} (standard error, √(Σ se²)/{len(scores.scores)} over the tasks)"))


def write_scores_json(out: Path, args: argparse.Namespace, ckpt, evaluator, frame, scores) -> None:
    """The scores, what was scored and how, and (demo tasks) every per-subset row, as JSON."""
    from merging.writing.checked_output import write_file_atomically

    doc = json_document(args, ckpt, evaluator, frame, scores)
    write_file_atomically(out, (json.dumps(doc, indent=2) + "\n").encode())


def json_document(args: argparse.Namespace, ckpt, evaluator, frame, scores) -> dict:
    """What --json writes: the model, the evaluator and its fingerprint, the split, the scores with their standard
    errors and detail, one result entry per task (and subset) with its n and stderr, and the per-example outcomes."""
    from analysis.noise import pack_outcomes

    suite = getattr(evaluator, "suite", None)
    doc = {"model": args.model, "folder": str(ckpt.folder), "evaluator": evaluator.name,
           "suite": suite.name if suite else None,
           "fingerprint": evaluator.fingerprint(), "tasks": list(evaluator.tasks), "split": args.split,
           "limit": args.limit, "scores": scores.scores, "average": scores.average, "n": scores.n,
           "stderr": {**{t: scores.stderr.get(t) for t in scores.scores}, "average": scores.average_stderr},
           "detail": scores.detail, "detail_stderr": scores.detail_stderr, "seconds": round(scores.seconds, 3),
           "results": result_records(frame, scores), "outcomes": pack_outcomes(scores.outcomes)}
    return doc


def result_records(frame, scores) -> list[dict]:
    """One record per task (and, on the demo's tasks, per subset): n, accuracy and its standard error as
    fractions (the demo's records also count correct and habit answers)."""
    from analysis.noise import binomial_se

    if frame is not None:
        recs = frame.to_dict(orient="records")
        for r in recs:
            se = binomial_se(100.0 * r["accuracy"], int(r["n"]))
            r["stderr"] = None if se is None else se / 100.0
        return recs
    return [{"task": t, "subset": "all", "n": scores.n.get(t, 0), "accuracy": v / 100.0,
             "stderr": None if scores.stderr.get(t) is None else scores.stderr[t] / 100.0}
            for t, v in scores.scores.items()]


def refuse_unless_demo_compatible(ckpt) -> None:
    """`evaluate` scores with the model's own tokenizer on the demo's tasks: the folder must hold a tokenizer
    (tokenizer.json) whose every token id has a row in the model's embedding, and a causal LM config. Said in
    one line before anything is loaded, never an IndexError from inside the model."""
    from merging.reading.model_folder import MAX_SMALL_FILE, check_file

    name = printable(ckpt.folder)
    hint = ("`evaluate` scores models built from the demo base (its tokenizer and tasks); for other models use an "
            "lm-evaluation-harness task.")
    try:
        ident = check_file(ckpt.folder, "tokenizer.json", max_bytes=MAX_SMALL_FILE)
    except FileNotFoundError:
        raise RamStudioError(f"{name} has no tokenizer.json, so it cannot be scored on the demo's tasks.",
                             hint) from None
    embed = next((e for n, e in ckpt.tensors.items() if n.endswith("embed_tokens.weight") and len(e.shape) == 2), None)
    if embed is None or not (ckpt.config or {}).get("architectures"):
        raise RamStudioError(f"{name} is not a causal language model with token embeddings "
                             "(no embed_tokens.weight, or no architectures in config.json).", hint)
    try:
        from tokenizers import Tokenizer

        size = Tokenizer.from_file(str(ident.path)).get_vocab_size(with_added_tokens=True)
    except Exception:  # noqa: BLE001 — the tokenizers library raises its own exception type
        raise RamStudioError(f"{name}/tokenizer.json could not be read as a tokenizer.", hint) from None
    if size == 0 or size > embed.shape[0]:
        raise RamStudioError(f"{name} is not a demo-compatible model: its tokenizer has {size:,} tokens and its "
                             f"embedding {embed.shape[0]:,} rows.", hint)

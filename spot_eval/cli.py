"""`spot-eval`: the project's command line. Each subcommand parses its flags here and calls one
function elsewhere; bad input ends with `error: ...` and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from spot.config import DecodeConfig
from spot_eval.harness.options import add_flags, build, given, options
from spot_eval.harness.settings import DRAFT_TIMEOUT, MAX_BUDGET, TargetSettings, resolve_target
from spot_eval.method import PluginError


@dataclass(frozen=True)
class Command:
    """One subcommand: its flags, and the function that runs it with the parsed arguments."""

    name: str
    help: str
    flags: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], None]


def _target_flags(p: argparse.ArgumentParser) -> None:
    """The flags that choose the target and where it runs (decode, profile, collect, spiffy-calibrate): the
    settings of TargetSettings and the decoder's block length, under lm_eval's model_args names."""
    add_flags(p, options(TargetSettings), only=("pretrained", "revision", "device", "dtype", "cache"))
    add_flags(p, options(DecodeConfig), only=("block_length",))


def _threads_flag(p: argparse.ArgumentParser, text: str | None = None) -> None:
    add_flags(p, options(TargetSettings), only=("threads",), helps={"threads": text} if text else None)


def _set_threads(args: argparse.Namespace) -> None:
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)


PLACEMENT = ("parallelize", "device_map", "max_memory_per_gpu", "max_cpu_memory", "offload_folder")


def _decode_flags(p: argparse.ArgumentParser) -> None:
    _target_flags(p)
    add_flags(p, options(TargetSettings), only=("exact", "threads", *PLACEMENT))
    p.add_argument("--method", default="draft_free", help="draft_free or a method (spot-eval methods lists them: the "
                                                          "built-in ones, installed plugins' and --plugins')")
    _plugins_flags(p)
    p.add_argument("--budget", default="0",
                   help="draft nodes per verify forward (0 with draft_free), or auto: sized per step by this device's verify cost")
    p.add_argument("--max-budget", type=int, default=MAX_BUDGET, help="the cap of --budget auto")
    p.add_argument("--drafter", default=None, help="the method's checkpoint (.pt) or Spiffy graph (.json); default: the shipped one")
    decoder = [o.name for o in options(DecodeConfig) if o.name != "block_length"]  # block_length: with the target's
    add_flags(p, options(DecodeConfig), only=decoder)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: the text, then stats)")


def _plugins_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugins", nargs="+", default=[], metavar="FILE",
                   help="plugin files (.py) or module names whose methods to add (docs/plugins.md)")
    p.add_argument("--draft-timeout", type=float, default=DRAFT_TIMEOUT,
                   help="seconds one draft of a plugin's method may take before it is stopped as hung")


def _decoder(args: argparse.Namespace) -> dict[str, object]:
    """The decoder's settings from the flags, refused here, before torch loads, wherever they are wrong whatever the
    checkpoint. An unset block length is the checkpoint's, so the one rule that reads it (steps <= block_length)
    waits for decode_prompt, which builds the config again once the checkpoint is read."""
    decoder = given(args, options(DecodeConfig))
    block_length = decoder.get("block_length") or decoder.get("steps") or DecodeConfig.block_length
    build(DecodeConfig, decoder, block_length=block_length)
    return decoder


def _decode(args: argparse.Namespace) -> None:
    decoder, budget, target = _decoder(args), _budget(args.budget), build(TargetSettings, given(args, options(TargetSettings)))
    from spot_eval.harness.decode import decode_prompt

    _set_threads(args)
    result = decode_prompt(target, decoder, args.method, budget, args.prompt, args.chat, args.drafter, args.max_budget,
                           tuple(args.plugins), args.draft_timeout)
    if args.json:
        print(json.dumps(result))
    else:
        print(result["text"])
        print(
            f"\n[{result['method']} budget {result['budget']}] {len(result['token_ids'])} tokens, "
            f"{result['forwards']} target forwards, {result['commit_steps']} commit steps, {result['seconds']:.2f} s",
            file=sys.stderr,
        )


def _methods_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plugins", nargs="+", default=[], metavar="FILE", help="plugin files (.py) or module names to list too")
    p.add_argument("--json", action="store_true", help="print one JSON object per method")


def _methods(args: argparse.Namespace) -> None:
    from spot_eval.harness.method_list import method_rows, method_table

    rows = method_rows(args.plugins)
    print("\n".join(json.dumps(row) for row in rows) if args.json else method_table(rows))


def _check_method_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("method", metavar="NAME[:PATH]", help="the method to check, and its file where it reads one")
    p.add_argument("--plugins", nargs="+", default=[], metavar="FILE", help="plugin files (.py) or modules that declare it")
    p.add_argument("--quick", action="store_true",
                   help="every pair of the grid's settings instead of every combination, 3 prompts (about a minute on a CPU)")
    add_flags(p, options(TargetSettings), only=("pretrained",), helps={
        "pretrained": "the target to check on, a checkpoint folder or a cached hub id (default: the embedded target), on the CPU"})
    _threads_flag(p)


def _check_method(args: argparse.Namespace) -> None:
    from spot_eval import registry
    from spot_eval.checkpoints.target import resolve_checkpoint
    from spot_eval.harness.conformance import check_method

    _set_threads(args)
    registry.load_plugins(args.plugins, "--plugins")
    name, _, path = args.method.partition(":")
    registry.entry(name)  # an unknown name: refused before anything loads
    target = resolve_checkpoint(args.pretrained, option="--pretrained")
    report = check_method(name, path or None, args.quick, target, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(report.table())
    raise SystemExit(0 if report.passed else 1)


def _check_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="PATH", help="a checkpoint directory (its config.json's model_type: a built-in family, "
                                                "or one an installed target plugin declares)")
    add_flags(p, options(DecodeConfig), only=("block_length",))
    add_flags(p, options(TargetSettings), only=("cache",))
    _threads_flag(p)


def _check_target(args: argparse.Namespace) -> None:
    from spot_eval.harness.target_check import check_target

    _set_threads(args)
    report = check_target(args.path, args.block_length, args.cache)
    print(report.table())
    raise SystemExit(0 if report.passed else 1)


def _budget(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--budget must be a whole number or auto, got {text!r}") from None


def _profile_flags(p: argparse.ArgumentParser) -> None:
    _target_flags(p)
    add_flags(p, options(TargetSettings), only=("exact",), helps={"exact": "profile the per-piece (exact) verify layout"})
    p.add_argument("--remeasure", action="store_true", help="measure again even when a cached profile matches")
    _threads_flag(p)


def _profile(args: argparse.Namespace) -> None:
    from spot_eval.checkpoints.target import load_target
    from spot_eval.harness.profile import cache_dir, profile_key, verify_profile

    _set_threads(args)
    path, device, dtype = resolve_target(args)
    target = load_target(path, args.block_length, device, args.exact, dtype, args.cache)
    profile = verify_profile(target, remeasure=args.remeasure)
    print(json.dumps({**profile.to_dict(), "file": str(cache_dir() / f"{profile_key(target).digest()}.json")}))


def _placement_flags(p: argparse.ArgumentParser) -> None:
    add_flags(p, options(TargetSettings), only=("pretrained", "revision", "device", "dtype", *PLACEMENT))
    p.add_argument("--gpus", type=int, default=None,
                   help="plan for this many GPUs of --max-memory-per-gpu each instead of the visible ones (a machine "
                        "you have not got yet)")
    p.add_argument("--json", action="store_true", help="print one JSON object: the map and the bytes on each device")


def _placement(args: argparse.Namespace) -> None:
    from spot_eval.checkpoints.target import CONFIG_FILES, read_target, resolve_checkpoint
    from spot_eval.harness.placement import describe, plan_placement
    from spot_eval.harness.settings import resolve_device, resolve_dtype

    target = build(TargetSettings, given(args, options(TargetSettings)))
    if args.gpus is None:
        device = resolve_device("--device", target.device)
        free = None
    else:
        if args.gpus < 1 or target.max_memory_per_gpu is None:
            raise ValueError("--gpus N plans for N GPUs of --max-memory-per-gpu each: give both (N >= 1)")
        import logging

        from spot_eval.harness.placement import parse_size

        device = "cuda:0"
        logging.getLogger("accelerate.utils.modeling").setLevel(logging.ERROR)  # "device N is not available": planned
        cpu = parse_size("--max-cpu-memory", target.max_cpu_memory) if target.max_cpu_memory else 0
        free = {"cpu": cpu}
        if not (target.parallelize or target.device_map):
            target = dataclasses.replace(target, parallelize=True)
    if not (target.parallelize or target.device_map):
        raise ValueError("nothing to plan: give --parallelize or --device-map (and the memory and offload flags)")
    dtype = resolve_dtype("--dtype", target.dtype, device)
    checkpoint = read_target(resolve_checkpoint(target.pretrained, target.revision, "--pretrained", CONFIG_FILES))
    planned = plan_placement(target, device, checkpoint, dtype, gpus=args.gpus, local=(1, 0) if args.gpus else None, free=free)
    if args.json:
        print(json.dumps({"device_map": dict(planned.placement.device_map),
                          "bytes": {str(d): n for d, n in planned.bytes_by_device},
                          "largest_layer": dict([planned.largest_layer]), "dtype": str(dtype).removeprefix("torch.")}))
        return
    print(f"{checkpoint.path} in {str(dtype).removeprefix('torch.')}, {checkpoint.info.model_type}:")
    print("\n".join(describe(planned)))


def _calibrate_reach_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True,
                   help="the SPOT checkpoint or SPOT-R file (.pt) to calibrate (a SPOT-R file also gets SPOT-RC's order "
                        "temperature, chosen by its trees)")
    p.add_argument("--trajectories", nargs="+", required=True, help="the trajectory dirs the drafter was trained on")
    p.add_argument("--budget", type=int, default=20, help="the tree size to replay (budget=auto's cap)")
    p.add_argument("--max-blocks", type=int, default=200, help="held-out blocks replayed")
    p.add_argument("--all-blocks", action="store_true",
                   help="use every block, not the training's held-out split: trajectories collected apart from the "
                        "drafter's training data (collect --seed N on other prompts)")
    p.add_argument("--order-temperature", type=float, default=None,
                   help="a SPOT-R file: keep SPOT-RC's order temperature at this value instead of choosing it by its trees")
    p.add_argument("--out", default=None, help="where to save (default: update --drafter in place)")


def _calibrate_reach(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from spot_eval.training.calibrate_reach import calibrate_reach_command

    if args.budget < 1:
        raise ValueError(f"--budget must be >= 1, got {args.budget}")
    if args.order_temperature is not None and not args.order_temperature > 0:
        raise ValueError(f"--order-temperature must be positive, got {args.order_temperature}; leave it out to choose one")
    bar = []

    def progress(done: int, total: int) -> None:  # a SPOT-R file's replays (a SPOT checkpoint's report none)
        if not bar:
            bar.append(tqdm(desc="calibrating", unit="block", total=total, file=sys.stderr))
        bar[0].update(done - bar[0].n)

    report = calibrate_reach_command(args.drafter, args.trajectories, args.budget, args.out, args.max_blocks,
                                     args.all_blocks, progress, args.order_temperature)
    if bar:
        bar[0].close()
    print(json.dumps(report))


def _fit_sets_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trajectories", nargs="+", required=True, help="directories from spot-eval collect --policy threshold")
    p.add_argument("--out", default=None, help="the set predictor JSON to write (with --refresh: the SPOT-R file to write; "
                                               "default: update it in place)")
    p.add_argument("--depths", type=int, default=4, help="tree depths with coefficients of their own (deeper ones share the last)")
    p.add_argument("--refresh", default=None, metavar="SPOT_R.pt",
                   help="fit SPOT-RS's rule (the method sets_r) on this SPOT-R drafter's refreshed confidences instead, on "
                        "trajectories recorded in its projections (collect --projections-from), and store it in the file")


def _fit_sets(args: argparse.Namespace) -> None:
    from spot_eval.training.fit_sets import fit_refreshed_sets_command, fit_sets_command

    if args.depths < 1:
        raise ValueError(f"--depths must be >= 1, got {args.depths}")
    if args.refresh is not None:
        print(json.dumps(fit_refreshed_sets_command(args.refresh, args.trajectories, args.out or args.refresh, args.depths)))
    elif args.out is None:
        raise ValueError("fit-sets needs --out, the set predictor JSON to write (or --refresh SPOT_R.pt for SPOT-RS's rule)")
    else:
        print(json.dumps(fit_sets_command(args.trajectories, args.out, args.depths)))


def _train_sets_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trajectories", nargs="+", required=True,
                   help="directories from spot-eval collect --policy threshold --hidden-dims 64 (one collect's projections)")
    p.add_argument("--out", required=True, help="the set model (.pt) to write")
    p.add_argument("--init-from", default=None,
                   help="a set model of another target to calibrate for this one (its network continues training)")
    p.add_argument("--prompts", type=int, default=None, help="train on the first N recorded requests only (default: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: --epochs passes)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--max-depth", type=int, default=4, help="train on tree depths 0 .. max_depth - 1")
    p.add_argument("--position-weight", type=float, default=1.0,
                   help="weight of a cross-entropy over the masked positions on single-commit steps (0: off; default 1)")
    p.add_argument("--heldout", type=float, default=0.1, help="fraction of the requests held out for the report")
    p.add_argument("--minutes", type=float, default=None, help="safety cap: stop early (and say so) after it")
    p.add_argument("--device", default="cpu")
    _threads_flag(p)


def _train_sets(args: argparse.Namespace) -> None:
    from spot.drafters.order_training import Progress
    from spot.drafters.set_training import SetTrainConfig
    from spot_eval.training.train_sets import train_sets_command

    _set_threads(args)
    config = SetTrainConfig(
        seed=args.seed, steps=args.steps, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, max_depth=args.max_depth,
        heldout_fraction=args.heldout, max_seconds=None if args.minutes is None else 60 * args.minutes, device=args.device,
        position_weight=args.position_weight,
    )

    def progress(p: Progress) -> None:
        print(f"step {p.step}/{p.steps} loss {p.loss:.4f} lr {p.lr:.2e} {p.seconds:.0f} s", file=sys.stderr, flush=True)

    metrics = train_sets_command(args.trajectories, args.out, config, args.init_from, args.prompts, progress)
    print(f"set model parameters: {metrics['parameters']}", file=sys.stderr)
    print(json.dumps({"out": args.out, **metrics}))


def _train_refresh_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trajectories", required=True,
                   help="a directory from spot-eval collect --hidden-dims 64 (single-commit, with its projections)")
    p.add_argument("--order-model", required=True, help="the SPOT drafter (.pt) whose trees the head refreshes")
    p.add_argument("--out", required=True, help="the SPOT-R drafter (.pt) to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--heldout", type=float, default=0.25, help="fraction of the requests held out for the report")
    p.add_argument("--order-temperature", type=float, default=None,
                   help="SPOT-RC's order temperature (default: the one whose trees, replayed over the held-out requests at "
                        "8 states, commit the most per verify forward)")
    p.add_argument("--reach-budget", type=int, default=20,
                   help="the tree size both trees' reach is calibrated at, for budget=auto (its cap)")
    p.add_argument("--max-blocks", type=int, default=200, help="held-out blocks replayed to calibrate")
    _threads_flag(p)


def _train_refresh(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from spot.drafters.refresh_training import RefreshTrainConfig
    from spot_eval.training.train_refresh import train_refresh_command

    _set_threads(args)
    config = RefreshTrainConfig(seed=args.seed, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                heldout_fraction=args.heldout)
    with (tqdm(desc="examples", unit="block", file=sys.stderr) as blocks,
          tqdm(total=args.steps, desc="training", unit="step", file=sys.stderr) as steps,
          tqdm(desc="calibrating", unit="block", file=sys.stderr) as replays):
        def examples(done: int, total: int) -> None:
            blocks.total = total
            blocks.update(done - blocks.n)

        def progress(step: int, loss: float) -> None:
            steps.update(step - steps.n)
            steps.set_postfix(loss=f"{loss:.3f}", refresh=False)

        def calibrating(done: int, total: int) -> None:  # SPOT-RC's order temperature, then both trees' reach
            replays.total = total
            replays.update(done - replays.n)

        metrics = train_refresh_command(args.trajectories, args.order_model, args.out, config, examples, progress,
                                        args.order_temperature, args.reach_budget, args.max_blocks, calibrating)
    print(json.dumps({"out": args.out, **metrics}))


def _train_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output model directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (fix the weights with the seed)")
    p.add_argument("--minutes", type=float, default=59.0, help="safety cap: stop early (and say so) after it")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    _threads_flag(p)
    p.add_argument("--batch-tokens", type=int, default=None, help="sequence positions per batch")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--warmup", type=int, default=None, help="linear warm-up steps")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=None)
    p.add_argument("--sources", nargs="+", default=["gsm8k", "math", "mbpp"], help="training pair sources")
    p.add_argument("--fp32", action="store_true", help="no bfloat16 autocast")


def _train_target(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from spot_eval.training.corpus import training_pairs
    from spot_eval.training.train_target import TrainConfig, train

    config = TrainConfig(
        seed=args.seed, minutes=args.minutes, device=args.device, threads=args.threads, bf16=not args.fp32
    )
    overrides = {
        "steps": args.steps,
        "batch_tokens": args.batch_tokens,
        "lr": args.lr,
        "warmup": args.warmup,
        "vocab_size": args.vocab_size,
    }
    config = replace(config, **{k: v for k, v in overrides.items() if v is not None})
    if args.layers is not None:
        config = replace(config, model=replace(config.model, layers=args.layers))
    log = train(config, training_pairs(tuple(args.sources)), args.out)
    summary = {k: log[k] for k in ("parameters", "steps", "stopped_early", "wall_seconds")}
    summary |= {k: v for k, v in log.items() if k.startswith("heldout_loss_block")}
    print(json.dumps({"out": args.out, **summary, "final_train_loss": log["curve"][-1]["loss"]}))


def _collect_flags(p: argparse.ArgumentParser) -> None:
    _target_flags(p)
    p.add_argument("--out", required=True, help="trajectory directory (resumable: finished shards are skipped)")
    add_flags(p, options(DecodeConfig), only=("unmasking", "threshold", "gen_length", "seed"),
              helps={"unmasking": "the policy to record: single | threshold", "seed": "fixes the prompt sample and the "
                     "sampling noise"})
    p.add_argument("--prompts", type=int, required=True, help="training prompts to decode (a seeded sample)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated; they cycle over the prompts")
    p.add_argument("--shard-size", type=int, default=32, help="requests per shard")
    p.add_argument("--topk", type=int, default=32, help="stale log-probabilities recorded per position")
    p.add_argument("--hidden-dims", type=int, default=0,
                   help="also record the hidden states, projected on this many principal components (SPOT-Sets' set model "
                        "reads 64; 0: none)")
    p.add_argument("--embedding-dims", type=int, default=32, help="token-embedding components saved with --hidden-dims")
    p.add_argument("--projections-from", default=None, metavar="SPOT_R.pt",
                   help="record the hidden states in this SPOT-R drafter's projections (to fit SPOT-RS on: fit-sets --refresh)")
    p.add_argument("--sources", nargs="+", default=["gsm8k", "math", "mbpp"], help="training pair sources")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True, help="wrap prompts in the chat template")
    p.add_argument("--workers", type=int, default=1, help="decoding processes (each loads the target)")
    _threads_flag(p, "torch CPU threads per process (default: torch's choice, or the cores shared out among --workers)")


def _parse_floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers like 0,1; got {text!r}") from None


def _collect(args: argparse.Namespace) -> None:
    from spot_eval.training.collect import collect

    _set_threads(args)
    path, device, dtype = resolve_target(args)
    result = collect(
        target=path,
        dtype=dtype,
        cache=args.cache,
        out=args.out,
        policy=args.unmasking,
        block_length=args.block_length,
        gen_length=args.gen_length,
        prompts=args.prompts,
        temperatures=_parse_floats(args.temperatures, "--temperatures"),
        seed=args.seed,
        shard_size=args.shard_size,
        chat=args.chat,
        topk=args.topk,
        threshold=args.threshold,
        sources=tuple(args.sources),
        device=device,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        workers=args.workers,
        threads=args.threads,
        hidden_dims=args.hidden_dims,
        embedding_dims=args.embedding_dims,
        projections_from=args.projections_from,
    )
    print(json.dumps(dataclasses.asdict(result)))


def _train_drafter_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trajectories", nargs="+", required=True, help="trajectory directories (one target and block length)")
    p.add_argument("--out", required=True, help="the drafter checkpoint (.pt) to write")
    add_flags(p, options(DecodeConfig), only=("unmasking",), helps={"unmasking": "the policy the trajectories were recorded with"})
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: --epochs passes)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-depth", type=int, default=1,
                   help="train on tree depths 0 .. max_depth - 1 (the default drafter scores depth 0 only; "
                   "deeper depths serve SpotDrafter(model_depth > 1))")
    p.add_argument("--confidence-weight", type=float, default=1.0,
                   help="weight of the auxiliary loss on every position's confidence at the target's real step (0: off)")
    p.add_argument("--heldout", type=float, default=0.1, help="fraction of the requests held out")
    p.add_argument("--minutes", type=float, default=None, help="safety cap: stop early (and say so) after this long")
    p.add_argument("--device", default="cpu")
    _threads_flag(p)


def _train_drafter(args: argparse.Namespace) -> None:
    from spot.drafters.order_training import Progress, TrainConfig
    from spot_eval.training.train_drafter import train_drafter

    _set_threads(args)
    config = TrainConfig(
        seed=args.seed,
        steps=args.steps,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        max_depth=args.max_depth,
        confidence_weight=args.confidence_weight,
        heldout_fraction=args.heldout,
        max_seconds=None if args.minutes is None else 60 * args.minutes,
        device=args.device,
    )

    def progress(p: Progress) -> None:
        print(f"step {p.step}/{p.steps} loss {p.loss:.4f} lr {p.lr:.2e} {p.seconds:.0f} s", file=sys.stderr, flush=True)

    metrics = train_drafter(args.trajectories, args.out, args.unmasking, config, progress)
    print(f"order model parameters: {metrics['parameters']}", file=sys.stderr)
    print(json.dumps({"out": args.out, **{k: v for k, v in metrics.items() if k != "config"}}))


def _spiffy_calibrate_flags(p: argparse.ArgumentParser) -> None:
    _target_flags(p)
    p.add_argument("--out", required=True, help="the graph JSON to write")
    p.add_argument("--prompts", type=int, default=50, help="calibration prompts: half MATH train, half MBPP train")
    p.add_argument("--max-nodes", type=int, default=10, help="graph nodes beyond the root (Spiffy's D)")
    p.add_argument("--max-depth", type=int, default=6, help="deepest future counted (steps ahead)")
    p.add_argument("--topk", type=int, default=8, help="vocab ranks j counted; rarer futures are skipped")
    add_flags(p, options(DecodeConfig), only=("gen_length", "unmasking", "threshold"),
              helps={"unmasking": "the policy the graph serves: single | threshold"})
    p.add_argument("--seed", type=int, default=0, help="fixes the prompt sample")
    p.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True, help="wrap prompts in the chat template")
    _threads_flag(p)


def _spiffy_calibrate(args: argparse.Namespace) -> None:
    from spot_eval.training.spiffy_calibrate import calibrate

    _set_threads(args)
    path, device, dtype = resolve_target(args)
    result = calibrate(
        target=path,
        dtype=dtype,
        cache=args.cache,
        out=args.out,
        block_length=args.block_length,
        prompts=args.prompts,
        nodes=args.max_nodes,
        seed=args.seed,
        max_depth=args.max_depth,
        topk=args.topk,
        gen_length=args.gen_length,
        policy=args.unmasking,
        threshold=args.threshold,
        chat=args.chat,
        device=device,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(json.dumps(dataclasses.asdict(result)))


def _sync_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spool", default=None, help="spool directory (default: spot-eval-spool)")
    p.add_argument("--tracking-uri", default=None, help="default: the store each run was meant for")


def _sync(args: argparse.Namespace) -> None:
    from spot_eval.tracking.store import TrackingUnavailable, check_uri

    check_uri("--tracking-uri", args.tracking_uri)
    from spot_eval.tracking.sync import sync  # mlflow loads after the flags are checked

    try:
        for line in sync(args.spool, args.tracking_uri):
            print(line, flush=True)
    except TrackingUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _fit_gamma_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", required=True, help="the SPOT checkpoint (.pt) to fit for")
    p.add_argument("--trajectories", nargs="+", required=True, help="the trajectory dirs the drafter was trained on")
    p.add_argument("--budget", type=int, default=20, help="the draft budget to fit for")
    p.add_argument("--max-blocks", type=int, default=200, help="held-out blocks replayed per grid point")
    p.add_argument("--out", default=None, help="where to save (default: update --drafter in place)")


def _fit_gamma(args: argparse.Namespace) -> None:
    from spot_eval.training.fit_gamma import fit_gamma_command

    if args.budget < 1:
        raise ValueError(f"--budget must be >= 1, got {args.budget}")
    report = fit_gamma_command(args.drafter, args.trajectories, args.budget, args.out, args.max_blocks)
    print(json.dumps({k: v for k, v in report.items() if k != "grid"}))


def _nightly_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default=None, help="suite TOML (default: spot_eval/reports/suites/nightly.toml)")
    p.add_argument("--out", default="results/nightly", help="reports go to OUT/<date>/")
    p.add_argument("--date", default=None, help="report name (default: today, YYYY-MM-DD); a rerun resumes its runs")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite:///mlflow.db here)")
    p.add_argument("--baseline", default=None, help="a pinned results bundle (nightly.json) instead of the previous nightly")
    p.add_argument("--dry-run", action="store_true", help="report, but exit 0 even on a regression")
    p.add_argument("--num-processes", type=int, default=None,
                   help="run each lm_eval under accelerate launch on this many processes (default: the suite's num_processes)")


def _nightly(args: argparse.Namespace) -> None:
    from spot_eval.tracking.store import check_uri

    check_uri("--tracking-uri", args.tracking_uri)
    # pandas and mlflow load after the flags are checked
    from spot_eval.reports.nightly import NightlyError, load_suite, nightly

    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        suite = load_suite(args.suite)
        if args.num_processes is not None:
            suite = dataclasses.replace(suite, num_processes=args.num_processes)
        result = nightly(suite, args.out, args.tracking_uri, args.baseline, args.dry_run, args.date, log)
    except NightlyError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(result.summary.replace("**", ""))
    print(f"report: {result.report_dir / 'report.html'} (and report.md)")
    raise SystemExit(result.exit_code)


def _compare_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", nargs="+", default=None, help="results bundles (nightly.json) or run directories")
    p.add_argument("--experiment", default=None, help="read the lm_eval runs of this MLflow experiment")
    p.add_argument("--runs", nargs="+", default=None, help="only these MLflow run ids")
    p.add_argument("--tracking-uri", default=None, help="default: sqlite:///mlflow.db here")
    p.add_argument("--out", default="results/compare", help="output directory")


def _compare(args: argparse.Namespace) -> None:
    from spot_eval.tracking.store import check_uri

    check_uri("--tracking-uri", args.tracking_uri)
    if not args.results and not args.experiment:
        raise ValueError("compare needs --experiment NAME (MLflow) or --results FILE... (bundles or run directories)")
    # pandas, matplotlib and mlflow load after the flags are checked
    from spot_eval.reports.compare import write_comparison
    from spot_eval.reports.history import HistoryError, evaluation_bundle
    from spot_eval.reports.results import combine, read_any

    bundle = None
    if args.experiment:
        try:
            bundle = evaluation_bundle(args.tracking_uri, args.experiment, args.runs)
        except HistoryError as err:
            if not args.results:
                print(f"error: {err}", file=sys.stderr)
                raise SystemExit(2) from None
            warnings.warn(f"{err}; using the results files instead", stacklevel=1)
    if bundle is None:
        bundle = combine([read_any(path) for path in args.results])
    for path in write_comparison(bundle, args.out):
        print(path)


def _cache_datasets_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache-dir", default=None,
                   help="the datasets cache to write (default: datasets' HF_DATASETS_CACHE, under HF_HOME)")
    p.add_argument("--modules-cache", default=None,
                   help="evaluate's module cache, where the sandboxed code_eval goes (default: HF_MODULES_CACHE, under HF_HOME)")


def _cache_datasets(args: argparse.Namespace) -> None:
    from spot_eval.data.hub_cache import cache_datasets
    from spot_eval.execution.metric_cache import install_code_eval

    for done in cache_datasets(args.cache_dir):
        rows = ", ".join(f"{split} {n}" for split, n in done.rows.items())
        print(f"{'wrote' if done.wrote else 'already there, the same rows:'} {done.repo_id} ({done.config}; {rows}) in {done.path}")
    shim, others = install_code_eval(args.modules_cache)
    print(f"installed spot-eval's SANDBOXED code_eval as evaluate's 'code_eval' in {shim}: lm-eval's mbpp and humaneval now "
          "run model-written code in spot-eval's sandbox, not in the harness process (HF_ALLOW_CODE_EVAL=1 and "
          "--confirm_run_unsafe_code are still required)")
    for other in others:
        print(f"note: another code_eval is cached in {other}; evaluate loads the newest, which is now spot-eval's")
    print("lm-eval's gsm8k, minerva_math500, mbpp and humaneval now load with HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1")


COMMANDS = (
    Command("decode", "decode one prompt with a method and print one JSON object", _decode_flags, _decode),
    Command("train-target", "train the embedded target (BPE tokenizer, block-diffusion Qwen3) from scratch", _train_target_flags, _train_target),
    Command("collect", "record draft-free trajectories of a target on training prompts (drafter data)", _collect_flags, _collect),
    Command("train-drafter", "train SPOT's order model on collected trajectories and save the drafter", _train_drafter_flags, _train_drafter),
    Command("spiffy-calibrate", "calibrate Spiffy's draft graph for a target on training prompts", _spiffy_calibrate_flags, _spiffy_calibrate),
    Command("sync", "replay the runs spooled during an MLflow outage into the tracking store", _sync_flags, _sync),
    Command("fit-gamma", "fit SPOT-gamma's per-depth exponents on held-out trajectories", _fit_gamma_flags, _fit_gamma),
    Command("calibrate-reach", "fit the reach calibration budget=auto sizes SPOT's trees by", _calibrate_reach_flags, _calibrate_reach),
    Command("fit-sets", "fit SPOT-Sets' stale set predictor (or SPOT-RS's rule) on threshold trajectories", _fit_sets_flags,
            _fit_sets),
    Command("train-refresh", "train SPOT-R's refresh head on trajectories with hidden states, beside a SPOT drafter",
            _train_refresh_flags, _train_refresh),
    Command("train-sets", "train (or --init-from: calibrate) SPOT-Sets' set model on threshold trajectories", _train_sets_flags,
            _train_sets),
    Command("placement", "show how a target's weights would spread over the devices (parallelize, device_map, max "
                         "memory, offload), before any weights load", _placement_flags, _placement),
    Command("profile", "measure (or show the cached) verify-cost profile of a target on this device", _profile_flags, _profile),
    Command("nightly", "run a suite through lm-eval, compare with a baseline, write a report, gate", _nightly_flags, _nightly),
    Command("cache-datasets", "write the vendored GSM8K, MATH-500, MBPP and HumanEval (and a sandboxed code_eval) where lm-eval's own tasks load them offline",
            _cache_datasets_flags, _cache_datasets),
    Command("compare", "SPOT vs Spiffy tables (throughput and forward ratios) from MLflow or results files", _compare_flags, _compare),
    Command("methods", "every method a run can name: where it comes from, what it reads, what a new target costs it, "
            "whether it is exact", _methods_flags, _methods),
    Command("check-method", "prove a method (a plugin's too) lossless and well-behaved across the property grid, and "
            "rank its forwards saved beside FreeDave and SPOT", _check_method_flags, _check_method),
    Command("check-target", "check that a checkpoint's target (a target plugin's too) keeps the invariants the engine "
            "relies on: cache, pieces, batch, cross pieces, its reference decode", _check_target_flags, _check_target),
)


# The documentation: the repository's docs/ folder, a site by `mkdocs serve` (it is not published), and the page
# each command's --help names; tests/test_docs.py checks that every command has one and that page and anchor exist.
DOCS = "docs/"
DOCS_SITE = 'in the repository, or as a site: pip install ".[docs]" && mkdocs serve (http://127.0.0.1:8000)'
DOCS_PAGES = {
    "decode": "getting-started.md#a-single-prompt",
    "train-target": "targets.md#the-embedded-target",
    "collect": "methods/spot.md#training-a-drafter-for-a-new-target",
    "train-drafter": "methods/spot.md#training-a-drafter-for-a-new-target",
    "spiffy-calibrate": "methods/spiffy.md#calibrating-a-graph-for-a-new-target",
    "sync": "tracking.md#outages-and-interrupted-runs",
    "fit-gamma": "methods/spot-gamma.md",
    "calibrate-reach": "methods/budget-auto.md#calibrating-a-drafter",
    "fit-sets": "methods/spot-sets.md#training-for-a-new-target",
    "train-sets": "methods/spot-sets.md#training-for-a-new-target",
    "train-refresh": "methods/spot.md#spot-r-refreshed-tokens",
    "profile": "methods/budget-auto.md#the-verify-cost-profile",
    "placement": "guides/scaling-out.md#targets-larger-than-one-gpu",
    "nightly": "tracking.md#nightly-reports",
    "cache-datasets": "guides/tasks.md#lm-evals-own-tasks-offline",
    "compare": "tracking.md#comparing-methods",
    "methods": "plugins.md#listing-the-methods",
    "check-method": "plugins.md#the-conformance-check",
    "check-target": "plugins.md#target-plugins",
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, refusing in one line that names the way to the flags, as every other refusal does, not
    after a screen of usage; its subcommands' parsers are of this class too (add_subparsers' default)."""

    def error(self, message: str) -> NoReturn:
        listed = "commands" if self._subparsers else "flags"
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the {listed})\n")


def build_parser() -> argparse.ArgumentParser:
    pages = "\n".join(f"  {command.name:<18}{DOCS}{DOCS_PAGES[command.name]}" for command in COMMANDS)
    parser = Parser(prog="spot-eval", description=__doc__, epilog=f"documentation: {DOCS} {DOCS_SITE}\n{pages}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, epilog=f"docs: {DOCS}{DOCS_PAGES[command.name]}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        command.flags(p)
        p.set_defaults(run=command.run)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        args.run(args)
    except PluginError as err:  # not the user's input: the plugin's traceback, then its one line, and exit 1
        traceback.print_exception(err.__cause__ or err, file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ValueError, FileNotFoundError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

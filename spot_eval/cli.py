"""`spot-eval`: the project's command line. Each subcommand parses its flags here and calls one
function elsewhere; bad input ends with `error: ...` and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from spot_eval.paths import EMBEDDED_TARGET


def _add_decode(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="decode one prompt with a method and print one JSON object")
    p.add_argument("--target", default=str(EMBEDDED_TARGET), help="model directory (default: the embedded target)")
    p.add_argument("--method", default="draft_free", help="draft_free or a drafter name (random, adversarial, oracle)")
    p.add_argument("--budget", type=int, default=0, help="draft nodes per verify forward (0 with draft_free)")
    p.add_argument("--unmasking", default="single", help="single | threshold")
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--block-length", type=int, default=None, help="default: the checkpoint's block_size")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: the text, then stats)")
    p.set_defaults(func=_run_decode)


def _run_decode(args: argparse.Namespace) -> None:
    from spot_eval.decode import decode_prompt

    result = decode_prompt(
        target=args.target,
        method=args.method,
        budget=args.budget,
        policy=args.unmasking,
        threshold=args.threshold,
        block_length=args.block_length,
        gen_length=args.gen_length,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        prompt=args.prompt,
        chat=args.chat,
        device=args.device,
    )
    if args.json:
        print(json.dumps(result))
    else:
        print(result["text"])
        print(
            f"\n[{result['method']} budget {result['budget']}] {len(result['token_ids'])} tokens, "
            f"{result['forwards']} target forwards, {result['steps']} steps, {result['seconds']:.2f} s",
            file=sys.stderr,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spot-eval", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_decode(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

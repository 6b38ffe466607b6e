"""`qwen3-runtime generate`: run the config's generate job (or the prompts given) and report text, tokens and
timing. `qwen3-runtime serve`: the OpenAI-compatible HTTP server over the config's engine."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from qwen3_runtime.config import ConfigError, bundled_configs, load_config, parse_override
from qwen3_runtime.input_errors import ChatTemplateError, CheckpointError
from qwen3_runtime.version import package_version

if TYPE_CHECKING:
    from qwen3_runtime.logprobs import TokenLogprob
    from qwen3_runtime.request import RequestOutput
    from qwen3_runtime.tokenizer import Tokenizer

# What a user's mistake raises (a config key, a checkpoint file or tensor, a chat message the template refuses):
# printed as `error: ...`, exit 2. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ConfigError, CheckpointError, ChatTemplateError)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return _generate(args)


def _generate(args: argparse.Namespace) -> int:
    from qwen3_runtime.runtime import Runtime  # torch and Triton: this command's alone, not --help's or serve's

    try:
        config = load_config(args.config, dict(parse_override(s) for s in args.set))
        given = [(kind, _parse_ids(text) if kind == "ids" else text) for kind, text in args.prompts]
        rt = Runtime(config)
        # The tokenizer and the chat template are the config's: their errors stop the run. A text the tokenizer
        # cannot read fails its own request in the Runtime, as a bad list of ids does.
        tokenizer = rt.tokenizer if any(kind != "ids" for kind, _ in given) else None
        chat = lambda text: rt.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        prompts = [chat(p) if kind == "chat" else p for kind, p in given]
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(rt.summary)
    job = config.generate
    if not prompts:
        prompts = job.prompts or _random_prompts(job.num_prompts, job.prompt_len, rt.vocab_size, job.prompt_seed)
    start = time.perf_counter()
    outputs = rt.generate(prompts, job.sampling, use_tqdm=not args.quiet)
    wall = time.perf_counter() - start
    for out in outputs:
        if not args.quiet or out.error:  # quiet or not, a failed request says why
            _print_output(out, tokenizer)
    _print_timing(outputs, wall)
    return 1 if any(out.error for out in outputs) else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qwen3-runtime", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text or tokens for prompts")
    gen.add_argument(
        "--config",
        default="tiny",
        help=f"a YAML file or a bundled config ({', '.join(bundled_configs())}); default: tiny",
    )
    # The three kinds of prompt share one list, so the requests keep the order they were given in.
    gen.set_defaults(prompts=[])
    for flag, kind, metavar, help_text in (
        ("--prompt", "text", "TEXT", "a text prompt"),
        ("--chat", "chat", "MESSAGE", "a user message, through the chat template"),
        ("--prompt-ids", "ids", "1,2,3", "a prompt as comma-separated token ids"),
    ):
        gen.add_argument(flag, action="append", dest="prompts", type=_tagged(kind), metavar=metavar, help=help_text)
    gen.epilog = "Each prompt option repeats; with no prompt at all: the config's generate.prompts, or random ones."
    gen.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set logprobs.path=host",
    )
    gen.add_argument("--quiet", action="store_true", help="print only failed requests and the timing summary")
    _serve_parser(sub)
    return parser


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve the OpenAI API (completions, chat) over HTTP")
    serve.add_argument("--config", default="tiny", help="a YAML file or a bundled config; default: tiny")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind; default: 127.0.0.1 (this machine only)")
    serve.add_argument("--port", type=_int_in(0, 65535), default=8000, help="port to listen on; default: 8000")
    serve.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    serve.add_argument(
        "--api-key", default=None, help="require `Authorization: Bearer KEY` on the /v1/ routes (as vLLM does)"
    )
    serve.add_argument(
        "--max-request-bytes",
        type=_int_in(1, None),
        default=4 << 20,
        help="a larger request body is a 413; default: 4 MiB",
    )
    serve.add_argument(
        "--max-choices-per-request",
        type=_int_in(1, None),
        default=128,
        metavar="N",
        help="a request asking for more choices (prompts x n) is a 400, so one client cannot queue unbounded work; "
        "default: 128 (OpenAI's cap on n)",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        metavar="NAME",
        help="the model's name in the API (requests naming another get a 404); default: the config's name",
    )
    serve.add_argument(
        "--reasoning-parser",
        choices=["qwen3"],
        default=None,
        help="chat answers' thinking (<think>...</think>) in message.reasoning_content and .reasoning, apart from "
        "the content; default: off (the thinking is content)",
    )
    serve.add_argument(
        "--tool-call-parser",
        choices=["hermes"],
        default=None,
        help="accept tools in chat requests and return the answer's <tool_call> blocks as tool_calls; default: off "
        "(tools are a 400)",
    )


def _int_in(lo: int, hi: int | None):
    """An argparse type: an integer in [lo, hi] (no upper bound when hi is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(
                f"{value} is out of range: must be " + (f"in [{lo}, {hi}]" if hi is not None else f">= {lo}")
            )
        return value

    return parse


def _serve(args: argparse.Namespace) -> int:
    """The server runs until interrupted; a bad config, an address it cannot listen on or a Runtime that cannot be
    built exits 2, an engine process that died while serving exits 1."""
    # FastAPI and uvicorn only for this command
    from qwen3_runtime.server.engine_client import EngineStartError
    from qwen3_runtime.server.launch import EngineDiedError, ListenError, serve

    try:
        overrides = dict(parse_override(s) for s in args.set)
        serve(
            args.config,
            overrides,
            args.host,
            args.port,
            args.api_key,
            args.max_request_bytes,
            args.served_model_name,
            args.max_choices_per_request,
            args.reasoning_parser,
            args.tool_call_parser,
        )
    except (*USER_ERRORS, EngineStartError, ListenError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except EngineDiedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl+C, which uvicorn re-raises once the server has shut down: nothing to report
        return 130
    return 0


def _tagged(kind: str):
    """An argparse type: the argument as (kind, text)."""
    return lambda text: (kind, text)


def _parse_ids(text: str) -> list[int]:
    ids = []
    for i, entry in enumerate(text.split(",")):
        try:
            ids.append(int(entry))
        except ValueError:
            what = "is empty" if not entry.strip() else f"{entry.strip()!r} is not an integer"
            raise ConfigError(f"--prompt-ids {text!r}: entry {i} {what}; expected comma-separated token ids") from None
    return ids


def _random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(count, length)).tolist()


def _print_output(out: RequestOutput, tokenizer: Tokenizer | None) -> None:
    if out.error:
        print(f"[{out.request_id}] error: {out.error}")
        return
    print(
        f"[{out.request_id}] prompt {len(out.prompt_token_ids)} tokens -> {len(out.token_ids)} tokens "
        f"({out.finish_reason}): {' '.join(map(str, out.token_ids))}"
    )
    if tokenizer is not None:
        print(f"    text: {tokenizer.decode(out.token_ids, skip_special_tokens=True)!r}")
    _print_logprobs(out.prompt_logprobs, "prompt ")
    _print_logprobs(out.logprobs, "")


def _print_logprobs(entries: Sequence[TokenLogprob | None] | None, label: str) -> None:
    """One line per position; the first prompt token has no logprob (nothing precedes it)."""
    for i, lp in enumerate(entries or []):
        if lp is None:
            continue
        top = ", ".join(f"{t}:{v:.3f}" for t, v in zip(lp.top_ids, lp.top_logprobs))
        print(
            f"    {label}{i}: token {lp.token_id} logprob {lp.logprob:.4f} rank {lp.rank}"
            + (f" top [{top}]" if top else "")
        )


def _print_timing(outputs: list[RequestOutput], wall: float) -> None:
    """TTFT, TPOT and throughput over the requests that succeeded; none when all failed."""
    served = [o for o in outputs if not o.error and o.ttft is not None]
    if not served:
        print(f"no request succeeded ({len(outputs)} failed): no timing", file=sys.stderr)
        return
    ttft = [o.ttft for o in served]
    tpot = [o.tpot for o in served if o.tpot is not None]
    tokens = sum(len(o.token_ids) for o in served)
    print(
        f"requests {len(served)}  output tokens {tokens}  wall {wall:.3f} s  "
        f"TTFT {1e3 * statistics.median(ttft):.2f} ms  "
        + (f"TPOT {1e3 * statistics.median(tpot):.2f} ms  " if tpot else "")
        + f"throughput {tokens / wall:.1f} tokens/s"
    )


if __name__ == "__main__":
    sys.exit(main())

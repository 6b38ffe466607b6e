"""Runtime.generate's batch driver: add the prompts, step until they end, return their outputs in order. Apart from
runtime.py because it drives the engine from outside, as a caller would, beside the requests it already runs."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm import tqdm

from qwen3_runtime.params import SamplingParams
from qwen3_runtime.request import RequestOutput
from qwen3_runtime.validation import plain_token_ids

if TYPE_CHECKING:
    from qwen3_runtime.runtime import Prompt, Runtime


def generate(
    rt: Runtime,
    prompts: Prompt | Seq[Prompt],
    params: SamplingParams | Seq[SamplingParams] | None,
    use_tqdm: bool,
    chat_template_kwargs: dict[str, Any] | None,
) -> list[RequestOutput]:
    """Runtime.generate (its docstring says what it promises)."""
    if _one_prompt(prompts):
        prompts = [prompts]
    params = rt.default_sampling_params() if params is None else params
    per_request = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(per_request) != len(prompts):
        raise ValueError(f"params has {len(per_request)} entries for {len(prompts)} prompts")
    outputs: dict[int, RequestOutput] = {}
    budget: dict[int, int] = {}  # the most tokens each accepted request can produce
    ids = []
    for prompt, p in zip(prompts, per_request):
        try:
            request_id = rt.add_request(prompt, p, chat_template_kwargs=chat_template_kwargs)
            prompt_len = len(rt._live[request_id].prompt)
            budget[request_id] = min(p.max_tokens, rt.config.engine.max_model_len - prompt_len)
        except ValueError as e:
            request_id = rt._new_id()
            prompt_ids = plain_token_ids(prompt)
            outputs[request_id] = RequestOutput(request_id, prompt_ids, [], None, None, "error", error=str(e))
        ids.append(request_id)
    others = []
    with tqdm(total=sum(budget.values()), unit="tok", disable=not use_tqdm, dynamic_ncols=True) as bar:
        while budget.keys() - outputs.keys():
            before = rt.num_generated
            for out in rt.step():
                if out.request_id not in budget:
                    others.append(out)
                    continue
                outputs[out.request_id] = out
                bar.total -= budget[out.request_id] - len(out.token_ids)  # tokens that will not come
            bar.update(rt.num_generated - before)
    rt._undelivered += others
    return [outputs[i] for i in ids]


def _one_prompt(prompts: object) -> bool:
    """Whether generate() was given one prompt rather than a list of them: a text, token ids or chat messages."""
    if isinstance(prompts, str):
        return True
    items = list(prompts) if isinstance(prompts, (list, tuple)) else []
    return bool(items) and (
        all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in items)
        or all(isinstance(m, dict) for m in items)
    )

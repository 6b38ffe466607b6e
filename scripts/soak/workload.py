"""The soak's requests: a seeded, bounded mix of completions and chat, streamed or not, greedy, seeded or
unseeded sampling, with logprobs, prompt logprobs, echo, stop strings, penalties and logit_bias, and n > 1, prompts
sharing prefixes or not, up to max_model_len; plus the faults: disconnects, aborts, bursts of long prompts, bad
requests (400 expected)."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Characters frequent in the vocabulary's tokens, so sampled outputs meet them.
STOPS = (["e"], ["a", "o"], ["in"], ["the", " "])
WORDS = "the a of to and in is it you that was for on are with as be at one have this from by".split()


@dataclass
class Spec:
    """One HTTP request and what the soak does with it."""

    index: int
    route: str  # "completions" | "chat" | "bad"
    body: dict
    prompt_ids: list[int] | None = None  # a token-id completions prompt (else the text is encoded at replay)
    fault: str | None = None  # "disconnect": close after `after` chunks; "abort": client timeout of `after` s
    after: float = 0.0
    bad_param: str | None = None  # a bad request: the parameter its 400 must name
    burst: bool = False
    reproducible: bool = False  # greedy or seeded: its outputs must equal the offline engine's

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def kind(self) -> str:
        if self.bad_param:
            return "bad"
        return "+".join([self.route, "stream" if self.stream else "whole"] + ([self.fault] if self.fault else []))


@dataclass
class Limits:
    max_model_len: int
    vocab_size: int
    max_logprobs: int
    max_tokens: int = 48  # most requests' output budget (CPU time); a few go to max_model_len


class Workload:
    def __init__(self, limits: Limits, seed: int, model: str) -> None:
        self.lim, self.rng, self.model = limits, random.Random(seed), model
        self.top = 20 if limits.max_logprobs == -1 else min(20, limits.max_logprobs)  # logprobs asked: 0..top
        self.prefixes = [self._ids(self.rng.randint(16, limits.max_model_len // 3)) for _ in range(4)]

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 150_000) for _ in range(n)]  # clear of the special tokens

    def _prompt(self, room: int) -> list[int]:
        """A token-id prompt of at most `room` tokens; half start with one of a few shared prefixes."""
        n = self.rng.randint(1, max(1, room))
        if self.rng.random() < 0.5:
            prefix = self.rng.choice(self.prefixes)[:n]
            return prefix + self._ids(n - len(prefix))
        return self._ids(n)

    def _sampling(self, spec: Spec) -> None:
        r, b = self.rng.random(), spec.body
        if r < 0.4:
            b["temperature"] = 0.0
        else:
            b.update(temperature=self.rng.choice([0.5, 1.0, 1.3]), top_p=self.rng.choice([1.0, 0.9]))
            b["top_k"] = self.rng.choice([-1, -1, 20])
            if r < 0.85:
                b["seed"] = self.rng.randrange(2**31)
        spec.reproducible = r < 0.85
        if self.rng.random() < 0.15:  # the penalties users send, with a logit_bias
            bias = {str(t): self.rng.choice([-100.0, 3.0]) for t in self._ids(3)}
            b.update(presence_penalty=0.5, repetition_penalty=1.2, logit_bias=bias)
        if self.rng.random() < 0.25:
            b["stop"] = self.rng.choice(STOPS)
        if self.rng.random() < 0.15:
            b["n"] = self.rng.randint(2, 3)
        if spec.stream:
            b["stream_options"] = {"include_usage": True}

    def _lengths(self) -> tuple[int, int]:
        """(prompt room, max_tokens); one request in 10 reaches max_model_len."""
        if self.rng.random() < 0.1:
            max_tokens = self.rng.randint(1, self.lim.max_tokens)
            return self.lim.max_model_len - max_tokens, max_tokens
        return self.rng.randint(1, self.lim.max_model_len // 2), self.rng.randint(1, self.lim.max_tokens)

    def completion(self, index: int, room: int | None = None, max_tokens: int | None = None) -> Spec:
        lo_room, lo_max = self._lengths()
        room, max_tokens = room or lo_room, max_tokens or lo_max
        body = {"model": self.model, "max_tokens": max_tokens, "stream": self.rng.random() < 0.5}
        spec = Spec(index, "completions", body)
        if self.rng.random() < 0.8:
            spec.prompt_ids = self._prompt(room)
            body["prompt"] = spec.prompt_ids
        else:
            body["prompt"] = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, room // 2 + 1)))
            body["max_tokens"] = min(max_tokens, self.lim.max_tokens)
        if self.rng.random() < 0.6:
            body["logprobs"] = self.rng.randint(0, self.top)
        if self.rng.random() < 0.2:
            body["prompt_logprobs"] = self.rng.randint(0, self.top)
        if self.rng.random() < 0.15:
            body["echo"] = True
        self._sampling(spec)
        return spec

    def chat(self, index: int) -> Spec:
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 40)))
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": words}],
            "stream": self.rng.random() < 0.5,
        }
        body["max_tokens"] = self.rng.randint(1, self.lim.max_tokens)
        if self.rng.random() < 0.6:
            body.update(logprobs=True, top_logprobs=self.rng.randint(0, self.top))
        spec = Spec(index, "chat", body)
        self._sampling(spec)
        return spec

    def bad(self, index: int) -> Spec:
        lim = self.lim
        cases = [
            ("temperature", {"temperature": -1}),
            ("top_p", {"top_p": 1.5}),
            ("logprobs", {"logprobs": lim.max_logprobs + 1}),
            ("prompt_logprobs", {"prompt_logprobs": lim.max_logprobs + 1}),
            ("prompt", {"prompt": [lim.vocab_size + 7]}),
            ("prompt", {"prompt": [5] * (lim.max_model_len + 1)}),
            ("n", {"n": 0}),
            ("max_tokens", {"max_tokens": 0}),
            ("prompt", {"prompt": []}),
        ]
        if lim.max_logprobs == -1:  # any number of logprobs is allowed
            cases = [c for c in cases if "logprobs" not in c[0]]
        param, extra = self.rng.choice(cases)
        body = {"model": self.model, "prompt": [1, 2, 3], "max_tokens": 4, "stream": self.rng.random() < 0.3, **extra}
        return Spec(index, "bad", body, bad_param=param)

    def spec(self, index: int) -> Spec:
        r = self.rng.random()
        if r < 0.08:
            return self.bad(index)
        spec = self.chat(index) if r < 0.3 else self.completion(index)
        f = self.rng.random()
        if f < 0.1 and spec.stream:
            spec.fault, spec.after = "disconnect", self.rng.randint(0, 6)
        elif f < 0.15 and not spec.stream:
            spec.fault, spec.after = "abort", self.rng.uniform(0.02, 0.5)
        return spec

    def burst(self, start: int, size: int) -> list[Spec]:
        """Long prompts near max_model_len, all at once: more than the KV cache holds (preemption)."""
        specs = []
        for i in range(size):
            max_tokens = self.rng.randint(min(8, self.lim.max_tokens), self.lim.max_tokens)
            room = self.lim.max_model_len - max_tokens
            spec = self.completion(start + i, room=room, max_tokens=max_tokens)
            if spec.prompt_ids is not None:  # long: at least 3/4 of the room
                spec.prompt_ids = self.rng.choice(self.prefixes)[: room // 4] + self._ids(room - room // 4)
                spec.prompt_ids = spec.prompt_ids[:room]
                spec.body["prompt"] = spec.prompt_ids
            spec.fault, spec.burst = None, True
            specs.append(spec)
        return specs

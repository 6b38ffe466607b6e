"""The sampling tail: what a step runs on the logits after the forward (prompt logprobs here). It consumes
logprobs, packing and requests, so it sits above them; nothing below imports it."""

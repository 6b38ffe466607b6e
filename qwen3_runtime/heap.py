"""Keep the garbage collector's full passes out of the step loop and the event loop."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Exempt every object alive now from the collector's passes.

    A process that has imported torch (and built a model, or the web app) holds hundreds of thousands of
    tracked objects, and a full collection walks all of them while every stream waits. The objects streamed
    requests leave behind (logprobs, updates) make such passes frequent. What is alive after startup lives as
    long as the process, so freezing it loses nothing: later garbage is still collected (vLLM does the same).
    """
    gc.collect()
    gc.freeze()

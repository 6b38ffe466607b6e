"""Keep the garbage collector's full passes out of the step loop and the event loop."""

from __future__ import annotations

import atexit
import gc


def freeze_startup_objects() -> None:
    """Exempt every object alive now from the collector's passes, until the process exits.

    A process that has imported torch (and built a model, or the web app) holds hundreds of thousands of
    tracked objects, and a full collection walks all of them while every stream waits. The objects streamed
    requests leave behind (logprobs, updates) make such passes frequent. What is alive after startup lives as
    long as the process, so freezing it loses nothing: later garbage is still collected (vLLM does the same).

    At exit they are unfrozen, so the interpreter's last collection frees them before extension modules are torn
    down: frozen, they outlive it, and Triton's bindings (nanobind) then report every object of theirs still
    alive as leaked, dozens of lines on a clean shutdown.
    """
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)

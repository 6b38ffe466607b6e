import gc

from qwen3_runtime.heap import freeze_startup_objects


def test_objects_alive_at_startup_leave_the_collectors_passes_and_later_garbage_is_still_collected():
    kept = [[i] for i in range(1000)]
    try:
        freeze_startup_objects()
        assert gc.get_freeze_count() >= len(kept)
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # a cycle made after the freeze is found
    finally:
        gc.unfreeze()

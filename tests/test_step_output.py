"""StepOutputs: every step packs into `latest`; copy_out snapshots it into the next result buffer, so a later
step overwriting `latest` never changes results already copied out, and a buffer is reused only once read."""

import pytest
import torch

from qwen3_runtime.stats import RunnerStats
from qwen3_runtime.step_output import StepOutputs


def test_results_copied_out_survive_the_next_step_and_buffers_alternate():
    outputs = StepOutputs(max_rows=4, width=3, device=torch.device("cpu"), stats=RunnerStats())
    outputs.latest[:2] = torch.tensor([[1, 0, 7], [2, 0, 8]], dtype=torch.int32)
    first = outputs.copy_out(2)
    outputs.latest[:3] = 9  # the next step packs over latest before the first is read
    second = outputs.copy_out(3)

    assert first != second
    assert outputs.wait(first, 2).tolist() == [[1, 0, 7], [2, 0, 8]]
    assert outputs.wait(second, 3).tolist() == [[9, 9, 9]] * 3
    assert outputs.stats.d2h_copies == 2


def test_a_buffer_is_not_reused_before_its_results_are_read():
    outputs = StepOutputs(max_rows=2, width=3, device=torch.device("cpu"), stats=RunnerStats())
    outputs.copy_out(1)
    outputs.copy_out(1)
    with pytest.raises(RuntimeError, match="two before"):
        outputs.copy_out(1)

import torch

from qwen3_runtime.step_inputs import RequestRow, StepInputs

GREEDY = RequestRow((-1, 9, 0, 0, 0, -1), (0.5, 1.0, 0.0, 0.0, 0.0, 1.0))
SAMPLED = RequestRow((40, 3, 5, 1, 1, 2), (1.0, 0.9, 0.1, 0.5, -0.5, 1.2))


def _fill_two_rows(host: StepInputs) -> None:
    """Row 0 greedy, row 1 sampled and fed by row 0 of the step in flight; no padding."""
    host.fill(2, 2, input_ids=[7, 8], positions=[5, 0], slot_mapping=[21, 33], seq_lens=[6, 1], prev_rows=[-1, 0],
              suppress_stop=[0, 1], requests={0: GREEDY, 1: SAMPLED})  # fmt: skip


def test_rows_padding_and_copy():
    host = StepInputs.allocate(4, 3, torch.device("cpu"))
    device = StepInputs.allocate(4, 3, torch.device("cpu"))
    _fill_two_rows(host)
    assert host.top_k.tolist()[:2] == [-1, 40] and host.num_top.tolist()[:2] == [0, 5]
    assert host.top_p.tolist()[:2] == [1.0, 0.8999999761581421] and host.processed.tolist()[:2] == [0, 1]
    host.block_tables[0] = torch.tensor([2, 1, 0])
    host.fill(
        1,
        4,
        input_ids=[7],
        positions=[5],
        slot_mapping=[21],
        seq_lens=[6],
        prev_rows=[1],
        suppress_stop=[1],
        requests={},
    )
    # row 0 keeps its request's constants; row 1 was stale: it must have become padding
    device.copy_from(host, 4)
    assert device.input_ids.tolist() == [7, 0, 0, 0]
    assert device.slot_mapping.tolist() == [21, -1, -1, -1]
    assert device.seq_lens.tolist() == [6, 0, 0, 0] and device.wants_logprobs.tolist() == [0, 0, 0, 0]
    assert device.prev_row.tolist() == [1, -1, -1, -1] and device.suppress_stop.tolist() == [1, 0, 0, 0]
    # row 1 was penalized: as padding it holds no penalty slot and neutral penalties
    assert device.penalty_slot.tolist() == [-1] * 4 and device.repetition.tolist() == [1.0] * 4
    assert device.presence.tolist() == [0.0] * 4 and device.min_p.tolist() == [0.0] * 4
    assert device.top_k.tolist() == [-1, -1, -1, -1] and device.num_top.tolist() == [0, 0, 0, 0]
    assert device.temperature.tolist() == [0.5, 0.0, 0.0, 0.0] and device.top_p.tolist()[1:] == [1.0] * 3
    sampling = device.sampling(2)
    assert sampling.position.tolist() == [6, 1] and sampling.seed.tolist() == [9, 0]
    assert device.block_tables[0].tolist() == [2, 1, 0]


def test_seeds_keep_all_63_bits():
    host = StepInputs.allocate(1, 1, torch.device("cpu"))
    seed = 2**63 - 5
    host.fill(
        1,
        1,
        input_ids=[1],
        positions=[0],
        slot_mapping=[0],
        seq_lens=[1],
        prev_rows=[-1],
        suppress_stop=[0],
        requests={0: RequestRow((-1, seed, 0, 0, 0, -1), (1.0, 1.0, 0.0, 0.0, 0.0, 1.0))},
    )
    assert host.seed.tolist() == [seed]


def test_copy_stops_after_the_rows_block_tables():
    host, device = StepInputs.allocate(4, 3, torch.device("cpu")), StepInputs.allocate(4, 3, torch.device("cpu"))
    host.block_tables.copy_(torch.arange(12).view(4, 3))
    _fill_two_rows(host)
    device.block_tables.fill_(-9)  # poison: rows past the copied ones must keep it
    device.copy_from(host, 2)
    assert device.block_tables.tolist() == [[0, 1, 2], [3, 4, 5], [-9] * 3, [-9] * 3]
    assert device.input_ids.tolist()[:2] == [7, 8] and device.top_p.tolist()[1] == host.top_p.tolist()[1]

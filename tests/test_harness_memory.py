"""harness.memory measures every live tensor storage, wherever the code keeps it: the measurement does
not ask the code where its state is.  Each test hides state the way a submission might."""
import torch

import harness

HIDDEN = {}


def _held_beyond(before, make):
    keep = make()   # noqa: F841  (what the code under test holds on to)
    return harness.live_tensor_bytes(exclude=[before])


def measure(how):
    before = harness.live_storages(collect=False)

    def in_a_module_level_dict():
        HIDDEN["state"] = torch.zeros(100)

    def in_a_closure():
        state = torch.zeros(100)
        return lambda: state

    def as_a_view_of_a_bigger_buffer():
        return torch.zeros(400)[:100]   # a "shard" of 400 bytes that keeps 1600 alive

    def as_two_views_of_one_buffer():
        flat = torch.zeros(100)
        return [flat[:50], flat[50:]]

    def as_a_grad_only_autograd_made():
        p = torch.zeros(100, requires_grad=True)
        (p * 2).sum().backward()
        return [p]

    made = {"in_a_module_level_dict": in_a_module_level_dict, "in_a_closure": in_a_closure,
            "as_a_view_of_a_bigger_buffer": as_a_view_of_a_bigger_buffer,
            "as_two_views_of_one_buffer": as_two_views_of_one_buffer,
            "as_a_grad_only_autograd_made": as_a_grad_only_autograd_made}[how]
    return _held_beyond(before, made)


def test_state_is_found_wherever_it_is_kept():
    cases = {"in_a_module_level_dict": 400, "in_a_closure": 400, "as_a_view_of_a_bigger_buffer": 1600,
             "as_two_views_of_one_buffer": 400, "as_a_grad_only_autograd_made": 800}
    for how, expected in cases.items():
        assert harness.run(measure, 1, how, timeout=60).values == [expected], how


def saved_bytes(free):
    w = torch.ones(64, 64, requires_grad=True)
    full = w * 1.0   # a "gathered" parameter, used in the forward
    x = torch.ones(1, 64, requires_grad=True)   # its gradient needs ``full``: autograd saves it
    with harness.saved_for_backward() as saved:
        y = (x @ full).sum()
    if free:
        full.untyped_storage().resize_(0)   # freeing it for real, as a correct ZeRO-3 does
    del full
    return saved.alive_bytes(exclude=[w, x]), y.item()


def test_tensors_saved_for_backward_are_seen_until_their_storage_is_freed():
    assert harness.run(saved_bytes, 1, False, timeout=60).values[0][0] >= 64 * 64 * 4
    assert harness.run(saved_bytes, 1, True, timeout=60).values[0][0] == 0


MB = 2**20
KEPT = []


def churn_then_keep(keep_mb: int):
    """Blocks of 4 MiB made and freed many times over, as training's temporaries are; then ``keep_mb`` kept, in a
    numpy array the tensor walk cannot see."""
    import numpy as np
    for _ in range(8):
        blocks = [torch.ones(MB) for _ in range(8)]   # 32 MiB in blocks of 4 MiB
        del blocks
    KEPT.append(np.ones(keep_mb * MB // 8))


def test_resident_memory_follows_what_a_rank_holds_not_what_it_freed():
    """The test process reads each rank's resident memory; large blocks freed give their pages back at once,
    so what a call leaves resident is what it keeps, to within a few pages."""
    harness.run(churn_then_keep, 1, 0)   # the first call's imports (numpy) stay resident
    for keep_mb in (0, 16):
        growth = harness.run(churn_then_keep, 1, keep_mb).memory[0]
        kept = growth["end"] - growth["start"]
        assert keep_mb * MB <= kept + MB // 4 and kept < (keep_mb + 2) * MB, (keep_mb, growth)
        assert growth["peak"] - growth["start"] >= 16 * MB or keep_mb, growth   # the churn was seen while it ran


def blip():
    """64 MiB touched and freed at once: far shorter than a watchdog tick."""
    t = torch.ones(16 * MB)
    del t


def test_the_peak_is_the_kernels_high_water_mark_not_a_sampled_one():
    for growth in harness.run(blip, 2).memory:
        assert growth["peak"] - growth["start"] >= 64 * MB - MB, growth

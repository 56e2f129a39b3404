"""rollout.sampling_options.sde_window_schedule: MixGRPO's global windows, worked out by hand; config rules; the family's requests."""
import pytest

from omni_rl.compose import load_config
from omni_rl.errors import ConfigError
from omni_rl.families.diffusion import DiffusionFamily
from omni_rl.rollout.sde_window import choose_sde_window, scheduled_sde_window


def windows(schedule, steps, seed=42, num_steps=10, size=2, window_range=None, **options):
    """The schedule's window for each training step in `steps`."""
    return [scheduled_sde_window(schedule, s, seed, num_steps, size, window_range, **options) for s in steps]


def test_fixed_leaves_the_draw_to_each_sample():
    assert scheduled_sde_window("fixed", 5, 42, 10, 2) is None


def test_progressive_slides_by_shift_every_tau_steps_and_stays_at_the_end():
    # 10 steps, window 2, shift 1 every step: starts 0, 1, ..., 8 (= 10 - 2), then 8.
    assert [w[0] for w in windows("progressive", range(1, 12))] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8]
    # shift 3 every 2 training steps in [2, 9): floor((s - 1) / 2) moves of 3 from 2, capped at 9 - 2 = 7.
    got = windows("progressive", range(1, 9), window_range=(2, 9), shift=3, tau=2)
    assert got == [(2, 4), (2, 4), (5, 7), (5, 7), (7, 9), (7, 9), (7, 9), (7, 9)]


def test_random_is_one_window_per_step_from_seed_and_step():
    first = windows("random", range(1, 201), window_range=(1, 7), size=3)
    assert all(w[1] - w[0] == 3 and 1 <= w[0] <= 4 for w in first)
    assert {w[0] for w in first} == {1, 2, 3, 4}  # every start of 1 .. 7 - 3 comes up
    assert first == windows("random", range(1, 201), window_range=(1, 7), size=3)  # a resume draws the same
    assert first != windows("random", range(1, 201), window_range=(1, 7), size=3, seed=43)


def test_decay_shrinks_the_window_every_tau_steps_down_to_min_size():
    # size 4 at lo = 1, one step smaller every 2 training steps, never under 2: 4 4 3 3 2 2 2.
    got = windows("decay", range(1, 8), size=4, window_range=(1, 8), tau=2, min_size=2)
    assert got == [(1, 5), (1, 5), (1, 4), (1, 4), (1, 3), (1, 3), (1, 3)]


def test_a_global_window_reaches_the_engine_exactly():
    """The family hands the step's window on as a range its own size: every sample's draw is it."""
    assert all(choose_sde_window(seed, 10, 3, (4, 7)) == (4, 7) for seed in range(50))


# Step 4 of 6 denoising steps, window 2: progressive starts at min(0 + 3, 6 - 2) = 3; decay's size is max(1, 2 - 3).
@pytest.mark.parametrize("schedule, expected", [("fixed", None), ("progressive", (3, 5)), ("decay", (0, 1))])
def test_the_family_places_the_steps_window(schedule, expected):
    cfg = load_config(["rollout.sampling_options.num_steps=6", "rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_range=null",
                       f"rollout.sampling_options.sde_window_schedule={schedule}"])
    family = DiffusionFamily.__new__(DiffusionFamily)  # sde_window reads the config only
    family.cfg = cfg
    fields = family.sde_window(4)
    if expected is None:
        assert fields == {"sde_window_size": 2, "sde_window_range": None}
    else:
        assert fields == {"sde_window_size": expected[1] - expected[0], "sde_window_range": expected}


@pytest.mark.parametrize("overrides, key, expected", [
    (["rollout.sampling_options.sde_window_schedule=sliding", "rollout.sampling_options.sde_window_size=2"], "rollout.sampling_options.sde_window_schedule='sliding'",
     "one of fixed, progressive, random, decay"),
    (["rollout.sampling_options.sde_window_schedule=progressive", "rollout.sampling_options.sde_window_size=0", "rollout.sampling_options.sde_window_range=null"],
     "rollout.sampling_options.sde_window_schedule='progressive'", "sde_window_size=0"),
    (["rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_options.shift=2"], "rollout.sampling_options.sde_window_options.shift=2", "only progressive"),
    (["rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_schedule=random", "rollout.sampling_options.sde_window_options.tau=3"],
     "rollout.sampling_options.sde_window_options.tau=3", "only progressive and decay"),
    (["rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_schedule=decay", "rollout.sampling_options.sde_window_options.min_size=3"],
     "rollout.sampling_options.sde_window_options.min_size=3", "at most rollout.sampling_options.sde_window_size = 2"),
    (["rollout.sampling_options.sde_window_size=2", "rollout.sampling_options.sde_window_schedule=progressive", "rollout.sampling_options.sde_window_options.tau=0"],
     "rollout.sampling_options.sde_window_options.tau=0", "an integer >= 1"),
])
def test_bad_schedules_fail_at_load_naming_the_key(overrides, key, expected):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert str(info.value).startswith(key) and expected in str(info.value)


def test_good_schedules_load():
    for schedule in ("progressive", "random", "decay"):
        cfg = load_config(["rollout.sampling_options.sde_window_size=2", f"rollout.sampling_options.sde_window_schedule={schedule}"])
        assert cfg.rollout.sampling_options.sde_window_schedule == schedule
    load_config(["rollout.sampling_options.sde_window_size=3", "rollout.sampling_options.sde_window_schedule=decay", "rollout.sampling_options.sde_window_options.min_size=2",
                 "rollout.sampling_options.sde_window_options.tau=5"])

"""`register_reward(needs_metadata=...)`: the metadata keys a reward needs on every sample, fixed
or named by its options; `reward_metadata_needs` answers for a configured reward (the load-time
check that the model or the prompts provide them is tests/rewards/test_speech_rewards_at_load.py)."""
import pytest

from omni_rl.plugins import load_plugins
from omni_rl.reward import RewardConfigError, register_reward, reward_metadata_needs


def _scorer(**_):
    return lambda samples, prompts, metadata: [0.0] * len(prompts)


register_reward("tests.needs.fixed", needs_metadata={"spoken_text", "speaker"})(_scorer)
register_reward("tests.needs.by_option", needs_metadata=lambda *, key="spoken_text", **_: {key})(_scorer)
register_reward("tests.needs.none")(_scorer)


def test_declared_keys_are_answered_for_the_options():
    assert reward_metadata_needs("tests.needs.fixed") == {"spoken_text", "speaker"}
    assert reward_metadata_needs("tests.needs.by_option") == {"spoken_text"}
    assert reward_metadata_needs("tests.needs.by_option", {"key": "answer"}) == {"answer"}
    assert reward_metadata_needs("tests.needs.none") == frozenset()
    load_plugins()  # the project's rewards
    assert reward_metadata_needs("asr_wer", {"text_key": "said"}) == {"said"}
    assert reward_metadata_needs("speech_rate") == {"spoken_text"}
    assert reward_metadata_needs("speaker_similarity", {"reference_audio": "x.wav"}) == frozenset()


@pytest.mark.parametrize("keys", ["spoken_text", [""], [3], 5])
def test_a_bad_declaration_is_refused_when_registered(keys):
    with pytest.raises(RewardConfigError, match="needs_metadata=.*expected a set of metadata keys"):
        register_reward(f"tests.needs.bad.{keys!r}", needs_metadata=keys)


def test_a_callable_that_returns_a_bad_set_is_refused_when_asked():
    register_reward("tests.needs.bad_callable", needs_metadata=lambda **_: "spoken_text")(_scorer)
    with pytest.raises(RewardConfigError, match="reward 'tests.needs.bad_callable': needs_metadata='spoken_text'"):
        reward_metadata_needs("tests.needs.bad_callable")

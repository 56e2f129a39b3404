"""`Conditioning` (omni_rl/models/conditioning.py): batching that pads masked sequences."""
import pytest
import torch

from omni_rl.models.conditioning import Conditioning


def part(length: int, value: float) -> Conditioning:
    return Conditioning(
        {"embeds": torch.full((1, length, 3), value), "mask": torch.ones(1, length, dtype=torch.long),
         "pooled": torch.full((1, 2), value)},
        masks={"embeds": "mask"},
    )


def test_cat_pads_masked_sequences_to_the_longest_with_zeros_and_mask_zero():
    cond = Conditioning.cat([part(2, 1.0), part(4, 2.0)])
    assert cond["embeds"].shape == (2, 4, 3)
    assert cond["mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert torch.equal(cond["embeds"][0, 2:], torch.zeros(2, 3))
    assert torch.equal(cond["embeds"][0, :2], torch.ones(2, 3))
    assert torch.equal(cond["pooled"][:, 0], torch.tensor([1.0, 2.0]))
    assert cond.masks == {"embeds": "mask"}


def test_select_and_to_keep_the_masks():
    cond = Conditioning.cat([part(2, 1.0), part(3, 2.0)]).select([1])
    assert cond.masks == {"embeds": "mask"} and cond["mask"].tolist() == [[1, 1, 1]]
    assert cond.to("cpu").masks == {"embeds": "mask"}


def test_pad_to_a_fixed_length_and_refuses_to_shorten():
    assert part(2, 1.0).pad_to(5)["mask"].tolist() == [[1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match="has length 4: cannot pad it to 3"):
        part(4, 1.0).pad_to(3)


def test_unmasked_embeddings_of_different_lengths_do_not_concatenate():
    a = Conditioning({"embeds": torch.zeros(1, 2, 3)})
    b = Conditioning({"embeds": torch.zeros(1, 3, 3)})
    with pytest.raises(RuntimeError):
        Conditioning.cat([a, b])


def test_a_mask_of_the_wrong_shape_or_name_is_refused():
    with pytest.raises(ValueError, match=r"expected \[B, L\] = \(1, 2\)"):
        Conditioning({"embeds": torch.zeros(1, 2, 3), "mask": torch.ones(1, 3)}, masks={"embeds": "mask"})
    with pytest.raises(ValueError, match="both must be tensors"):
        Conditioning({"embeds": torch.zeros(1, 2, 3)}, masks={"embeds": "mask"})


def test_parts_with_different_masks_do_not_concatenate():
    plain = Conditioning({"embeds": torch.zeros(1, 2, 3), "mask": torch.ones(1, 2, dtype=torch.long),
                          "pooled": torch.zeros(1, 2)})
    with pytest.raises(ValueError, match="masks"):
        Conditioning.cat([part(2, 1.0), plain])

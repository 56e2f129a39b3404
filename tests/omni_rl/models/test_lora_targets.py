"""`model.lora.target_modules` naming modules the model has not: one line, exit 2, instead of
PEFT's long traceback (issue 29 item 15)."""
import pytest
import torch
from torch import nn

from omni_rl.cli import main
from omni_rl.compose import load_config
from omni_rl.models.base import LoraTargetError, check_lora_targets
from omni_rl.models.factory import build_model


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict({"to_q": nn.Linear(2, 2), "to_k": nn.Linear(2, 2)})
        self.mlp = nn.Sequential(nn.Linear(2, 2), nn.GELU())


def test_targets_match_as_peft_matches_them():
    check_lora_targets(Block(), ["to_q", "attn.to_k", "mlp.0"], ["to_q"])
    check_lora_targets(Block(), r".*to_(q|z)", ["to_q"])  # a regular expression: PEFT's to judge
    with pytest.raises(LoraTargetError, match=r"\['q_proj', 'to_k'\]: \['q_proj'\] match no module of the trained "
                                              r"Block \(its linear layers are named to_k, to_q\); .* default \['to_q'\]"):
        check_lora_targets(Block(), ["q_proj", "to_k"], ["to_q"])


def test_the_tiny_sd3_refuses_them_when_it_builds(tmp_path, capsys):
    cfg = load_config(["recipe=tiny_sd3_flowgrpo", "model.lora.target_modules=[q_proj]"])
    with pytest.raises(LoraTargetError, match=r"\['q_proj'\] match no module of the trained SD3Transformer2DModel"):
        build_model(cfg.model, torch.device("cpu"))
    code = main(["recipe=tiny_sd3_flowgrpo", "model.lora.target_modules=[q_proj]", f"trainer.output_dir={tmp_path}"])
    err = [line for line in capsys.readouterr().err.splitlines() if "Traceback" in line or line.startswith("error")]
    assert code == 2 and len(err) == 1 and err[0].startswith("error: model.lora.target_modules=['q_proj']"), err

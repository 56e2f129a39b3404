"""The rollout server: a native engine in a process (and Python) of its own, behind loopback HTTP.

- `protocol.py`: the messages (safetensors bytes, JSON metadata; the wire codec under them,
  version check included, is `omni_rl.utils.wire`, the reward protocol's too);
- `app.py`: `RolloutServer`, the HTTP endpoints over one engine;
- `serve.py`: `python -m omni_rl.rollout.server --config run.yaml` builds the run's model and
  engine and serves them;
- `client.py`: `ServerRolloutEngine`, the contract over HTTP (`rollout.backend=server`), and
  `start_server_engine`, which starts the server for a run;
- `interpreter.py`: `check_python`, `rollout.python` checked before any model loads.

`docs/rollout_protocol.md` is the protocol for someone writing a server elsewhere.
"""
from omni_rl.rollout.server.client import ServerRolloutEngine, start_server_engine

__all__ = ["ServerRolloutEngine", "start_server_engine"]

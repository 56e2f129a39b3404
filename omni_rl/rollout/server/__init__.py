"""The rollout server: a native engine in a process (and Python) of its own, behind loopback HTTP.

`protocol.py` the messages, `app.py` the HTTP endpoints, `serve.py` the command line,
`client.py` the engine contract over HTTP (`rollout.backend=server`), `interpreter.py` the check
of `rollout.python`. `docs/rollout_protocol.md` is the protocol for a server written elsewhere.
"""
from omni_rl.rollout.server.client import ServerRolloutEngine, start_server_engine

__all__ = ["ServerRolloutEngine", "start_server_engine"]

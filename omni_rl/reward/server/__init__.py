"""The remote-scorer protocol's reference server: `app.py` serves one scorer (`ScoreServer`),
`scorers.py` builds the one a `--scorer` spec names, `serve.py` is the command line
(`python -m omni_rl.reward.server`). `docs/reward_protocol.md` is the protocol."""
from omni_rl.reward.server.app import HttpStatusError, OneKindScorer, ServedScorer, make_server, running_server, serve_in_thread
from omni_rl.reward.server.scorers import SERVED_SCORERS, load_scorer, register_served_scorer
from omni_rl.reward.server.serve import main, server_from_args

__all__ = ["SERVED_SCORERS", "HttpStatusError", "OneKindScorer", "ServedScorer", "load_scorer", "main", "make_server",
           "register_served_scorer", "running_server", "serve_in_thread", "server_from_args"]

"""`python -m omni_rl.rollout.server --config run.yaml`: build the run's model and native engine, serve them.

The model is built as the trainer builds its own (`torch.manual_seed(trainer.seed)`, then
`build_model`), so a tiny random-weight model starts with the trainer's weights; the client
then sends the trainable tensors once (version 0) so that a resumed or otherwise different
start agrees too. The engine is `--backend`'s (default `native`; `vllm_omni`, `vllm`) over that
model: the run's config is read as if it named that backend, with the run's `rollout.backend_options`
that the backend takes and `python` null (the engine runs here); a backend whose spec says
`loads_own_weights` gets the model built weightless (on the meta device).

The first line on stdout is one JSON object, `{"url": ..., "pid": ..., "protocol": 1}`, written
once the server answers; logs go to stderr. With `--parent-pid` the server stops when that
process is gone, so a trainer that was killed leaves no server behind.

Every request must carry the run's secret (`Authorization: Bearer <token>`, else 401): the
trainer hands it over in the environment variable `OMNI_RL_ROLLOUT_TOKEN`. A server started by
hand without it reads `--token-file PATH` (a token file of mode 0600, `omni_rl.utils.token_files`)
or, when there is none, makes a token and writes it to a new file of mode 0600 (PATH, or a fresh
name in the temporary directory), removed when the server stops; its first line then says
where (`"token_file": ...`), never the token itself: stdout is often a log that others can read.
A command line that cannot start (no --config, a config that is no file, a token file readable by others,
the port in use) is one `error:` line: exit 2 for bad input, 1 for a port in use (the command
line's scaffolding is the reward server's too: `omni_rl.utils.server_args`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn, Optional, Sequence

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from omni_rl.compose import bind_blocks
from omni_rl.config.options import recipe_values
from omni_rl.config.loader import upgrade_saved_config
from omni_rl.config.schema import OmniConfig
from omni_rl.device import pick_device
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import ROLLOUT_BACKENDS
from omni_rl.rollout.server.app import DEFAULT_MAX_BODY_BYTES, RolloutServer
from omni_rl.rollout.server.protocol import PROTOCOL_VERSION, TOKEN_ENV
from omni_rl.utils import server_args
from omni_rl.utils.http_transport import DEFAULT_HEADER_DEADLINE_S, DEFAULT_MAX_CONNECTIONS, new_token
from omni_rl.utils.server_args import ServerStartError


def load_run_config(path: str) -> OmniConfig:
    """A config `omni_rl.config.loader.to_yaml` wrote (already validated by the trainer)."""
    # One written before the sampling knobs moved (a server started by hand) is read in today's layout.
    saved = upgrade_saved_config(yaml.safe_load(Path(path).read_text(encoding="utf-8")))
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OmniConfig), saved))


def build_server(cfg: OmniConfig, backend: str = "native", host: str = "127.0.0.1", port: int = 0,
                 token: Optional[str] = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 header_deadline_s: float = DEFAULT_HEADER_DEADLINE_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> RolloutServer:
    if backend == "server":
        raise ValueError("--backend server would start a server from the server; name an in-process backend "
                         "(native, vllm_omni, vllm)")
    spec = ROLLOUT_BACKENDS.get(backend)
    # This process is the Python rollout.backend_options.python named: here the engine runs in-process.
    # The run's options were bound (and checked) at load for its own backend; the ones this
    # backend shares with it carry over, the rest keep this backend's defaults.
    takes = {f.name for f in dataclasses.fields(spec.options_class)}
    options = {key: value for key, value in recipe_values(cfg.rollout.backend_options).items() if key in takes}
    if "python" in takes:
        options["python"] = None
    if options.get("driver", "auto") == "auto" and "driver" in takes:
        # Its callers are HTTP handler threads that compute nothing, and an engine thread of its
        # own keeps sampling whether or not a handler waits, and a deadline stops a stuck forward.
        options["driver"] = "thread"
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend=backend,
                                                               backend_options=spec.options_class(**options)))
    torch.manual_seed(cfg.trainer.seed)  # the trainer's initial weights (see the module docstring)
    # An engine that loads the checkpoint itself needs the model's configs and tokenizers only.
    device = torch.device("meta") if spec.loads_own_weights else pick_device(cfg.trainer.device)
    model = build_model(cfg.model, device, tuple(cfg.plugins))
    engine = spec.build(cfg, model)
    try:
        return RolloutServer(engine, host, port, token=token, multi_turn=spec.multi_turn, max_body_bytes=max_body_bytes,
                             header_deadline_s=header_deadline_s, max_connections=max_connections)
    except BaseException:
        engine.close()
        raise


def main(argv: Sequence[str] | None = None) -> int:
    return server_args.run_main(_serve, argv)


def _serve(argv: Sequence[str] | None) -> int:
    parser = server_args.OneLineParser(prog="python -m omni_rl.rollout.server", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run's config as YAML")
    parser.add_argument("--backend", default="native", help="the in-process rollout backend to serve")
    parser.add_argument("--port", type=server_args.port, default=0, help="0 = a free port")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop serving when this process is gone")
    parser.add_argument("--token-file", default=None, metavar="PATH",
                        help=f"started by hand (no ${TOKEN_ENV}): the token file to read (mode 0600), or to write "
                             f"a fresh token to when PATH does not exist (default: a new file in the temp folder)")
    server_args.add_transport_options(parser, DEFAULT_MAX_BODY_BYTES)
    args = parser.parse_args(argv)
    if args.token_file is not None:
        args.token_file = os.path.expanduser(args.token_file)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="rollout server: %(levelname)s %(message)s")
    # The run's secret, from the trainer through the environment. Started by hand: from or into a token file.
    token = server_args.take_env_token(TOKEN_ENV)
    by_hand = token is None
    if by_hand and args.token_file is not None and os.path.lexists(args.token_file):
        token = server_args.read_token_option(args.token_file).token
    write_to = args.token_file if by_hand and token is None else None
    if by_hand and token is None:
        token = new_token()
    try:
        cfg = load_run_config(args.config)
        # Composed and checked by the trainer; this process binds its options blocks again.
        bind_blocks(cfg)
    except FileNotFoundError:
        raise ServerStartError(f"--config {args.config!r}: no such file; expected the run's config as YAML "
                               f"(omni_rl.config.to_yaml writes it)", 2) from None
    except (OSError, ValueError, OmegaConfBaseException, yaml.YAMLError) as err:
        raise ServerStartError(f"--config {args.config!r} is not a run's config: {' '.join(str(err).split())}",
                               2) from None
    try:
        server = build_server(cfg, args.backend, "127.0.0.1", args.port, token, args.max_body_bytes,
                              args.header_deadline_s, args.max_connections)
    except OSError as err:
        if err.errno is None:
            raise
        raise server_args.bind_failure("127.0.0.1", args.port, err) from None
    ready = {"url": server.url, "pid": os.getpid(), "protocol": PROTOCOL_VERSION}
    written = None
    if by_hand:  # say where the token is, never the token: stdout is often a log others can read
        if write_to is None and args.token_file is not None:
            ready["token_file"] = args.token_file
        else:
            try:
                written = server_args.write_token_option(write_to, token, server.url, prefix="omni-rl-rollout-token-")
            except ServerStartError:
                server.engine.close()
                server.server_close()
                raise
            ready["token_file"] = written
    if args.parent_pid is not None:
        threading.Thread(target=_stop_when_gone, args=(server, args.parent_pid), daemon=True).start()
    print(json.dumps(ready), flush=True)
    if written is not None and threading.current_thread() is threading.main_thread():
        # `kill PID` then ends serve_forever through the finally below, which removes the file.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.engine.close()
        server.server_close()
        if written is not None:  # its token dies with this server
            with contextlib.suppress(OSError):
                os.remove(written)
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(0)


def _stop_when_gone(server: RolloutServer, pid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            logging.getLogger(__name__).warning("the trainer (pid %d) is gone: stopping", pid)
            server.shutdown()
            return
        except PermissionError:  # alive, another user's
            pass

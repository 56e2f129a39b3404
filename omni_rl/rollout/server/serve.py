"""`python -m omni_rl.rollout.server --config run.yaml`: build the run's model and native engine, serve them.

The model is built as the trainer builds its own (`torch.manual_seed(trainer.seed)`, then
`build_model`), so a tiny random-weight model starts with the trainer's weights; the client
then sends the trainable tensors once (version 0) so that a resumed or otherwise different
start agrees too. The engine is `--backend`'s (default `native`; `vllm_omni`, `vllm`) over that
model: the run's config is read as if it named that backend, with the run's `rollout.options`
that the backend takes and `python` null (the engine runs here); a backend whose spec says
`loads_own_weights` gets the model built weightless (on the meta device).

The first line on stdout is one JSON object, `{"url": ..., "pid": ..., "protocol": 1}`, written
once the server answers; logs go to stderr. With `--parent-pid` the server stops when that
process is gone, so a trainer that was killed leaves no server behind.

Every request must carry the run's secret (`Authorization: Bearer <token>`, else 401): the
trainer hands it over in the environment variable `OMNI_RL_ROLLOUT_TOKEN`; a server started by
hand without it makes one and adds it to its first line (`"token": ...`). A command line that
cannot start (no --config, a config that is no file, the port in use) is one `error:` line:
exit 2 for bad input, 1 for a port in use.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import threading
import time
from typing import NoReturn, Optional, Sequence

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from omni_rl.config.schema import OmniConfig
from omni_rl.device import pick_device
from omni_rl.models.factory import build_model
from omni_rl.rollout.backends import ROLLOUT_BACKENDS
from omni_rl.rollout.server.app import DEFAULT_MAX_BODY_BYTES, RolloutServer
from omni_rl.rollout.server.protocol import PROTOCOL_VERSION, TOKEN_ENV
from omni_rl.utils.http_transport import bind_error, new_token


def load_run_config(path: str) -> OmniConfig:
    """A config `omni_rl.config.loader.to_yaml` wrote (already validated by the trainer)."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OmniConfig), OmegaConf.load(path)))


def build_server(cfg: OmniConfig, backend: str = "native", host: str = "127.0.0.1", port: int = 0,
                 token: Optional[str] = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> RolloutServer:
    if backend == "server":
        raise ValueError("--backend server would start a server from the server; name an in-process backend "
                         "(native, vllm_omni, vllm)")
    spec = ROLLOUT_BACKENDS.get(backend)
    # This process is the Python rollout.options.python named: here the engine runs in-process.
    takes = {f.name for f in dataclasses.fields(spec.options_class)}
    options = {key: value for key, value in cfg.rollout.options.items() if key in takes}
    if "python" in takes:
        options["python"] = None
    if options.get("driver", "auto") == "auto" and "driver" in takes:
        # Its callers are HTTP handler threads that compute nothing, and an engine thread of its
        # own keeps sampling whether or not a handler waits, and a deadline stops a stuck forward.
        options["driver"] = "thread"
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, backend=backend, options=options))
    torch.manual_seed(cfg.trainer.seed)  # the trainer's initial weights (see the module docstring)
    # An engine that loads the checkpoint itself needs the model's configs and tokenizers only.
    device = torch.device("meta") if spec.loads_own_weights else pick_device(cfg.trainer.device)
    model = build_model(cfg.model, device, tuple(cfg.plugins))
    engine = spec.build(cfg, model)
    try:
        return RolloutServer(engine, host, port, token=token, max_body_bytes=max_body_bytes)
    except BaseException:
        engine.close()
        raise


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}; expected a whole number of bytes >= 1")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse prints its usage too; one line is enough
        raise _StartError(f"{message} (see python -m omni_rl.rollout.server --help)", 2)


class _StartError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _serve(argv)
    except _StartError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code


def _serve(argv: Sequence[str] | None) -> int:
    parser = _Parser(prog="python -m omni_rl.rollout.server", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run's config as YAML")
    parser.add_argument("--backend", default="native", help="the in-process rollout backend to serve")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop serving when this process is gone")
    parser.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES,
                        help="the largest request body read (a larger one is answered 413)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="rollout server: %(levelname)s %(message)s")
    # The run's secret, from the trainer through the environment; removed from it so that
    # nothing this process starts inherits it. Started by hand: a fresh one, printed below.
    token = os.environ.pop(TOKEN_ENV, None) or None
    made_here = token is None
    if made_here:
        token = new_token()
    try:
        cfg = load_run_config(args.config)
    except FileNotFoundError:
        raise _StartError(f"--config {args.config!r}: no such file; expected the run's config as YAML "
                          f"(omni_rl.config.to_yaml writes it)", 2) from None
    except (OSError, ValueError, OmegaConfBaseException) as err:
        raise _StartError(f"--config {args.config!r} is not a run's config: {' '.join(str(err).split())}", 2) from None
    try:
        server = build_server(cfg, args.backend, "127.0.0.1", args.port, token, args.max_body_bytes)
    except OSError as err:
        if err.errno is None:
            raise
        raise _StartError(bind_error("127.0.0.1", args.port, err), 1) from None
    if args.parent_pid is not None:
        threading.Thread(target=_stop_when_gone, args=(server, args.parent_pid), daemon=True).start()
    ready = {"url": server.url, "pid": os.getpid(), "protocol": PROTOCOL_VERSION}
    # Only a server started by hand says its token (to the one who started it, on its stdout).
    print(json.dumps({**ready, "token": token} if made_here else ready), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.engine.close()
        server.server_close()
    return 0


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

"""``streamlearn serve --state DIR``: the HTTP query service on the live snapshot.

The state directory is checked before the server starts: a missing directory, one
that is not a streamlearn state, or one without a checkpoint (each waited for up to
``--wait`` seconds) stops the command with a one-line error. ``--token-file`` (or the
``STREAMLEARN_SERVE_TOKEN`` variable, read here and nowhere else) turns on bearer-token
authentication. ``--workers N`` runs N processes on one port, each
with its own snapshot; their latency histograms are merged through a temporary
prometheus_client multiprocess directory (removed at exit).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import os
import pickle
import shutil
import socket
import sys
import tempfile
from typing import Any

from ..config import ServiceConfig
from ..exceptions import StreamlearnError
from ..service_auth import TOKEN_ENV, load_token

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="HTTP query service on the live snapshot of a state directory",
        description="Serve predictions from the latest checkpoint of --state while a worker "
        "keeps training (each query moves to a newer checkpoint as soon as it is committed). "
        "Endpoints: POST /v1/predict, /v1/topk, /v1/embed, /v1/explain; GET /v1/snapshot, /healthz, "
        "/metrics; the dashboard at /; the OpenAPI document is at /openapi.json.",
    )
    parser.add_argument("--state", required=True, metavar="DIR", help="state directory a worker writes")
    parser.add_argument("--host", default=None, help=f"bind address (default: service.host, {ServiceConfig.host})")
    parser.add_argument("--port", type=int, default=None, help=f"port (default: service.port, {ServiceConfig.port})")
    parser.add_argument("--workers", type=int, default=1,
                        help="server processes sharing the port, each with its own snapshot (default: %(default)s)")
    parser.add_argument("--config", metavar="FILE", default=None, help="TOML config (its [service] section is used)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted override, e.g. --set service.max_batch=64 (repeatable)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long for the state directory and its first checkpoint before giving "
                        "up (default: %(default)s)")
    parser.add_argument("--token-file", metavar="FILE", default=None,
                        help="require 'Authorization: Bearer TOKEN' on every endpoint but /healthz, TOKEN being "
                        f"this file's content (or set {TOKEN_ENV}; never in a config file); the dashboard at / "
                        "asks a browser for it once. Default: no token")
    parser.add_argument("--device", default=None, help="torch device for queries (default: the stored learner.device)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per process; 0: the stored worker.torch_threads, as the library "
                        "sets them (docs/operations.md, 'Torch threads in your own program') (default: "
                        "%(default)s: single queries are too small to split, and the worker needs the other cores)")
    parser.add_argument("--access-log", action="store_true", help="log every request (costs CPU per request)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..service import Settings  # the CLI imports the service stack only when it is used

    settings = Settings(state=args.state, service=_service_config(args), wait=args.wait,
                        device=args.device, threads=args.threads or None,
                        token=load_token(args.token_file, os.environ))
    if not 0 <= args.wait < float("inf"):  # was: nan and inf waited for ever, -5 was taken as 0
        raise StreamlearnError(f"--wait must be a number of seconds >= 0, got {args.wait}")
    if args.workers < 1:
        raise StreamlearnError(f"--workers must be >= 1, got {args.workers}")
    if not 0 <= args.threads <= 1024:
        raise StreamlearnError(f"--threads must be in [0, 1024], got {args.threads}")
    if args.workers == 1:
        return _serve_one(settings, args.access_log)
    return _serve_many(settings, args.workers, args.access_log)


def _service_config(args: argparse.Namespace) -> ServiceConfig:
    from ..config import load_config

    for item in args.overrides:  # a [model] or [learner] key here would change nothing, silently
        key = item.partition("=")[0].strip()
        if not key.lower().startswith("service."):
            raise StreamlearnError(f"serve --set {key}: serve reads only [service] keys; the model's keys are the "
                                   "state's (a worker's --set changes them), the device is --device")
    service = load_config(args.config, args.overrides).service
    changes = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    return dataclasses.replace(service, **changes)  # --host and --port are checked as service.host and .port


class AppFactory:
    """``create_app(settings)``, then ``gc.freeze()``: the model and the app live as long
    as the process, so the collector need not walk them again (fewer long GC pauses in
    the latency tail).

    Picklable, for uvicorn's worker processes (``child=True``). There the settings travel
    as bytes, unpickled when the app is built: unpickling them imports the service and
    torch (1.4 s on a busy machine), which in the child's start-up ran before uvicorn
    answered its supervisor's health pings or caught Ctrl-C. And a child that cannot
    build the app says why in one line and exits with uvicorn's start-up failure
    status, which stops the parent, instead of dying with a traceback to be restarted
    without end."""

    def __init__(self, settings, child: bool = False) -> None:
        self._settings = pickle.dumps(settings)
        self.child = child

    @property
    def settings(self):
        return pickle.loads(self._settings)

    def __call__(self):
        from ..service import create_app

        try:
            app = create_app(self.settings)
        except (StreamlearnError, OSError, RuntimeError) as exc:  # RuntimeError: torch's (CUDA out of memory)
            if not self.child:
                raise
            print(f"streamlearn serve: error: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
            from uvicorn.config import STARTUP_FAILURE

            sys.exit(STARTUP_FAILURE)
        gc.collect()
        gc.freeze()
        return app


def _serve_one(settings, access_log: bool) -> int:
    import uvicorn

    sock = _listen(settings.service.host, settings.service.port)
    with sock:
        app = AppFactory(settings)()  # opens the snapshot (a bad --state fails here)
        log.info("serving %s (task %s, step %d) on http://%s:%d%s", settings.state, app.state.snapshot.task,
                 app.state.snapshot.step, settings.service.host, sock.getsockname()[1], auth_note(settings))
        config = uvicorn.Config(app, host=settings.service.host, port=sock.getsockname()[1], access_log=access_log,
                                log_level="info")
        uvicorn.Server(config).run(sockets=[sock])
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn, or one line saying why not (uvicorn's
    own bind logs the error and exits after the service said it was serving)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StreamlearnError(f"cannot listen on {host}:{port}: {exc.strerror or exc}: choose another --port "
                               "(or --host), or stop what holds it") from exc
    sock.set_inheritable(True)  # uvicorn's worker processes take it over
    return sock


HEALTHCHECK_S = 15.0  # uvicorn's supervisor: how long a server process may take to answer (default 5)


def _serve_many(settings, workers: int, access_log: bool) -> int:
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from ..snapshot import open_ready_store

    open_ready_store(settings.state, settings.wait).close()  # fail before the workers start
    if settings.device is not None:
        from ..device import check_device

        check_device(settings.device)  # as the processes will (a child's failure is found in seconds, not at once)
    metrics_dir = tempfile.mkdtemp(prefix="streamlearn-metrics-")
    # prometheus_client reads this in each worker process when it is first imported there.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        factory = AppFactory(dataclasses.replace(settings, metrics_dir=metrics_dir), child=True)
        # a process builds its app (the model from the state) before it serves; on a busy
        # machine that took longer than uvicorn's 5 s health check, which killed it
        config = uvicorn.Config(factory, factory=True, host=settings.service.host, port=settings.service.port,
                                workers=workers, access_log=access_log, log_level="info",
                                timeout_worker_healthcheck=HEALTHCHECK_S)
        sock = _listen(settings.service.host, settings.service.port)
        log.info("serving %s with %d workers on http://%s:%d%s", settings.state, workers,
                 settings.service.host, sock.getsockname()[1], auth_note(settings))
        supervisor = Multiprocess(config, sockets=[sock])
        with sock:
            supervisor.run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        raise StreamlearnError("a server process could not start (its error is above); stopped them all")
    return 0


def auth_note(settings) -> str:
    if settings.token:
        return " (bearer token required but on /healthz)"
    if settings.service.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("serving on %s without a token: anyone who reaches this address can query the model "
                    "(--token-file, or STREAMLEARN_SERVE_TOKEN)", settings.service.host)
    return " (no authentication)"

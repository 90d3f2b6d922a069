"""The HTTP query service: ``create_app(settings)`` builds a FastAPI app over one
:class:`~streamlearn.snapshot.Snapshot` (``streamlearn serve`` runs it with uvicorn).

Endpoints (JSON; the OpenAPI document is at ``/openapi.json``):

- ``POST /v1/predict``: ``text`` or ``tokens`` -> ``label`` and ``probs`` (classify);
- ``POST /v1/topk``: ``text``/``tokens`` (mlm: the ``[MASK]`` to fill) or ``key``/``tokens``
  (next-item) -> ``tokens``, ``scores`` (log-probabilities) and the ``exact`` certificate;
- ``POST /v1/embed``: ``text`` or ``tokens`` -> each token's input vector;
- ``GET /v1/snapshot`` (the manifest), ``GET /healthz``, ``GET /metrics`` (Prometheus).

Each POST takes one query (its fields at the top level) or a batch (``records``: a list
of queries, at most ``service.max_batch``); a batch answer lists ``results`` in order.
Every answer carries ``snapshot_step``: the checkpoint that produced it.

Bad requests get a 4xx with a JSON body ``{"error": CODE, "detail": ...}``, never a 5xx:
422 for a request that fails validation (limits: ``service.max_tokens`` tokens per
query, ``service.max_batch`` queries per batch), 409 for a query the model's task
cannot answer (top-k of a classifier), 413 for a body over ``Settings.max_body_bytes``.
503 means the state directory became unreadable (the only 5xx).

Queries run inline on the event loop: the snapshot serializes them anyway (one model,
shared tables), and skipping a thread hop per request keeps latency down. Requests that
arrive together are answered by one snapshot call (:class:`_Coalescer`): under load, the
per-call costs (read transaction, manifest check, forward pass set-up) are paid once per
group instead of once per request; an idle service adds no delay.
"""
# No `from __future__ import annotations`: FastAPI must see the request models built in
# create_app as classes, not as strings it cannot resolve.
import asyncio
import contextlib
import dataclasses
import math
import time
from typing import Annotated, Any, Callable, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from ._version import __version__
from .config import ServiceConfig
from .decoding import DecodingError
from .device import set_threads
from .exceptions import RecordError, StreamlearnError
from .snapshot import Answer, Snapshot, TaskMismatchError

__all__ = ["Settings", "create_app"]

CHARS_PER_TOKEN = 64  # a text may be up to max_tokens * this many characters
MAX_TOKEN_CHARS = 1024  # one token (or key) string
MAX_K = 1000
MAX_BEAM = 10_000
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
COALESCE_RECORDS = 64  # records per coalesced snapshot call (a larger batch request runs alone)
ENDPOINTS = ("/v1/predict", "/v1/topk", "/v1/embed", "/v1/snapshot", "/healthz", "/metrics")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one service process needs (picklable: uvicorn workers receive it).

    ``wait``: seconds to wait at start for a first checkpoint. ``device`` overrides the
    stored ``learner.device``. ``threads``: torch intra-op threads (None leaves torch's
    default). ``metrics_dir``: prometheus_client's multiprocess directory when several
    workers share one port (``streamlearn serve --workers N`` sets it).
    """

    state: str
    service: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)
    wait: float = 0.0
    device: str | None = None
    threads: int | None = None
    max_body_bytes: int = 8 * 2**20
    metrics_dir: str | None = None


# ---------------------------------------------------------------------------- request models

Token = Union[Annotated[StrictStr, Field(max_length=MAX_TOKEN_CHARS)], Annotated[StrictInt, Field(ge=-(2**63), lt=2**64)]]


def _request_models(cfg: ServiceConfig) -> dict[str, type[BaseModel]]:
    """Request models whose limits come from ``cfg`` (max_tokens, max_batch)."""
    Text = Annotated[StrictStr, Field(max_length=cfg.max_tokens * CHARS_PER_TOKEN)]
    Tokens = Annotated[list[Token], Field(max_length=cfg.max_tokens)]
    forbid = ConfigDict(extra="forbid")

    class Query(BaseModel):
        """One record: ``text`` (tokenized by the model's tokenizer) or ``tokens``."""

        model_config = forbid
        text: Text | None = None
        tokens: Tokens | None = None

        @model_validator(mode="after")
        def _one_input(self):
            _exactly_one(self, ("text", "tokens"))
            return self

    class TopKQuery(BaseModel):
        """mlm: ``text`` or ``tokens`` with a ``[MASK]`` (appended if absent); next-item:
        ``key`` (its stored history) or ``tokens`` (a history given explicitly)."""

        model_config = forbid
        text: Text | None = None
        tokens: Tokens | None = None
        key: Token | None = None

        @model_validator(mode="after")
        def _one_input(self):
            _exactly_one(self, ("text", "tokens", "key"))
            return self

    Batch = Annotated[list[Query], Field(min_length=1, max_length=cfg.max_batch)]
    TopKBatch = Annotated[list[TopKQuery], Field(min_length=1, max_length=cfg.max_batch)]

    class QueryRequest(BaseModel):
        """One query (``text`` or ``tokens``) or a batch (``records``)."""

        model_config = forbid
        text: Text | None = None
        tokens: Tokens | None = None
        records: Batch | None = None

        @model_validator(mode="after")
        def _one_input(self):
            _exactly_one(self, ("text", "tokens", "records"))
            return self

    class TopKRequest(BaseModel):
        """One query (``text``, ``tokens`` or ``key``) or a batch (``records``); ``k``
        answers each, beam width ``beam`` (default: the model's ``learner.beam``)."""

        model_config = forbid
        text: Text | None = None
        tokens: Tokens | None = None
        key: Token | None = None
        records: TopKBatch | None = None
        k: int = Field(10, ge=1, le=MAX_K, strict=True)
        beam: int | None = Field(None, ge=1, le=MAX_BEAM, strict=True)

        @model_validator(mode="after")
        def _one_input(self):
            _exactly_one(self, ("text", "tokens", "key", "records"))
            return self

    return {"QueryRequest": QueryRequest, "TopKRequest": TopKRequest}


def _exactly_one(model: BaseModel, names: tuple[str, ...]) -> None:
    given = [n for n in names if getattr(model, n) is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(names)} (got {', '.join(given) or 'none'})")


def _records(request: BaseModel, fields: tuple[str, ...]) -> tuple[list[dict], bool]:
    """The request's queries as records, and whether it was a batch."""
    if request.records is not None:
        return [_record(q, fields) for q in request.records], True
    return [_record(request, fields)], False


def _record(query: BaseModel, fields: tuple[str, ...]) -> dict:
    return {n: getattr(query, n) for n in fields if getattr(query, n) is not None}


# ---------------------------------------------------------------------------- response models

class PredictResult(BaseModel):
    label: str | int | None = Field(description="the most probable label (null before any label was seen)")
    probs: dict[str, float | None] = Field(description="probability of every label seen so far")


class PredictResponse(BaseModel):
    snapshot_step: int
    label: str | int | None = None
    probs: dict[str, float | None] | None = None
    results: list[PredictResult] | None = None


class TopKResult(BaseModel):
    tokens: list[str]
    scores: list[float | None] = Field(description="log-probabilities, best first")
    exact: bool = Field(description="certified equal to scoring every candidate")


class TopKResponse(BaseModel):
    snapshot_step: int
    tokens: list[str] | None = None
    scores: list[float | None] | None = None
    exact: bool | None = None
    results: list[TopKResult] | None = None


class EmbedResult(BaseModel):
    tokens: list[str]
    vectors: list[list[float | None]] = Field(description="one input vector per token")


class EmbedResponse(BaseModel):
    snapshot_step: int
    dim: int
    tokens: list[str] | None = None
    vectors: list[list[float | None]] | None = None
    results: list[EmbedResult] | None = None


def _finite(values) -> list[float | None]:
    # Strict JSON has no inf/NaN; a -inf log-probability is reported as null.
    return [v if math.isfinite(v) else None for v in map(float, values)]


def _predict_result(probs: dict) -> dict:
    label = max(probs, key=probs.get) if probs else None
    # A model whose weights went NaN must not turn every answer into a 500: nulls instead.
    return {"label": label, "probs": dict(zip(map(str, probs), _finite(probs.values())))}


def _topk_result(top) -> dict:
    return {"tokens": list(top.tokens), "scores": _finite(top.scores), "exact": bool(top.exact)}


def _embed_result(tv) -> dict:
    return {"tokens": tv.tokens, "vectors": [_finite(row) for row in tv.vectors]}


def _respond(answer: Answer, batch: bool, convert: Callable[[Any], dict], **extra: Any) -> JSONResponse:
    """The answer as JSON. Returned as a response, so FastAPI skips re-validating it
    against the response model (which documents it in the OpenAPI document)."""
    results = [convert(v) for v in answer.values]
    body = {"snapshot_step": answer.step, **extra}
    if batch:
        body["results"] = results
    else:
        body.update(results[0])
    return JSONResponse(body)


# ---------------------------------------------------------------------------- the app

def create_app(settings: Settings) -> FastAPI:
    """The service over ``settings.state``. Opens the snapshot now, so a missing
    directory, one that is not a streamlearn state, or one without a checkpoint fails
    here with a :class:`~streamlearn.exceptions.StreamlearnError` that says what to do."""
    if settings.threads:
        set_threads(settings.threads)  # kept: the snapshot's learner does not adjust it
    snapshot = Snapshot.open(settings.state, wait=settings.wait, device=settings.device)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        snapshot.close()

    app = FastAPI(title="streamlearn", version=__version__, lifespan=lifespan,
                  description="Queries on the live snapshot of a streamlearn state directory.")
    app.state.snapshot = snapshot
    app.state.metrics = _Metrics(snapshot, settings.metrics_dir)
    app.add_middleware(_Guard, metrics=app.state.metrics, max_body_bytes=settings.max_body_bytes)
    _add_error_handlers(app)
    _add_query_routes(app, snapshot, settings.service)
    _add_status_routes(app, snapshot)
    return app


def _add_query_routes(app: FastAPI, snapshot: Snapshot, cfg: ServiceConfig) -> None:
    models = _request_models(cfg)
    QueryRequest, TopKRequest = models["QueryRequest"], models["TopKRequest"]
    coalescer = _Coalescer(max(cfg.max_batch, COALESCE_RECORDS))

    @app.post("/v1/predict", response_model=PredictResponse)
    async def predict(request: QueryRequest) -> JSONResponse:
        """Label and probabilities (task classify) for one query or a batch."""
        records, batch = _records(request, ("text", "tokens"))
        answer = await coalescer.run(("predict",), snapshot.predict_proba, records)
        return _respond(answer, batch, _predict_result)

    @app.post("/v1/topk", response_model=TopKResponse)
    async def topk(request: TopKRequest) -> JSONResponse:
        """The k best tokens (task mlm: at the [MASK]; next-item: after the history)."""
        records, batch = _records(request, ("text", "tokens", "key"))
        k, beam = request.k, request.beam
        answer = await coalescer.run(("topk", k, beam), lambda rs: snapshot.topk(rs, k=k, beam=beam), records)
        return _respond(answer, batch, _topk_result)

    @app.post("/v1/embed", response_model=EmbedResponse)
    async def embed(request: QueryRequest) -> JSONResponse:
        """Each token's input embedding (the scheme's output, before the encoder)."""
        records, batch = _records(request, ("text", "tokens"))
        answer = await coalescer.run(("embed",), snapshot.embed, records)
        return _respond(answer, batch, _embed_result, dim=snapshot.embedding_dim)


def _add_status_routes(app: FastAPI, snapshot: Snapshot) -> None:
    @app.get("/v1/snapshot")
    async def manifest() -> dict:
        """The store's manifest (step, offsets, tables, config, metrics) and the step
        answers now come from."""
        step = snapshot.refresh()
        return {"snapshot_step": step, "task": snapshot.task, "manifest": snapshot.manifest().to_dict()}

    @app.get("/healthz")
    async def healthz() -> dict:
        """200 while the snapshot can be read: its step and age."""
        step = snapshot.refresh()
        return {"status": "ok", "snapshot_step": step, "freshness_seconds": _freshness(snapshot)}

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus: request latency histogram, snapshot step, freshness."""
        snapshot.refresh()
        return Response(app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _freshness(snapshot: Snapshot) -> float | None:
    at = snapshot.committed_at
    return None if at is None else max(0.0, time.time() - at)


# ---------------------------------------------------------------------------- coalescing

class _Coalescer:
    """Answers requests that arrive in the same event-loop turn with one snapshot call.

    The first request of a kind schedules a flush with ``call_soon``; the requests whose
    handlers run before it (they arrived together, or while the previous call computed)
    join the group. Each gets its slice of the one answer, so all carry the same step. A
    group whose records fail (a bad record, a bad k) is rerun request by request, so an
    error reaches only the request that caused it.
    """

    def __init__(self, max_records: int):
        self.max_records = max_records
        self._pending: dict[tuple, list[tuple[list, asyncio.Future]]] = {}

    async def run(self, key: tuple, call: Callable[[list], Answer], records: list) -> Answer:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        queue = self._pending.setdefault(key, [])
        queue.append((records, future))
        if len(queue) == 1:
            loop.call_soon(self._flush, key, call)
        return await future

    def _flush(self, key: tuple, call: Callable[[list], Answer]) -> None:
        for group in _groups(self._pending.pop(key), self.max_records):
            if len(group) == 1:
                _settle(group, call)
                continue
            try:
                answer = call([r for records, _ in group for r in records])
            except (RecordError, DecodingError):
                for item in group:
                    _settle([item], call)
                continue
            except Exception as exc:  # the store failed: every request in the group gets it
                for _, future in group:
                    _set(future, exception=exc)
                continue
            start = 0
            for records, future in group:
                values = answer.values[start:start + len(records)]
                start += len(records)
                _set(future, result=dataclasses.replace(answer, values=values))


def _groups(items: list, max_records: int) -> list[list]:
    """Consecutive requests, at most ``max_records`` records per group (a larger request
    is a group of its own)."""
    groups, size = [], max_records
    for item in items:
        if size + len(item[0]) > max_records:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += len(item[0])
    return groups


def _settle(group: list, call: Callable[[list], Answer]) -> None:
    records, future = group[0]
    try:
        _set(future, result=call(records))
    except Exception as exc:
        _set(future, exception=exc)


def _set(future: asyncio.Future, result: Any = None, exception: BaseException | None = None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


# ---------------------------------------------------------------------------- errors

def _error(status: int, code: str, detail: Any) -> JSONResponse:
    return JSONResponse({"error": code, "detail": detail}, status_code=status)


_ERRORS = (  # library error -> HTTP status, error code
    (RecordError, 422, "bad-record"),
    (DecodingError, 422, "bad-query"),
    (TaskMismatchError, 409, "wrong-task"),
    (StreamlearnError, 503, "snapshot-unavailable"),
)


def _reply_with(status: int, code: str):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        return _error(status, code, str(exc))
    return handler


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Only loc/msg/type: an error's input or ctx may not be JSON (bytes, exceptions).
        detail = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in exc.errors()]
        return _error(422, "invalid-request", detail)

    # Handlers are looked up along the exception's MRO, so the subclasses in _ERRORS win over
    # StreamlearnError: every other library error means the snapshot cannot answer.
    for error, status, code in _ERRORS:
        app.add_exception_handler(error, _reply_with(status, code))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "bad-request", 404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}
        code = codes.get(exc.status_code, "http-error")
        return JSONResponse({"error": code, "detail": exc.detail}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


# ---------------------------------------------------------------------------- metrics

class _Metrics:
    """Request latency histogram and request counter (shared across workers through
    prometheus_client's multiprocess directory when ``metrics_dir`` is set), and the
    snapshot's step and freshness, computed at scrape time."""

    def __init__(self, snapshot: Snapshot, metrics_dir: str | None):
        self.registry = CollectorRegistry()
        own = None if metrics_dir else self.registry
        if metrics_dir:
            from prometheus_client import multiprocess
            multiprocess.MultiProcessCollector(self.registry, path=metrics_dir)
        self.latency = Histogram("streamlearn_request_seconds", "HTTP request latency (seconds)",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=own)
        self.requests = Counter("streamlearn_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=own)
        self.registry.register(_SnapshotCollector(snapshot))

    def observe(self, path: str, status: int, seconds: float) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        self.latency.labels(endpoint).observe(seconds)
        self.requests.labels(endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SnapshotCollector:
    """Step and freshness of this process's snapshot (every worker reads the same store
    and refreshes per query, so the scraped worker speaks for all)."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot

    def collect(self):
        step = GaugeMetricFamily("streamlearn_snapshot_step", "manifest step of the snapshot answering queries")
        step.add_metric([], self.snapshot.step)
        fresh = GaugeMetricFamily("streamlearn_snapshot_freshness_seconds",
                                  "now minus the commit time of the snapshot answering queries")
        age = _freshness(self.snapshot)
        fresh.add_metric([], float("nan") if age is None else age)
        return [step, fresh]


class _Guard:
    """ASGI middleware: times every request into the metrics and refuses bodies over
    ``max_body_bytes`` with a JSON 413 (counted as they stream in, so a missing or
    false Content-Length does not get past it)."""

    def __init__(self, app, metrics: _Metrics, max_body_bytes: int):
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope = _json_by_default(scope)
        start, status = time.perf_counter(), [500]
        received = [0]

        async def limited_receive():
            message = await receive()
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > self.max_body_bytes:
                    raise _TooLarge(self.max_body_bytes)
            return message

        async def tracking_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if _declared_length(scope) > self.max_body_bytes:
                too_large = _TooLarge(self.max_body_bytes)
                status[0] = too_large.status_code
                await _error(too_large.status_code, "body-too-large", too_large.detail)(scope, receive, send)
            else:
                await self.app(scope, limited_receive, tracking_send)
        finally:
            self.metrics.observe(scope.get("path", ""), status[0], time.perf_counter() - start)


class _TooLarge(StarletteHTTPException):
    """Raised while the body streams in; FastAPI passes HTTP exceptions through its body
    parsing, so the error handlers answer 413."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body over {limit} bytes: send smaller batches or raise the limit")


_FORM = b"application/x-www-form-urlencoded"


def _json_by_default(scope):
    """Every body this API takes is JSON, so a body sent without a content type, or
    with the form type that ``curl -d`` sets by default, is read as JSON rather than
    refused: ``curl localhost:8000/v1/predict -d '{"text": "hi"}'`` works as pasted."""
    headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
    declared = [v for k, v in scope.get("headers", ()) if k == b"content-type"]
    if declared and not declared[0].startswith(_FORM):
        return scope
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


def _declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0
    return 0

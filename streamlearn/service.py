"""The HTTP query service: ``create_app(settings)`` builds a FastAPI app over one
:class:`~streamlearn.snapshot.Snapshot` (``streamlearn serve`` runs it with uvicorn).

Endpoints (JSON; the OpenAPI document is at ``/openapi.json``):

- ``POST /v1/predict``: ``text`` or ``tokens`` -> ``label`` and ``probs`` (classify);
- ``POST /v1/topk``: ``text``/``tokens`` (mlm: the ``[MASK]`` to fill; next-token: the prefix)
  or ``key``/``tokens`` (next-item), ``exclude`` the answers to leave out -> ``tokens``,
  ``scores`` (log-probabilities) and the ``exact`` certificate;
- ``POST /v1/embed``: ``text`` or ``tokens`` -> each token's input vector;
- ``POST /v1/explain``: per-token contributions to an answer (:mod:`streamlearn.service_explain`);
- ``GET /v1/snapshot`` (the manifest), ``GET /healthz``, ``GET /metrics`` (Prometheus);
- ``GET /``: the dashboard, and ``GET /v1/dashboard`` its data (:mod:`streamlearn.dashboard`).

Each POST takes one query (its fields at the top level) or a batch (``records``: a list
of queries, at most ``service.max_batch``); a batch answer lists ``results`` in order.
Every answer carries ``snapshot_step``: the checkpoint that produced it.

Bad requests get a 4xx with a JSON body ``{"error": CODE, "detail": ...}``, never a 5xx
(docs/serving.md has the table): 400 for a body that is not UTF-8 JSON, 401 without the
bearer token when one is set (:mod:`streamlearn.service_auth`; ``/healthz`` stays open),
422 for a request that fails validation (a query without input; limits:
``service.max_tokens`` tokens per query, ``service.max_batch`` queries per batch), 409 for
a query the model's task cannot answer (top-k of a classifier), 413 for a body over
``service.max_body_bytes`` or a request over ``service.max_request_tokens``. 503 means
the state directory became unreadable (the only 5xx; :mod:`streamlearn.service_health`).

Requests that arrive together, or while a call computes, are answered by one snapshot
call (:class:`_Coalescer`): under load, the per-call costs (read transaction, manifest
check, forward pass set-up) are paid once per group instead of once per request; an idle
service adds no delay. A large group (over ``INLINE_TOKENS`` tokens, any top-k, or one
that must first advance to a new checkpoint) runs on the query thread
(:class:`_QueryThread`), so it never stalls the event loop: requests keep being read and
``/healthz`` keeps answering. A small group runs on the loop, which it holds for a few
milliseconds: handing it to the thread and back cost more than the group itself.
"""
# No `from __future__ import annotations`: FastAPI must see the request models built in
# create_app as classes, not as strings it cannot resolve.
import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import math
import time
from typing import Annotated, Any, Callable, Union

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from ._version import __version__
from .config import ServiceConfig
from .decoding import DecodingError
from .device import set_threads
from .exceptions import RecordError, StreamlearnError
from .records import MAX_NAME_CHARS
from .service_auth import BearerToken
from .service_guard import Guard, JsonRoute, TooLarge, json_error
from .service_health import StateWatch
from .snapshot import Answer, Snapshot, TaskMismatchError

__all__ = ["Settings", "create_app"]

CHARS_PER_TOKEN = 64  # a text may be up to max_tokens * this many characters
MAX_TOKEN_CHARS = MAX_NAME_CHARS  # one token (or key) string: as a record's label, key or item
MAX_K = 1000
MAX_EXCLUDE = 10_000  # tokens or items one top-k query may leave out
MAX_BEAM = 10_000
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
COALESCE_RECORDS = 64  # records per coalesced snapshot call (a larger batch request runs alone)
INLINE_TOKENS = 1024  # a group this small runs on the event loop (a few ms of predict/embed work)
ENDPOINTS = ("/v1/predict", "/v1/topk", "/v1/embed", "/v1/explain", "/v1/snapshot", "/v1/dashboard", "/healthz",
             "/metrics", "/", "/login")


@dataclasses.dataclass(frozen=True)
class Settings:
    """What one service process needs (picklable: uvicorn workers receive it).

    ``wait``: seconds to wait at start for the state directory and its first checkpoint.
    ``device`` overrides the stored ``learner.device``. ``threads``: torch intra-op
    threads (None leaves torch's default). ``metrics_dir``: prometheus_client's
    multiprocess directory when several workers share one port (``streamlearn serve
    --workers N`` sets it). ``token``: every endpoint but ``/healthz`` needs it as
    ``Authorization: Bearer ...`` (None: no authentication).
    """

    state: str
    service: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)
    wait: float = 0.0
    device: str | None = None
    threads: int | None = None
    metrics_dir: str | None = None
    token: BearerToken | None = None


# ---------------------------------------------------------------------------- request models

Token = Union[Annotated[StrictStr, Field(max_length=MAX_TOKEN_CHARS)], Annotated[StrictInt, Field(ge=-(2**63), lt=2**64)]]


def not_blank(text: str, hint: str = "") -> str:
    """``text`` unless it is empty or only whitespace (a ValueError that says so, and ``hint``)."""
    if text.isspace() or not text:
        raise ValueError("text is empty or only whitespace: send at least one word" + hint)
    return text


def text_field(max_chars: int, hint: str = "") -> Any:
    """A request's ``text``: a string of at most ``max_chars`` characters, not blank."""
    return Annotated[StrictStr, Field(max_length=max_chars, json_schema_extra={"minLength": 1, "pattern": r"\S"}),
                     AfterValidator(functools.partial(not_blank, hint=hint))]


def _request_models(cfg: ServiceConfig) -> dict[str, type[BaseModel]]:
    """Request models whose limits come from ``cfg`` (max_tokens, max_batch). A query
    without input (blank text, no tokens) fails validation: the model would answer it
    from nothing (a classifier's label prior), which no caller means to ask. Top-k is
    the exception for an explicit ``"tokens": []``: an empty prefix asks next-token for
    a record's first token (a keyboard's suggestions before anything is typed), an empty
    history asks next-item what a new key starts with, as an unknown ``key`` does."""
    Text = text_field(cfg.max_tokens * CHARS_PER_TOKEN,
                      ' (/v1/topk asks for a first token or a new key\'s first item with "tokens": [])')
    Tokens = Annotated[list[Token], Field(min_length=1, max_length=cfg.max_tokens)]
    Context = Annotated[list[Token], Field(min_length=0, max_length=cfg.max_tokens)]  # top-k's: may be empty
    Exclude = Annotated[list[Token], Field(max_length=MAX_EXCLUDE)]  # top-k: answers to leave out
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
        """mlm: ``text`` or ``tokens`` with a ``[MASK]`` (appended if absent); next-token:
        the prefix, ``text`` or ``tokens`` (``[]``: a record's first token); next-item:
        ``key`` (its stored history) or ``tokens`` (a history given explicitly). ``exclude``:
        tokens or items the list leaves out (e.g. what the key already had)."""

        model_config = forbid
        text: Text | None = None
        tokens: Context | None = None
        key: Token | None = None
        exclude: Exclude | None = None

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
        """One query (``text``, ``tokens`` or ``key``, with its ``exclude``) or a batch
        (``records``, each with its own); ``k`` answers each, beam width ``beam`` (default:
        the model's ``learner.beam``)."""

        model_config = forbid
        text: Text | None = None
        tokens: Context | None = None
        key: Token | None = None
        exclude: Exclude | None = None
        records: TopKBatch | None = None
        k: int = Field(10, ge=1, le=MAX_K, strict=True)
        beam: int | None = Field(None, ge=1, le=MAX_BEAM, strict=True)

        @model_validator(mode="after")
        def _one_input(self):
            _exactly_one(self, ("text", "tokens", "key", "records"))
            if self.records is not None and self.exclude is not None:
                raise ValueError("exclude goes inside each of records (one list per query)")
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


def _check_size(records: list[dict], limit: int) -> int:
    """The request's tokens; 413 over ``limit``: the model work of one request, which
    every other request of the process waits behind, stays bounded."""
    n = sum(_tokens_in(r) for r in records)
    if n > limit:
        raise TooLarge("request-too-large", f"the request carries {n} tokens, over service.max_request_tokens="
                        f"{limit} (tokens items, words of text, 1 per key): send fewer or shorter queries "
                        "per request, or raise the limit")
    return n


def _tokens_in(record: dict) -> int:
    if "tokens" in record:
        return len(record["tokens"])
    if "text" in record:
        return len(record["text"].split())
    return 1  # a key: its stored history is at most learner.history tokens


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
    from .dashboard import Dashboard, add_dashboard_routes, login_page
    from .service_explain import add_explain_route  # imports this module's request types: not at the top

    snapshot = Snapshot.open(settings.state, wait=settings.wait, device=settings.device)
    watch = StateWatch(settings.state)
    worker = _QueryThread()
    dashboard = Dashboard(settings.state)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        worker.close()  # the last query ends before the store closes under it
        dashboard.close()
        snapshot.close()

    app = FastAPI(title="streamlearn", version=__version__, lifespan=lifespan,
                  description="Queries on the live snapshot of a streamlearn state directory.")
    app.state.snapshot = snapshot
    app.state.metrics = _Metrics(snapshot, watch, settings.metrics_dir)
    app.add_middleware(Guard, observe=app.state.metrics.observe, max_body_bytes=settings.service.max_body_bytes,
                       token=settings.token, login_page=login_page())
    _add_error_handlers(app)
    coalescer = _Coalescer(worker, watch.guard, functools.partial(watch.probe, snapshot.behind),
                           _coalesce_records(settings))  # every read of the store goes through the watch
    _add_query_routes(app, snapshot, settings.service, coalescer)
    _add_status_routes(app, snapshot, worker, watch)
    limit = settings.service.max_request_tokens
    add_explain_route(app, snapshot, settings.service, run=functools.partial(worker.run, watch.guard),
                      check_size=lambda records: _check_size(records, limit))
    add_dashboard_routes(app, dashboard, check=watch.check, token=settings.token)
    return app


class ErrorResponse(BaseModel):
    """Every error answer: a reason code and what to change."""

    error: str = Field(description="reason code: bad-request, invalid-request, unauthorized, wrong-task, "
                                   "body-too-large, snapshot-unavailable, ...")
    detail: Any = Field(description="what went wrong and what to change (a list of fields for invalid-request)")


# What every query endpoint can answer besides 200 and 422 (was missing from /openapi.json).
QUERY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "the body is not JSON, not UTF-8, or a record is bad"},
    401: {"model": ErrorResponse, "description": "no bearer token, or the wrong one (when the service has one)"},
    409: {"model": ErrorResponse, "description": "the model's task does not answer this endpoint"},
    413: {"model": ErrorResponse, "description": "the body or the request's tokens exceed the service's limits"},
    503: {"model": ErrorResponse, "description": "the state cannot be read: `detail` says why and what to do"},
}


def _coalesce_records(settings: Settings) -> int:
    return max(settings.service.max_batch, COALESCE_RECORDS)


def _add_query_routes(app: FastAPI, snapshot: Snapshot, cfg: ServiceConfig, coalescer: "_Coalescer") -> None:
    models = _request_models(cfg)
    QueryRequest, TopKRequest = models["QueryRequest"], models["TopKRequest"]
    router = APIRouter(route_class=JsonRoute, responses=QUERY_ERRORS)

    @router.post("/v1/predict", response_model=PredictResponse)
    async def predict(request: QueryRequest) -> JSONResponse:
        """Label and probabilities (task classify) for one query or a batch."""
        snapshot.need_labels("POST /v1/predict")  # the endpoint in the 409, not the Python method
        records, batch = _records(request, ("text", "tokens"))
        cost = _check_size(records, cfg.max_request_tokens)
        answer = await coalescer.run(("predict",), snapshot.predict_proba, records, cost)
        return _respond(answer, batch, _predict_result)

    @router.post("/v1/topk", response_model=TopKResponse)
    async def topk(request: TopKRequest) -> JSONResponse:
        """The k best tokens (task mlm: at the [MASK]; next-token: after the prefix;
        next-item: after the history)."""
        records, batch = _records(request, ("text", "tokens", "key", "exclude"))
        _check_size(records, cfg.max_request_tokens)
        k, beam = request.k, request.beam
        answer = await coalescer.run(("topk", k, beam), lambda rs: snapshot.topk(rs, k=k, beam=beam), records)
        return _respond(answer, batch, _topk_result)

    @router.post("/v1/embed", response_model=EmbedResponse)
    async def embed(request: QueryRequest) -> JSONResponse:
        """Each token's input embedding (the scheme's output, before the encoder)."""
        records, batch = _records(request, ("text", "tokens"))
        cost = _check_size(records, cfg.max_request_tokens)
        answer = await coalescer.run(("embed",), snapshot.embed, records, cost)
        return _respond(answer, batch, _embed_result, dim=snapshot.embedding_dim)

    app.include_router(router)


def _add_status_routes(app: FastAPI, snapshot: Snapshot, worker: "_QueryThread", watch: StateWatch) -> None:
    @app.get("/v1/snapshot")
    async def manifest() -> dict:
        """The store's manifest (step, offsets, tables, config, metrics) and the step
        answers now come from."""
        return await worker.run(watch.guard, _manifest, snapshot)

    @app.get("/healthz", responses={503: {"description": "the state cannot be read: `detail` says why and what to do"}})
    async def healthz() -> JSONResponse:
        """200 while the state can be read (its step and age); 503 when the directory is
        gone or replaced, or the last read of the store failed."""
        await _refresh_if_idle(snapshot, worker, watch)
        problem = watch.problem()
        if problem is not None:
            return JSONResponse({"status": "unavailable", "error": "snapshot-unavailable", "detail": problem,
                                 "snapshot_step": snapshot.step}, status_code=503)
        return JSONResponse({"status": "ok", "snapshot_step": snapshot.step, "freshness_seconds": _freshness(snapshot)})

    @app.head("/healthz", include_in_schema=False)  # load balancers and uptime checkers probe with HEAD (was: 405)
    async def healthz_head() -> JSONResponse:
        return await healthz()

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus: request latency histogram, snapshot step, freshness, availability."""
        await _refresh_if_idle(snapshot, worker, watch)
        return Response(app.state.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _manifest(snapshot: Snapshot) -> dict:
    step = snapshot.refresh()
    return {"snapshot_step": step, "task": snapshot.task, "manifest": snapshot.manifest().to_dict()}


async def _refresh_if_idle(snapshot: Snapshot, worker: "_QueryThread", watch: StateWatch) -> None:
    """Move to the latest checkpoint unless queries are running: they refresh anyway, and
    a health check must not wait behind a slow query (their outcome is in ``watch``)."""
    if worker.busy:
        return
    with contextlib.suppress(StreamlearnError):  # recorded by the watch: problem() reports it
        await worker.run(watch.probe, snapshot.refresh)


def _freshness(snapshot: Snapshot) -> float | None:
    at = snapshot.committed_at
    return None if at is None else max(0.0, time.time() - at)


# ---------------------------------------------------------------------------- off the event loop

class _QueryThread:
    """The thread large snapshot calls run on, so their model work (tokenizing,
    featurizing, row reads, the forward pass, decoding) never blocks the event loop:
    requests keep being read and /healthz keeps answering while they compute. One thread
    is enough: the snapshot serializes its calls anyway (one model, shared tables).
    ``busy``: calls submitted whose end the loop has not yet seen."""

    def __init__(self):
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamlearn-query")
        self.busy = 0

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        self.busy += 1
        future = self._executor.submit(fn, *args)
        # Counted down on the loop when the call has ended, not when its awaiter is
        # cancelled: while busy, the thread may hold the snapshot's lock.
        future.add_done_callback(lambda _: loop.call_soon_threadsafe(self._ended))
        return await asyncio.wrap_future(future)

    def _ended(self) -> None:
        self.busy -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class _Coalescer:
    """Answers the requests that arrive together, or while a call computes, with one
    snapshot call per kind (``key``).

    The first request starts a drain task; requests whose handlers run before it starts,
    or while its call computes, join the next group. Each gets its slice of the one
    answer, so all carry the same step. A group whose records fail (a bad record, a bad
    k) is rerun request by request, so an error reaches only the request that caused it.
    Every call goes through ``guard`` (the state watch).

    Where a group runs: on the query thread, unless it is small (``cost``, its tokens, at
    most INLINE_TOKENS; top-k has no cost: decoding is never small), the thread is idle
    and the snapshot has no checkpoint to advance to (``behind``: an advance may read a
    whole table). Then it runs on the loop, which it holds for a few milliseconds: on
    the 2-core project machine, handing every group to the thread and back raised the p99
    of bench/serve.py from 10 - 26 ms to 40 - 48 ms (5 runs) and cut requests/s by a
    third to a half; with small groups inline it stayed at 11 - 12 ms.
    """

    def __init__(self, worker: _QueryThread, guard: Callable[..., Any], behind: Callable[[], bool],
                 max_records: int):
        self.max_records = max_records
        self._worker, self._guard, self._behind = worker, guard, behind
        self._pending: dict[tuple, tuple[Callable[[list], Answer], list]] = {}
        self._cost = 0.0
        self._drainer: asyncio.Task | None = None

    async def run(self, key: tuple, call: Callable[[list], Answer], records: list, cost: float = math.inf) -> Answer:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.setdefault(key, (call, []))[1].append((records, future))
        self._cost += cost
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())  # referenced: the loop keeps only a weak one
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                work, small = list(self._pending.values()), self._cost <= INLINE_TOKENS
                self._pending, self._cost = {}, 0.0
                try:
                    if small and self._inline():
                        settled = self._answer(work)
                    else:
                        settled = await self._worker.run(self._answer, work)
                except Exception as exc:  # a bug: no request may wait forever
                    settled = [(future, None, exc) for _, items in work for _, future in items]
                for future, result, exc in settled:
                    _set(future, result, exc)
        finally:
            self._drainer = None

    def _inline(self) -> bool:
        if self._worker.busy:
            return False
        try:
            return not self._behind()
        except Exception:  # the store cannot say: the thread's call records why
            return False

    def _answer(self, work: list) -> list[tuple]:
        """Every group of ``work``, as (future, answer, exception)."""
        settled = []
        for call, items in work:
            guarded = functools.partial(self._guard, call)
            for group in _groups(items, self.max_records):
                settled.extend(_answer_group(group, guarded))
        return settled


def _answer_group(group: list, call: Callable[[list], Answer]) -> list[tuple]:
    if len(group) == 1:
        return [_settle(group[0], call)]
    try:
        answer = call([r for records, _ in group for r in records])
    except (RecordError, DecodingError):
        return [_settle(item, call) for item in group]
    except Exception as exc:  # the store failed: every request in the group gets it
        return [(future, None, exc) for _, future in group]
    settled, start = [], 0
    for records, future in group:
        values = answer.values[start:start + len(records)]
        start += len(records)
        settled.append((future, dataclasses.replace(answer, values=values), None))
    return settled


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


def _settle(item: tuple, call: Callable[[list], Answer]) -> tuple:
    records, future = item
    try:
        return future, call(records), None
    except Exception as exc:
        return future, None, exc


def _set(future: asyncio.Future, result: Any = None, exception: BaseException | None = None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)


# ---------------------------------------------------------------------------- errors

_ERRORS = (  # library error -> HTTP status, error code
    (RecordError, 422, "bad-record"),
    (DecodingError, 422, "bad-query"),
    (TaskMismatchError, 409, "wrong-task"),
    (StreamlearnError, 503, "snapshot-unavailable"),
)


def _reply_with(status: int, code: str):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        return json_error(status, code, str(exc))
    return handler


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Only loc/msg/type: an error's input or ctx may not be JSON (bytes, exceptions).
        errors = exc.errors()
        not_json = [e for e in errors if e.get("type") == "json_invalid"]
        if not_json:  # malformed syntax is a 400; 422 is for JSON that does not fit the schema
            reason = (not_json[0].get("ctx") or {}).get("error", "invalid JSON")
            example = '{"token": "..."}' if request.url.path == "/login" else '{"text": "..."}'
            return json_error(400, "bad-request", f"the body is not JSON ({reason} at character "
                              f"{not_json[0]['loc'][-1]}): send a JSON object such as {example}")
        snapshot = getattr(request.app.state, "snapshot", None)
        if request.url.path == "/v1/predict" and snapshot is not None:
            try:  # no body fits a model that answers no labels (a next-item {"key": ...} was a 422)
                snapshot.need_labels("POST /v1/predict")
            except TaskMismatchError as mismatch:
                return json_error(409, "wrong-task", str(mismatch))
        detail = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                   "type": str(e.get("type", ""))} for e in errors]
        return json_error(422, "invalid-request", detail)

    # Handlers are looked up along the exception's MRO, so the subclasses in _ERRORS win over
    # StreamlearnError: every other library error means the snapshot cannot answer.
    for error, status, code in _ERRORS:
        app.add_exception_handler(error, _reply_with(status, code))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        codes = {400: "bad-request", 404: "not-found", 405: "method-not-allowed", 413: "body-too-large"}
        code = getattr(exc, "code", None) or codes.get(exc.status_code, "http-error")
        return JSONResponse({"error": code, "detail": exc.detail}, status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))


# ---------------------------------------------------------------------------- metrics

class _Metrics:
    """Request latency histogram and request counter (shared across workers through
    prometheus_client's multiprocess directory when ``metrics_dir`` is set), and the
    snapshot's step and freshness, computed at scrape time."""

    def __init__(self, snapshot: Snapshot, watch: StateWatch, metrics_dir: str | None):
        self.registry = CollectorRegistry()
        own = None if metrics_dir else self.registry
        if metrics_dir:
            from prometheus_client import multiprocess
            multiprocess.MultiProcessCollector(self.registry, path=metrics_dir)
        self.latency = Histogram("streamlearn_request_seconds", "HTTP request latency (seconds)",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=own)
        self.requests = Counter("streamlearn_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "code"], registry=own)
        self.registry.register(_SnapshotCollector(snapshot, watch))

    def observe(self, path: str, status: int, seconds: float) -> None:
        endpoint = path if path in ENDPOINTS else "other"
        self.latency.labels(endpoint).observe(seconds)
        self.requests.labels(endpoint, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _SnapshotCollector:
    """Step, freshness and availability of this process's snapshot (every worker reads
    the same store and refreshes per query, so the scraped worker speaks for all)."""

    def __init__(self, snapshot: Snapshot, watch: StateWatch):
        self.snapshot, self.watch = snapshot, watch

    def collect(self):
        step = GaugeMetricFamily("streamlearn_snapshot_step", "manifest step of the snapshot answering queries")
        step.add_metric([], self.snapshot.step)
        fresh = GaugeMetricFamily("streamlearn_snapshot_freshness_seconds",
                                  "now minus the commit time of the snapshot answering queries")
        age = _freshness(self.snapshot)
        fresh.add_metric([], float("nan") if age is None else age)
        up = GaugeMetricFamily("streamlearn_snapshot_available",
                               "1 while the state directory can be read (/healthz 200), else 0")
        up.add_metric([], 0.0 if self.watch.problem() else 1.0)
        return [step, fresh, up]

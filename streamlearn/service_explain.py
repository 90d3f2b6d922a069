"""``POST /v1/explain``: why the model answers what it does (:mod:`streamlearn.explain`).

A query is ``text``, ``tokens`` or (next-item) ``key``, with an optional ``output`` (the
label or token to explain; the best answer by default) and ``k`` (how many of the best
answers to list); or ``records``, a batch of at most :data:`MAX_EXPLAIN_BATCH` such
queries. Each token's contribution comes with the method that measured it (``exact`` or
``leave-one-out``: a query of T tokens costs a forward pass over T + 1 queries then) and
its importance weights over its rows of E (hash embeddings).
"""
# No `from __future__ import annotations`: FastAPI must see the request models as classes.
from typing import Annotated, Any, Awaitable, Callable

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .config import ServiceConfig
from .explain import Explanation
from .service import CHARS_PER_TOKEN, QUERY_ERRORS, Token, text_field
from .service_guard import JsonRoute
from .snapshot import Answer, Snapshot

__all__ = ["MAX_EXPLAIN_BATCH", "MAX_EXPLAIN_K", "add_explain_route", "explanation_json"]

MAX_EXPLAIN_BATCH = 16  # leave-one-out multiplies a query's work by its tokens
MAX_EXPLAIN_K = 100
_INPUTS = ("text", "tokens", "key")


def _one_of(model: BaseModel, names: tuple[str, ...]) -> None:
    given = [n for n in names if getattr(model, n) is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one of {', '.join(names)} (got {', '.join(given) or 'none'})")


def _request_model(cfg: ServiceConfig) -> type[BaseModel]:
    Text = text_field(cfg.max_tokens * CHARS_PER_TOKEN)
    Tokens = Annotated[list[Token], Field(min_length=1, max_length=cfg.max_tokens)]
    forbid = ConfigDict(extra="forbid")

    class ExplainQuery(BaseModel):
        """One query: ``text``, ``tokens`` or ``key`` (next-item), and the ``output`` to
        explain (default: the best answer)."""

        model_config = forbid
        text: Text | None = None
        tokens: Tokens | None = None
        key: Token | None = None
        output: Token | None = None

        @model_validator(mode="after")
        def _one_input(self):
            _one_of(self, _INPUTS)
            return self

    class ExplainRequest(BaseModel):
        """One query (its fields at the top level) or ``records``; ``k`` best answers listed."""

        model_config = forbid
        text: Text | None = None
        tokens: Tokens | None = None
        key: Token | None = None
        output: Token | None = None
        records: Annotated[list[ExplainQuery], Field(min_length=1, max_length=MAX_EXPLAIN_BATCH)] | None = None
        k: int = Field(5, ge=1, le=MAX_EXPLAIN_K, strict=True)

        @model_validator(mode="after")
        def _one_input(self):
            _one_of(self, (*_INPUTS, "records"))
            if self.records is not None and self.output is not None:
                raise ValueError("with records, give each record its own output")
            return self

    return ExplainRequest


class ExplainResult(BaseModel):
    tokens: list[str] = Field(description="the query's tokens as the model reads them")
    output: str | int | None = Field(description="the answer explained (null: nothing learned to explain yet)")
    score: float | None = Field(description="classify: the label's logit minus the mean logit; tokens: its "
                                "log-probability score")
    contributions: list[float | None] = Field(description="per token, its share of score (null: [MASK])")
    parts: dict[str, list[float | None]] = Field(description="contributions per part of the model")
    methods: dict[str, str] = Field(description="per part: exact or leave-one-out")
    rest: float | None = Field(description="score minus the contributions' sum")
    top: list[dict[str, Any]] = Field(description="the best answers: output and value (probability for labels, "
                                      "log-probability for tokens)")
    importance: list[list[float] | None] | None = Field(
        description="per token, its weights p_w over its rows of E (null: a token the model does not read); "
                    "null for schemes without them")
    rows: list[list[int] | None] | None = Field(description="per token, the rows of E its weights weigh")


class ExplainResponse(BaseModel):
    snapshot_step: int
    results: list[ExplainResult] | None = None
    model_config = ConfigDict(extra="allow")  # a single query's result fields sit at the top level


def explanation_json(e: Explanation) -> dict[str, Any]:
    """An :class:`~streamlearn.explain.Explanation` as the JSON ``/v1/explain`` answers."""
    return {"tokens": e.tokens, "output": e.output, "score": e.score, "contributions": e.contributions,
            "parts": e.parts, "methods": e.methods, "rest": e.rest,
            "top": [{"output": a, "value": v} for a, v in e.top], "importance": e.importance, "rows": e.rows}


def add_explain_route(app: FastAPI, snapshot: Snapshot, cfg: ServiceConfig,
                      run: Callable[..., Awaitable[Any]], check_size: Callable[[list[dict]], Any]) -> None:
    """Register ``POST /v1/explain``: ``run(fn, *args)`` runs the model work as the
    service runs every query (off the event loop, through its state watch);
    ``check_size(records)`` refuses a request over the service's limits (413)."""
    ExplainRequest = _request_model(cfg)
    router = APIRouter(route_class=JsonRoute, responses=QUERY_ERRORS)

    @router.post("/v1/explain", response_model=ExplainResponse)
    async def explain(request: ExplainRequest) -> JSONResponse:
        """Per-token contributions to an answer, the best answers, and each token's
        importance weights (one query or a batch of ``records``)."""
        queries = request.records if request.records is not None else [request]
        records = [{n: getattr(q, n) for n in _INPUTS if getattr(q, n) is not None} for q in queries]
        check_size(records)
        answer: Answer = await run(snapshot.explain, records, [q.output for q in queries], request.k)
        results = [explanation_json(e) for e in answer.values]
        body: dict[str, Any] = {"snapshot_step": answer.step}
        if request.records is not None:
            body["results"] = results
        else:
            body.update(results[0])
        return JSONResponse(body)

    app.include_router(router)

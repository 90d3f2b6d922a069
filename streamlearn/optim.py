"""Row-wise sparse optimizers for the embedding and importance tables (E, P, ...).

A batch touches a few hundred rows of tables with up to millions of rows, so the
update must cost O(rows touched), not O(table). :class:`RowOptimizer` reads each
table's gradient (a sparse COO gradient from a ``sparse=True`` lookup, or a dense one
when a table is also used densely, e.g. a tied softmax output), coalesces it to
unique row ids and updates only those rows of the table and of its state.

Per-row state is kept as tensors of the table's shape, so the store can persist it as
rows of table ``"<table>.<state>"`` with the same ids as the table's rows
(:meth:`RowOptimizer.state_tables`). ``step`` returns the ids it changed, per table:
those are exactly the rows a checkpoint must write.

Rules:
- ``adagrad`` (default): ``G[i] += g_i**2; W[i] -= lr * g_i / (sqrt(G[i]) + eps)``.
  A row with a zero gradient is left unchanged, so rows outside the batch never move.
  With ``optim.row_decay`` r < 1 the sum decays at each step that touches the row,
  ``G[i] = r G[i] + g_i**2`` (RMSprop's average without its (1 - r) factor): a row's
  first steps are Adagrad's, and a frequent row's step settles near ``lr sqrt(1 - r)``
  per coordinate instead of shrinking as 1 / sqrt(touches),
  so on a stream that never ends its rows keep learning. A touched row whose gradient is
  zero keeps its values and its sum decays.
- ``lazy-adam``: Adam's moments updated only for rows in the batch (TensorFlow's
  LazyAdam); bias correction uses the optimizer's global step count.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .config import OptimConfig
from .exceptions import ConfigError

SPARSE_RULES = {"adagrad": ("sum",), "lazy-adam": ("exp_avg", "exp_avg_sq")}
_NO_STEP = torch.zeros(())  # the fused Adagrad kernel's step count (unused at lr_decay 0; it does not advance it)


def plain_adagrad(cfg: OptimConfig) -> bool:
    """Whether the rows learn by plain Adagrad (``optim.sparse=adagrad``, ``optim.row_decay=1``):
    the one rule under which a zero gradient leaves a row and its sum as they were, so a
    closed-form step may leave such rows out (mlm's), and the rule the compiled classify
    step implements.

    >>> plain_adagrad(OptimConfig()), plain_adagrad(OptimConfig(row_decay=0.95))
    (True, False)
    """
    return cfg.sparse == "adagrad" and cfg.row_decay == 1


class RowOptimizer:
    """Adagrad or lazy Adam over named row tables, touching only the rows in the batch.

    >>> W = nn.Parameter(torch.zeros(4, 2))
    >>> opt = RowOptimizer({"E": W}, OptimConfig(sparse="adagrad", sparse_lr=0.5))
    >>> W.grad = torch.sparse_coo_tensor([[1, 1]], torch.ones(2, 2), (4, 2), check_invariants=True)
    >>> opt.step()["E"].tolist()
    [1]
    >>> W[0].tolist(), W[1].tolist()
    ([0.0, 0.0], [-0.5, -0.5])
    """

    def __init__(self, tables: Mapping[str, nn.Parameter], cfg: OptimConfig, eps: float | None = None,
                 outputs: frozenset[str] = frozenset(), fused: bool = True):
        """``outputs``: the tables stepped at ``cfg.output_lr`` (when > 0) instead of
        ``cfg.sparse_lr`` (a sampled head's output rows). ``fused`` (the default):
        Adagrad's update of the gathered rows of a CPU table in torch's fused kernel (one
        call instead of six; it rounds differently from the separate ops, in the last
        bits), as :class:`DenseAdamW`'s ``fused``."""
        self.rule = cfg.sparse
        self.fused = fused and self.rule == "adagrad" and hasattr(torch, "_fused_adagrad_")
        self.lr = cfg.sparse_lr
        self.lrs = {name: cfg.output_lr if name in outputs and cfg.output_lr > 0 else cfg.sparse_lr for name in tables}
        self.eps = eps if eps is not None else (1e-10 if self.rule == "adagrad" else 1e-8)
        self.decay = cfg.row_decay  # Adagrad: G <- decay G + g^2 on the rows a step touches
        self.betas = (0.9, 0.999)
        self.steps = 0
        self.tables = dict(tables)
        self.state = {
            name: {s: torch.zeros_like(p, memory_format=torch.contiguous_format) for s in SPARSE_RULES[self.rule]}
            for name, p in self.tables.items()
        }

    @property
    def state_names(self) -> tuple[str, ...]:
        return SPARSE_RULES[self.rule]

    def zero_grad(self) -> None:
        for p in self.tables.values():
            p.grad = None

    @torch.no_grad()
    def step(self) -> dict[str, torch.Tensor]:
        """Apply the rule to every table with a gradient; return the changed row ids
        (int64, unique, ascending) per table. Tables without a gradient are absent."""
        return self.apply({name: _rows_of(p.grad) for name, p in self.tables.items() if p.grad is not None})

    @torch.no_grad()
    def apply(self, grads: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """:meth:`step` with the gradients given instead of read from ``.grad``: per table
        name, unique ascending row ids (n,) and their gradient rows (n, w) (a closed-form
        step's, already coalesced: no sparse tensor is built). Returns the changed row
        ids per table, as :meth:`step`."""
        self.steps += 1
        changed = {}
        for name, (idx, g) in grads.items():
            p, lr = self.tables[name], self.lrs[name]
            if idx.numel() == p.shape[0]:  # a dense gradient reaching every row
                self._update_all(p, self.state[name], g.to(p.dtype), lr)
            elif idx.numel():
                self._update(p, self.state[name], idx, g.to(p.dtype), lr)
            changed[name] = idx
        return changed

    def _update(self, p: torch.Tensor, state: dict[str, torch.Tensor], idx: torch.Tensor, g: torch.Tensor,
                lr: float) -> None:
        """The rule on rows ``idx`` (unique): gather each table's rows, compute, write
        them back (:func:`_put_rows`). index_add_ here cost twice as much on rows spread
        over a large table: it sorts its index again inside torch.

        Fused (CPU tables): the rows and their sums updated in place by one kernel, 140
        against 220-300 us for 1,200 rows of 64 and 80 against 110 us for 800 rows of 2
        (one thread): the row rule was a fifth of a depth-0 classify step (py-spy, AG News).
        """
        if self.fused and p.device.type == "cpu":  # fused is only ever set for adagrad
            rows, G_rows = p.index_select(0, idx), state["sum"].index_select(0, idx)
            if self.decay < 1:
                G_rows.mul_(self.decay)  # the kernel then adds g^2: the decayed sum
            torch._fused_adagrad_([rows], [g], [G_rows], [_NO_STEP], lr=lr, lr_decay=0.0, weight_decay=0.0,
                                  eps=self.eps, maximize=False)  # lr_decay 0: the step count is never read
            _put_rows(state["sum"], idx, G_rows)
            _put_rows(p, idx, rows)
            return
        if self.rule == "adagrad":
            G = state["sum"]
            G_rows = G.index_select(0, idx)  # (n, w)
            if self.decay < 1:
                G_rows.mul_(self.decay)
            G_rows.add_(g * g)
            _put_rows(G, idx, G_rows)
            _put_rows(p, idx, p.index_select(0, idx).add_(g / G_rows.sqrt_().add_(self.eps), alpha=-lr))
            return
        b1, b2 = self.betas
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m_rows = m.index_select(0, idx).mul_(b1).add_(g, alpha=1 - b1)  # (n, w)
        v_rows = v.index_select(0, idx).mul_(b2).addcmul_(g, g, value=1 - b2)
        _put_rows(m, idx, m_rows)
        _put_rows(v, idx, v_rows)
        step_size = lr * (1 - b2 ** self.steps) ** 0.5 / (1 - b1 ** self.steps)
        _put_rows(p, idx, p.index_select(0, idx).add_(m_rows / v_rows.sqrt().add_(self.eps), alpha=-step_size))

    def _update_all(self, p: torch.Tensor, state: dict[str, torch.Tensor], g: torch.Tensor, lr: float) -> None:
        """The same rules in place over the whole table, without gathers and scatters."""
        if self.rule == "adagrad":
            G = state["sum"]
            if self.decay < 1:
                G.mul_(self.decay)
            G.addcmul_(g, g)
            p.addcdiv_(g, G.sqrt().add_(self.eps), value=-lr)
            return
        b1, b2 = self.betas
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        step_size = lr * (1 - b2 ** self.steps) ** 0.5 / (1 - b1 ** self.steps)
        p.addcdiv_(m, v.sqrt().add_(self.eps), value=-step_size)

    def state_tables(self) -> dict[str, torch.Tensor]:
        """Per-row state as ``{"<table>.<state>": tensor of the table's shape}``."""
        return {f"{name}.{s}": t for name, states in self.state.items() for s, t in states.items()}

    def state_dict(self) -> dict:
        """The scalar state (the row state lives in :meth:`state_tables`)."""
        return {"rule": self.rule, "steps": self.steps}

    def load_state_dict(self, sd: Mapping) -> None:
        if sd["rule"] != self.rule:
            raise ConfigError(
                f"checkpoint was trained with optim.sparse={sd['rule']!r}, config says {self.rule!r}; "
                f"set optim.sparse={sd['rule']}"
            )
        self.steps = int(sd["steps"])


def _put_rows(table: torch.Tensor, idx: torch.Tensor, rows: torch.Tensor) -> None:
    """``table[idx] = rows`` (unique ``idx``), the same bytes as ``index_copy_``. On the
    CPU through numpy's fancy assignment: torch's index_copy_ cost about 3.5x as much
    (77 against 22 us for 300 rows of 64, one thread), the largest single cost of a
    depth-0 step (py-spy, SMS, batch 8: the row rule's two writes were 17% of it)."""
    if table.device.type == "cpu" and table.dtype != torch.bfloat16:  # numpy has no bfloat16
        table.detach().numpy()[idx.numpy()] = rows.detach().numpy()
    else:
        table.index_copy_(0, idx, rows)


def _rows_of(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique row ids and their summed gradient rows, from a sparse or dense gradient."""
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0], grad.values()
    idx = grad.ne(0).any(dim=1).nonzero().squeeze(1)  # rows a dense gradient actually reaches
    if idx.numel() == grad.shape[0]:
        return idx, grad
    return idx, grad.index_select(0, idx)


class DenseAdamW:
    """AdamW (Loshchilov & Hutter: Adam with decoupled weight decay) for the dense weights,
    in two groups: weight matrices decay, biases and norms do not.

    Not ``torch.optim.AdamW``: its constructor imports ``torch._dynamo``, which took 1.0 s
    of CPU (3.7 s on a loaded machine) of every worker's start-up before its first
    record. The update is torch's (``betas`` (0.9, 0.999), ``eps`` 1e-8, bias-corrected),
    and :meth:`state_dict` has torch's layout, so a checkpoint holds the same bytes either way.

    ``fused`` (the default): on the CPU, torch's fused kernel, one call per parameter
    group; elsewhere, and without it, torch's foreach kernels. On the CPU those loop over
    the tensors op by op (seven ops each, a scalar converted for every one): the loop
    over the 1,024 x 64 label head was 18% of a depth-0 classify step (py-spy, AG News,
    batch 16), fused about 6%; at next-token's defaults (1 layer, 23 tensors) fused is
    3-4% more records per CPU-second. The two round differently in the last bits, which
    grow into other predictions as any rounding does (bench/quality.py, AG News, 1 layer,
    seed 0: 0.8518 fused against 0.8520). ``state[param]`` holds ``exp_avg``,
    ``exp_avg_sq`` (the parameter's shape) and ``step`` (a 0-d float tensor).

    >>> w = nn.Parameter(torch.ones(2, 2))
    >>> opt = DenseAdamW([w], lr=0.1, weight_decay=0.0)
    >>> w.grad = torch.ones(2, 2)
    >>> opt.step()
    >>> round(float(w[0, 0].detach()), 4)  # the first step moves each weight by lr
    0.9
    """

    betas = (0.9, 0.999)
    eps = 1e-8

    def __init__(self, params: list[nn.Parameter], lr: float, weight_decay: float, fused: bool = True):
        self.lr = lr
        self.fused = fused and hasattr(torch, "_fused_adamw_")
        decay = [p for p in params if p.dim() >= 2]
        self.groups = [(decay, weight_decay), ([p for p in params if p.dim() < 2], 0.0)]
        self._members = [frozenset(map(id, group)) for group, _ in self.groups]  # step_rows: a parameter's group
        self.state: dict[nn.Parameter, dict[str, torch.Tensor]] = {}

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for group, _ in self.groups for p in group]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        for group, decay in self.groups:
            live = [p for p in group if p.grad is not None]
            if live:
                self._update(live, [p.grad for p in live], [self.state_of(p) for p in live], decay)

    @torch.no_grad()
    def step_rows(self, grads: Sequence[tuple[nn.Parameter, torch.Tensor]]) -> None:
        """:meth:`step` with the gradients given instead of read from ``.grad``, each
        ``g`` the gradient of its parameter's first ``len(g)`` rows, where the rows
        beyond get none and hold zero weights and zero state (a label head's rows of
        labels not seen yet): AdamW would leave those at zero, so only the leading rows
        are updated, as :meth:`step` updates them (the step count advances alike). A
        1,024-row label head on a 4-label stream costs 4 rows, not 1,024.

        The rows taken are rounded up to whole blocks of :data:`_BLOCK` elements (zero
        gradient beyond ``len(g)``): the kernels vectorise a tensor in blocks and round
        a short tail differently, and a 4-element bias would be all tail. So the rows
        updated come out bit for bit as :meth:`step` leaves them."""
        for (_, decay), members in zip(self.groups, self._members):
            live = [_leading(p, g) for p, g in grads if id(p) in members]
            if live:
                params, views = [], []
                for p, g in live:
                    n, s = g.shape[0], self.state_of(p)
                    params.append(p.detach()[:n])
                    views.append({"step": s["step"], "exp_avg": s["exp_avg"][:n], "exp_avg_sq": s["exp_avg_sq"][:n]})
                self._update(params, [g for _, g in live], views, decay)

    def _update(self, params: list[torch.Tensor], grads: list[torch.Tensor], states: list[dict[str, torch.Tensor]],
                decay: float) -> None:
        b1, b2 = self.betas
        m, v = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        for s in states:
            s["step"] += 1
        if self.fused and params[0].device.type == "cpu":  # the step counts live on the CPU
            torch._fused_adamw_(params, grads, m, v, [], [s["step"] for s in states], lr=self.lr,
                                beta1=b1, beta2=b2, weight_decay=decay, eps=self.eps,
                                amsgrad=False, maximize=False)
            return
        if decay:
            torch._foreach_mul_(params, 1 - self.lr * decay)
        torch._foreach_lerp_(m, grads, 1 - b1)  # m = b1 m + (1 - b1) g
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, 1 - b2)  # v = b2 v + (1 - b2) g^2
        # per tensor: p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), as torch's
        # foreach Adam writes it (scalar lists); a Python loop of those ops per tensor was
        # a third of the dense step (cProfile, next-token, 1 layer, 20 tensors)
        steps = [float(s["step"]) for s in states]
        denom = torch._foreach_sqrt(v)
        torch._foreach_div_(denom, [(1 - b2 ** t) ** 0.5 for t in steps])
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(params, m, denom, [-self.lr / (1 - b1 ** t) for t in steps])

    def state_of(self, p: nn.Parameter) -> dict[str, torch.Tensor]:
        """``p``'s moments and step count (made, zero, on first use)."""
        state = self.state.get(p)
        if state is None:
            state = self.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                     "exp_avg_sq": torch.zeros_like(p)}
        return state

    def state_dict(self) -> dict:
        """torch.optim.AdamW's layout: ``state`` by parameter index (groups in order),
        ``param_groups`` with their hyperparameters."""
        index = {p: i for i, p in enumerate(self.params)}
        groups, at = [], 0
        for group, decay in self.groups:
            groups.append({"weight_decay": decay, "lr": self.lr, "betas": self.betas, "eps": self.eps,
                           "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                           "differentiable": False, "fused": None, "decoupled_weight_decay": True,
                           "params": list(range(at, at + len(group)))})
            at += len(group)
        return {"state": {index[p]: dict(s) for p, s in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, sd: Mapping) -> None:
        """Load a :meth:`state_dict` (or torch.optim.AdamW's) of the same parameters."""
        params = self.params
        sizes = [len(g["params"]) for g in sd["param_groups"]]
        if sizes != [len(group) for group, _ in self.groups]:
            raise ValueError(f"the stored optimizer holds groups of {sizes} parameters, this model "
                             f"{[len(group) for group, _ in self.groups]}")
        self.state = {}
        for i, s in sd["state"].items():
            p = params[int(i)]
            self.state[p] = {"step": torch.as_tensor(s["step"], dtype=torch.float32).clone(),
                             "exp_avg": s["exp_avg"].to(p.device, p.dtype).clone(),
                             "exp_avg_sq": s["exp_avg_sq"].to(p.device, p.dtype).clone()}


_BLOCK = 64  # elements: a multiple of every CPU vector width (AVX-512: 16 float32)


def _leading(p: nn.Parameter, g: torch.Tensor) -> tuple[nn.Parameter, torch.Tensor]:
    """``(p, g)`` with ``g``, the gradient of ``p``'s first rows, padded with zero rows
    to whole blocks of :data:`_BLOCK` elements (or to all of ``p``)."""
    have, row = g.shape[0], math.prod(g.shape[1:]) or 1
    whole = _BLOCK // math.gcd(row, _BLOCK)  # rows per whole number of blocks
    n = min(p.shape[0], -(-have // whole) * whole)
    return (p, g) if n == have else (p, F.pad(g, (0, 0) * (g.dim() - 1) + (0, n - have)))


def dense_optimizer(params: list[nn.Parameter], cfg: OptimConfig) -> DenseAdamW:
    """AdamW for the dense weights (transformer, heads); decay skips biases and norms."""
    return DenseAdamW(params, cfg.dense_lr, cfg.weight_decay)

"""The default classify step compiled into one call (numba).

At depth 0 on the CPU a classify step is the closed form of
:meth:`Classify.gradients <streamlearn.tasks.classify.Classify.gradients>`: the hash
embedding's bag, the label head, the softmax, the gradients of E, P and the head, a
safety check, Adagrad on E's and P's rows and AdamW on the head's rows in use. In torch
and numpy that is about 200 calls of a few microseconds each around almost no
arithmetic (a batch of 8 records), and the calls, not the arithmetic, were the step's
cost (py-spy and torch's profiler, docs/benchmarks.md). :func:`classify_step` does the
same arithmetic in one compiled function over the tables' own memory, in float32 as
torch does; it rounds differently in the last bits (sums in another order), as torch's
fused kernels do against its separate ops. :class:`CompiledClassifyStep` binds it to a
learner; the learner runs it where it applies (:meth:`CompiledClassifyStep.applies`)
and ``learner.compiled`` is on, and torch's step otherwise: the reference the tests
hold it to (tests/test_compiled.py).

The rows a batch touches are grouped by a radix sort (:func:`row_groups`), in ascending
order, as the torch step reports them. Where a step's time goes (AG News, batch 8,
the median of each part on batches it had not seen, 264 us in all): the first reads of
E, P and their sums two fifths (cache misses), the rows' gradients and Adagrad a
seventh each, grouping the rows a ninth.

The kernels are compiled once per machine and cached beside this file (numba's
``cache=True``; where that folder is read-only, in the user's cache folder). A thread
loads them (:mod:`streamlearn.compiled_loading`, :func:`load_kernels`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from .compiled_loading import loaded, start_loading

if TYPE_CHECKING:
    import torch

# Reassociation (sums vectorised), contraction (fused multiply-add) and reciprocals; not
# the flags that assume no NaN or infinity: the safety check must see them.
_FAST = {"reassoc", "contract", "arcp", "nsz"}


@njit(cache=True, nogil=True, error_model="numpy")
def row_groups(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``ids`` (n,) (non-negative) ascending, and each element's
    place among them: ``rows[group] == ids``.

    A least-significant-digit radix sort, 11 bits a pass (two passes for a table of up
    to 4 million rows): 11 against 79 us for 1,418 rows of E, where an open-addressing
    table's unpredictable probes and numba's argsort were the step's largest cost after
    the cache misses.

    >>> rows, group = row_groups(np.array([7, 3, 7, 9], dtype=np.int64))
    >>> rows.tolist(), group.tolist()
    ([3, 7, 9], [1, 0, 1, 2])
    """
    n = len(ids)
    top = 0
    for j in range(n):
        top = max(top, ids[j])
    bits = 1
    while (top >> bits) > 0:
        bits += 1
    order = np.arange(n)
    spare = np.empty(n, np.int64)
    count = np.empty(2049, np.int64)
    shift = 0
    while shift < bits:
        count[:] = 0
        for j in range(n):
            count[((ids[order[j]] >> shift) & 2047) + 1] += 1
        for b in range(2048):
            count[b + 1] += count[b]
        for j in range(n):
            digit = (ids[order[j]] >> shift) & 2047
            spare[count[digit]] = order[j]
            count[digit] += 1
        order, spare = spare, order
        shift += 11
    rows = np.empty(n, np.int64)
    group = np.empty(n, np.int64)
    g = -1
    for j in range(n):
        value = ids[order[j]]
        if g < 0 or value != rows[g]:
            g += 1
            rows[g] = value
        group[order[j]] = g
    return rows[:g + 1], group


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _any_bad(a: np.ndarray, limit: float) -> bool:
    """Whether a value of ``a`` is not finite or not within ``limit`` in magnitude (a
    boolean or, which vectorises: 3 against 31 us over 1,200 rows of 64 for a count)."""
    bound = np.float32(limit)
    flat = a.ravel()
    bad = False
    for i in range(flat.size):
        bad |= not (abs(flat[i]) < bound)
    return bad


@njit(cache=True, nogil=True, error_model="numpy")
def _tokens(d1, buckets, mask, k):
    """The valid tokens of a batch, row-major: each one's importance row (M,), its k
    component rows (M * k,) and its record (M,); and each record's pooling weight
    1/sqrt(tokens) (N,)."""
    N, T = mask.shape
    M = 0
    for n in range(N):
        for t in range(T):
            M += mask[n, t]
    tok = np.empty(M, np.int64)
    slot = np.empty(M * k, np.int64)
    owner = np.empty(M, np.int64)
    a = np.empty(N, np.float32)
    m = 0
    for n in range(N):
        c = 0
        for t in range(T):
            if mask[n, t]:
                tok[m] = d1[n, t]
                for i in range(k):
                    slot[m * k + i] = buckets[n, t, i]
                owner[m] = n
                m += 1
                c += 1
        a[n] = np.float32(1.0 / math.sqrt(max(c, 1)))
    return tok, slot, owner, a


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _pool(E, P, tok, slot, owner, a, N):
    """The bag (N, d): x_n = a_n sum_t sum_i P[d1_t, i] E[h_i(t)]."""
    k, d = P.shape[1], E.shape[1]
    x = np.zeros((N, d), np.float32)
    for j in range(len(tok)):
        n = owner[j]
        for i in range(k):
            s = P[tok[j], i] * a[n]
            row = E[slot[j * k + i]]
            for c in range(d):
                x[n, c] += s * row[c]
    return x


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _head(x, W, bias, n_labels, logits):
    """``logits`` (N, n_labels) = x W[:n_labels]^T + bias[:n_labels]."""
    for n in range(x.shape[0]):
        for lab in range(n_labels):
            z = bias[lab]
            for c in range(x.shape[1]):
                z += W[lab, c] * x[n, c]
            logits[n, lab] = z


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _adagrad(table, sums, rows, grads, lr, eps):
    """Adagrad on ``rows`` of ``table`` with their ``grads``: G += g^2; W -= lr g / (sqrt(G)
    + eps), as torch's fused kernel computes it. The numpy error model keeps the division
    free of zero checks, so the loop vectorises (43 against 197 us for 1,200 rows of 64)."""
    for u in range(len(rows)):
        row, acc, grad = table[rows[u]], sums[rows[u]], grads[u]
        for c in range(table.shape[1]):
            s = acc[c] + grad[c] * grad[c]
            acc[c] = s
            row[c] -= lr * grad[c] / (np.sqrt(s) + eps)


@njit(cache=True, nogil=True, error_model="numpy")
def classify_logits(E, P, W, bias, d1, buckets, mask, logits):
    """The depth-0 classifier's network logits (N, n_labels) of a batch into ``logits``
    (a query's, or a training batch's before its step): :func:`classify_step`'s forward
    alone."""
    tok, slot, owner, a = _tokens(d1, buckets, mask, P.shape[1])
    _head(_pool(E, P, tok, slot, owner, a, mask.shape[0]), W, bias, logits.shape[1], logits)


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def classify_step(E, E_sum, P, P_sum, W, bias, W_m, W_v, b_m, b_v,
                  d1, buckets, mask, labels, weight, n_labels,
                  lr_E, lr_P, eps_rows, lr, weight_decay, beta1, beta2, eps, W_step, b_step, limit, logits):
    """One closed-form step of the depth-0 classifier, in place.

    Tables (float32, C order): ``E`` (B, d) and ``P`` (K, k) with their Adagrad sums;
    the label head ``W`` (max_labels, d), ``bias`` and their AdamW moments. The batch:
    ``d1`` (N, T), ``buckets`` (N, T, k), ``mask`` (N, T), ``labels`` (N,) label ids,
    ``weight`` (N,) example weights, ``n_labels`` head rows in use. ``W_step``,
    ``b_step``: AdamW's step counts of the weight and the bias (1,), advanced here when
    the step is applied (a torch scalar's in-place add cost 19 us a step). ``logits``
    (N, n_labels) receives the network's logits before the step.

    Returns ``(loss, status, E rows, P rows)``: status 0 applied; 1 the loss is not
    finite; 2, 3, 4, 5 the gradient of E, P, the head's weight or its bias is not finite
    or beyond ``limit`` (nothing is updated unless 0). The rows are E's and P's distinct
    rows the batch touched, ascending.
    """
    f32 = np.float32
    N = mask.shape[0]
    k = P.shape[1]
    d = E.shape[1]
    L = n_labels
    lr_E, lr_P, eps_rows = f32(lr_E), f32(lr_P), f32(eps_rows)

    tok, slot, owner, a = _tokens(d1, buckets, mask, k)
    M = len(tok)

    # Read a word of every 64 bytes the step will touch in E, P and their sums first: the
    # loads are independent, so the CPU has many misses in flight at once.
    warm = f32(0.0)
    for j in range(M):
        warm += P[tok[j], 0] + P_sum[tok[j], 0]
        for i in range(k):
            row, acc = E[slot[j * k + i]], E_sum[slot[j * k + i]]
            for c in range(0, d, 16):
                warm += row[c] + acc[c]
    if warm == f32(1e-30):  # keeps the reads; never true for weights that moved
        logits[0, 0] = warm

    x = _pool(E, P, tok, slot, owner, a, N)  # forward: the bag, the head, the log-softmax
    loss = 0.0
    g = np.empty((N, L), np.float32)  # dL/dlogits = (softmax - onehot) w_n / N
    _head(x, W, bias, L, logits)
    for n in range(N):
        top = -np.inf
        for lab in range(L):
            top = max(top, logits[n, lab])
        total = f32(0.0)
        for lab in range(L):
            total += math.exp(logits[n, lab] - top)
        lse = top + math.log(total)
        wn = weight[n] / f32(N)
        for lab in range(L):
            logp = logits[n, lab] - lse
            g[n, lab] = math.exp(logp) * wn
            if lab == labels[n]:
                loss -= wn * logp
                g[n, lab] -= wn
    empty = np.empty(0, np.int64)
    if not math.isfinite(loss):
        return loss, 1, empty, empty

    # the head's gradients and dL/dx
    gW = np.zeros((L, d), np.float32)
    gb = np.zeros(L, np.float32)
    gx = np.zeros((N, d), np.float32)
    for n in range(N):
        for lab in range(L):
            q = g[n, lab]
            gb[lab] += q
            for c in range(d):
                gW[lab, c] += q * x[n, c]
                gx[n, c] += q * W[lab, c]

    # the tables' gradients, summed per distinct row
    rows_E, group_E = row_groups(slot)
    rows_P, group_P = row_groups(tok)
    gE = np.zeros((len(rows_E), d), np.float32)
    gP = np.zeros((len(rows_P), k), np.float32)
    for j in range(M):
        n = owner[j]
        for i in range(k):
            s = a[n] * P[tok[j], i]
            row = E[slot[j * k + i]]
            out = gE[group_E[j * k + i]]
            dot = f32(0.0)
            for c in range(d):
                out[c] += s * gx[n, c]
                dot += row[c] * gx[n, c]
            gP[group_P[j], i] += a[n] * dot

    for status, grad in ((2, gE), (3, gP), (4, gW)):
        if _any_bad(grad, limit):
            return loss, status, empty, empty
    if _any_bad(gb, limit):
        return loss, 5, empty, empty

    _adagrad(E, E_sum, rows_E, gE, lr_E, eps_rows)
    _adagrad(P, P_sum, rows_P, gP, lr_P, eps_rows)

    # AdamW on the head's rows in use (decoupled decay on the weight, none on the bias)
    b1, b2, eps32 = f32(beta1), f32(beta2), f32(eps)
    keep = f32(1.0 - lr * weight_decay)
    step = np.float64(W_step[0]) + 1.0
    size = f32(lr / (1.0 - beta1 ** step))
    root = f32(math.sqrt(1.0 - beta2 ** step))
    step_b = np.float64(b_step[0]) + 1.0
    size_b = f32(lr / (1.0 - beta1 ** step_b))
    root_b = f32(math.sqrt(1.0 - beta2 ** step_b))
    W_step[0] = step
    b_step[0] = step_b
    for lab in range(L):
        for c in range(d):
            q = gW[lab, c]
            W[lab, c] *= keep
            W_m[lab, c] += (f32(1.0) - b1) * (q - W_m[lab, c])
            W_v[lab, c] = W_v[lab, c] * b2 + (f32(1.0) - b2) * q * q
            W[lab, c] -= size * W_m[lab, c] / (np.sqrt(W_v[lab, c]) / root + eps32)
        q = gb[lab]
        b_m[lab] += (f32(1.0) - b1) * (q - b_m[lab])
        b_v[lab] = b_v[lab] * b2 + (f32(1.0) - b2) * q * q
        bias[lab] -= size_b * b_m[lab] / (np.sqrt(b_v[lab]) / root_b + eps32)
    return loss, 0, rows_E, rows_P



@njit(cache=True, nogil=True, error_model="numpy")
def count_naive_bayes(flat, tokens, labels, weight, base, span, shift, max_labels, row):
    """:meth:`NaiveBayesHead.learn <streamlearn.heads.NaiveBayesHead.learn>`'s counting in
    one call: per valid token u (``tokens`` (N, T), -1 at padding) of record n, cell
    ``base + (u + shift[label_n]) % span`` gains ``weight[n]``; cells ``label_n`` and
    ``max_labels + label_n`` gain the record and its tokens; cell ``2 max_labels`` counts
    the (token, label) cells put in use (zero before, a positive weight). The adds run in
    the order torch's ``index_add_`` takes them there, so the counts are the same floats.
    Returns the changed 64-cell rows (``row`` cells each), ascending."""
    N, T = tokens.shape
    L = max_labels
    touched = np.empty(N * T + 2 * N + 1, np.int64)
    m = 0
    fresh = 0
    for n in range(N):
        w = weight[n]
        for t in range(T):
            u = tokens[n, t]
            if u >= 0:
                cell = base + (u + shift[labels[n]]) % span
                if flat[cell] == 0 and w > 0:
                    fresh += 1  # a repeat finds the cell non-zero: counted once
                flat[cell] += w
                touched[m] = cell // row
                m += 1
    for n in range(N):
        flat[labels[n]] += weight[n]
        touched[m] = labels[n] // row
        m += 1
    for n in range(N):
        length = 0
        for t in range(T):
            length += tokens[n, t] >= 0
        flat[L + labels[n]] += weight[n] * np.float32(length)
        touched[m] = (L + labels[n]) // row
        m += 1
    flat[2 * L] += fresh
    touched[m] = 2 * L // row
    return row_groups(touched[:m + 1])[0]


@njit(cache=True, nogil=True, error_model="numpy")
def naive_bayes_scores(flat, tokens, labels, weight, n_labels, base, span, shift, max_labels, alpha, in_order,
                       skip_unseen):
    """:meth:`NaiveBayesHead.scores <streamlearn.heads.NaiveBayesHead.scores>` (N, n_labels)
    of ``tokens`` (N, T) from the counts as they are; with ``in_order``,
    :meth:`~streamlearn.heads.NaiveBayesHead.scores_in_order`: record i's as if records
    0..i-1 (``labels``, ``weight``) had been counted before it, through an overlay of
    what they add (a small open-addressing table by cell), the counts left as they are.
    The same float32 and float64 steps as numpy's, each token's log ratios summed in
    float64 in token order."""
    N, T = tokens.shape
    L, C = max_labels, n_labels
    pairs = flat[base:]
    a32 = np.float32(alpha)
    out = np.empty((N, C), np.float32)
    size = 16
    while size < 2 * N * T:
        size *= 2
    mask = size - 1
    keys = np.full(size, -1, np.int64)  # cells the batch's earlier records added to
    added = np.zeros(size, np.float64)  # what they added
    fresh = np.zeros(size, np.bool_)  # a cell they put in use (zero before the batch, a positive weight)
    docs_add = np.zeros(C, np.float64)
    totals_add = np.zeros(C, np.float64)
    fresh_add = 0.0
    n_tc = np.empty(C, np.float32)
    summed = np.empty(C, np.float64)
    for n in range(N):
        summed[:] = 0.0
        seen = 0
        for t in range(T):
            u = tokens[n, t]
            if u < 0:
                continue
            n_t = np.float32(0.0)
            for c in range(C):
                cell = (u + shift[c]) % span
                count = pairs[cell]
                if in_order:
                    h = ((cell * 0x9E3779B97F4A7C15) >> 40) & mask
                    while keys[h] != -1 and keys[h] != cell:
                        h = (h + 1) & mask
                    if keys[h] == cell:
                        count += np.float32(added[h])
                n_tc[c] = count
                n_t += count
            for c in range(C):
                rest = n_t - n_tc[c]
                summed[c] += np.log(n_tc[c] + a32) - np.log(rest + a32)
            seen += n_t > 0 or not skip_unseen
        docs_sum = 0.0
        totals_sum = 0.0
        for c in range(C):
            docs_sum += np.float64(flat[c]) + docs_add[c]
            totals_sum += np.float64(flat[L + c]) + totals_add[c]
        aV = alpha * max(np.float64(flat[2 * L]) + fresh_add, 1.0)
        for c in range(C):
            docs = np.float64(flat[c]) + docs_add[c]
            totals = np.float64(flat[L + c]) + totals_add[c]
            norm = np.log((totals_sum - totals + aV) / (totals + aV))
            prior = np.log((docs + 1.0) / (docs_sum + C))
            out[n, c] = np.float32(summed[c] + seen * norm + prior)
        if not in_order:
            continue
        w = weight[n]
        length = 0
        for t in range(T):
            u = tokens[n, t]
            if u < 0:
                continue
            length += 1
            cell = (u + shift[labels[n]]) % span
            h = ((cell * 0x9E3779B97F4A7C15) >> 40) & mask
            while keys[h] != -1 and keys[h] != cell:
                h = (h + 1) & mask
            keys[h] = cell
            if w > 0 and pairs[cell] == 0 and not fresh[h]:
                fresh[h] = True
                fresh_add += 1.0
            added[h] += w
        docs_add[labels[n]] += w
        totals_add[labels[n]] += np.float64(w) * length
    return out


def load_kernels() -> None:
    """Compile every kernel here, or load it from numba's cache, for the argument types
    the library passes, by running each on a one-token batch over tables of one row
    (:mod:`streamlearn.compiled_loading`'s thread calls it)."""
    f32, i64 = np.float32, np.int64
    tables = [np.zeros(shape, f32) for shape in ((1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1,), (1, 1), (1, 1),
                                                  (1,), (1,))]
    classify_step(*tables, np.zeros((1, 1), i64), np.zeros((1, 1, 1), i64), np.ones((1, 1), bool),
                  np.zeros(1, i64), np.ones(1, f32), 1, 0.1, 0.1, 1e-10, 0.001, 0.0, 0.9, 0.999, 1e-8,
                  np.zeros(1, f32), np.zeros(1, f32), 1e15,
                  np.zeros((1, 1), f32))
    classify_logits(tables[0], tables[2], tables[4], tables[5], np.zeros((1, 1), i64), np.zeros((1, 1, 1), i64),
                    np.ones((1, 1), bool), np.zeros((1, 1), f32))
    count_naive_bayes(np.zeros(4, f32), np.zeros((1, 1), i64), np.zeros(1, i64), np.ones(1, f32), 3, 1,
                      np.zeros(1, i64), 1, 64)
    for in_order in (False, True):
        naive_bayes_scores(np.zeros(4, f32), np.zeros((1, 1), i64), np.zeros(1, i64), np.ones(1, f32), 1, 3, 1,
                           np.zeros(1, i64), 1, 0.3, in_order, True)
    from .compiled_counts import load_count_kernels
    load_count_kernels()
    from .compiled_text import byte_classes, hashed_batch, text_hashes
    base, _ = text_hashes(np.frombuffer(b"a 1", np.uint8), byte_classes(), np.uint64(0), 2, True)
    hashed_batch(base, np.array([len(base)], i64), np.ones(1, i64), 8, np.uint64(1), 1, np.ones(2, np.uint64), 1, 1)


class CompiledNaiveBayes:
    """A :class:`~streamlearn.heads.NaiveBayesHead`'s counting and scores through
    :func:`count_naive_bayes` and :func:`naive_bayes_scores` (the head calls these where
    the task set them: ``learner.compiled``). Per batch of 8 AG News records: counting 51
    against 144 us; scores in stream order (a prequential prediction) against numpy's
    sorted search, and scores of a query batch, in one call each."""

    def __init__(self, nb):
        self.nb = nb
        start_loading()

    def learn(self, tokens: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> np.ndarray:
        loaded()
        nb = self.nb
        return count_naive_bayes(nb.flat, tokens, labels, np.asarray(weight, np.float32), int(nb.base),
                                 int(nb.span), nb.shift, int(nb.max_labels), int(nb.ROW))

    def scores(self, tokens: np.ndarray, n_labels: int) -> np.ndarray:
        return self._scores(tokens, np.zeros(len(tokens), np.int64), np.zeros(len(tokens), np.float32), n_labels,
                            False)

    def scores_in_order(self, tokens: np.ndarray, labels: np.ndarray, weight: np.ndarray,
                        n_labels: int) -> np.ndarray:
        return self._scores(tokens, labels, np.asarray(weight, np.float32), n_labels, True)

    def _scores(self, tokens, labels, weight, n_labels, in_order) -> np.ndarray:
        loaded()
        nb = self.nb
        return naive_bayes_scores(nb.flat, tokens, np.asarray(labels, np.int64), weight, int(n_labels),
                                  int(nb.base), int(nb.span), nb.shift, int(nb.max_labels), float(nb.alpha),
                                  in_order, bool(nb.skip_unseen))


class CompiledClassifyStep:
    """:func:`classify_step` bound to a learner's tables and optimizers. Built by
    :meth:`bind`, which answers None where the kernel does not apply; called with a
    prepared training batch, it steps the learner's parameters and optimizer state in
    place, exactly where torch's closed-form step would."""

    def __init__(self, learner, limit: float):
        import torch

        self._from_numpy = torch.from_numpy
        self.limit = limit  # the learner's MAX_GRADIENT
        model = learner.model
        self.emb, self.head = model.embedding, model.head
        self.row_optim, self.dense_optim = learner.row_optim, learner.dense_optim
        named = {id(p): name for name, p in learner.model.named_parameters()}
        self.names = ("E", "P", named[id(self.head.weight)], named[id(self.head.bias)])
        self._key: tuple[int, ...] | None = None  # the tensors' memory the views below read
        self._views: list[np.ndarray] = []
        start_loading()

    @classmethod
    def bind(cls, learner, limit: float) -> "CompiledClassifyStep | None":
        """The step for ``learner``, or None where the kernel does not compute its step:
        anything but classify's closed form (depth 0 on the CPU) over the default hash
        embedding (``combine="sum"``), plain Adagrad on the rows (``optim.row_decay=1``) and
        the label head, in float32.
        ``limit``: a gradient at or beyond it in magnitude skips the step."""
        import torch

        from .embeddings.hash import HashEmbedding
        from .heads import LabelHead
        from .optim import plain_adagrad

        model = learner.model
        if not (learner.task.name == "classify" and learner.task.has_closed_form(model, learner.dev)
                and type(model.embedding) is HashEmbedding and isinstance(model.head, LabelHead)
                and plain_adagrad(learner.cfg.optim)):
            return None
        tensors = [model.embedding.E, model.embedding.P, model.head.weight, model.head.bias]
        if any(t.dtype != torch.float32 or t.device.type != "cpu" for t in tensors):
            return None
        return cls(learner, limit)

    def logits(self, batch) -> "torch.Tensor":
        """The network's logits (N, n_labels) of a prepared batch, without a step (the
        task's ``network_logits`` where no gradient is wanted: queries, predictions)."""
        loaded()
        feats = batch.feats
        out = np.empty((feats["mask"].shape[0], batch.n_labels), np.float32)
        classify_logits(self.emb.E.detach().numpy(), self.emb.P.detach().numpy(), self.head.weight.detach().numpy(),
                        self.head.bias.detach().numpy(), feats["d1"], feats["buckets"], feats["mask"], out)
        return self._from_numpy(out)

    def _arrays(self) -> list[np.ndarray]:
        """numpy views of the tables and optimizer state the kernel steps in place, and of
        AdamW's step counts (1,): kept while the tensors keep their memory (a restore or an
        optimizer's reload gives new tensors); 12 views cost about 12 us a step to make."""
        head, rows, dense = self.head, self.row_optim, self.dense_optim
        w_state, b_state = dense.state_of(head.weight), dense.state_of(head.bias)
        tensors = (self.emb.E, rows.state["E"]["sum"], self.emb.P, rows.state["P"]["sum"], head.weight, head.bias,
                   w_state["exp_avg"], w_state["exp_avg_sq"], b_state["exp_avg"], b_state["exp_avg_sq"],
                   w_state["step"], b_state["step"])
        key = tuple(t.data_ptr() for t in tensors)
        if key != self._key:
            self._views = [t.detach().numpy() for t in tensors[:10]] + [t.view(1).numpy() for t in tensors[10:]]
            self._key = key
        return self._views

    def __call__(self, batch) -> tuple[float, np.ndarray, dict[str, np.ndarray] | None, str | None]:
        """Step on ``batch``: ``(loss, logits before the step (N, n_labels), the rows
        changed per table, None)``, or ``(loss, logits, None, what)`` where nothing was
        updated: ``what`` names the loss or the parameter whose gradient was not finite
        or too large."""
        loaded()
        rows, dense = self.row_optim, self.dense_optim
        feats, n_labels = batch.feats, batch.n_labels
        labels = batch.targets["labels"]
        logits = np.empty((len(labels), n_labels), np.float32)
        views = self._arrays()
        loss, status, rows_E, rows_P = classify_step(
            *views[:10],
            feats["d1"], feats["buckets"], feats["mask"], labels, np.asarray(batch.weight, np.float32), int(n_labels),
            *map(float, (rows.lrs["E"], rows.lrs["P"], rows.eps, dense.lr, dense.groups[0][1], *dense.betas,
                         dense.eps)), *views[10:], float(self.limit), logits)  # floats: one signature, _load's
        if status == 1:
            return loss, logits, None, f"its loss ({loss})"
        if status:
            return loss, logits, None, f"the gradient of {self.names[status - 2]}"
        rows.steps += 1
        return loss, logits, {"E": rows_E, "P": rows_P}, None

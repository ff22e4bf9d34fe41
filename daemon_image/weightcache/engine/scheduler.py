"""Requests → forward passes. Rank 0 (the leader) decides; every other rank mirrors it.

The leader owns the request queue. Each step it picks one admitted request (round-robin, so a
long generation cannot starve a short one), and tells every rank what to do with a fixed-size
int64 header — ``[op, slot, n_tokens, kv_capacity]`` — followed, for a forward, by the token
ids. Each rank keeps one KV cache per slot, so interleaved requests never touch each other's
keys and values. Only the leader samples: the token it picks is simply the next step's input.

The header travels by all-reduce (the leader contributes it, followers contribute zeros)
rather than broadcast: an all-reduce needs every peer to answer, so a dead rank turns into an
exception within the group's timeout on *every* side, including a leader that is only sending
heartbeats. No step is ever pickled: tensors of ints are all that cross between ranks.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from .model import KVCache, Model
from .parallel import Group
from .tokenizer import Tokenizer

log = logging.getLogger("weightcache.engine.scheduler")

OP_IDLE, OP_FORWARD, OP_FREE, OP_STOP = 0, 1, 2, 3
HEADER = 4
HEARTBEAT_S = 0.5


class RankFailure(RuntimeError):
    """A collective failed: some rank of this engine died or stopped answering."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0 → greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass
class Event:
    kind: Literal["token", "done", "error"]
    text: str = ""
    token_id: int | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    sink: Callable[[Event], None]
    created: float = field(default_factory=time.monotonic)
    cancelled: bool = False  # set by the HTTP side when the client goes away
    # Leader-side generation state:
    slot: int = -1
    generated: list[int] = field(default_factory=list)
    text: str = ""
    first_token_at: float | None = None
    generator: torch.Generator | None = None


class Worker:
    """What every rank does with a step: allocate, forward, free. No decisions."""

    def __init__(self, model: Model, group: Group) -> None:
        self.model = model
        self.group = group
        self.caches: dict[int, KVCache] = {}

    def exchange(self, header: torch.Tensor) -> torch.Tensor:
        try:
            return self.group.exchange(header)
        except RuntimeError as exc:
            raise RankFailure(f"rank {self.group.rank}: lost the tensor-parallel group: {exc}") from exc

    def apply(self, header: list[int], tokens: torch.Tensor | None) -> torch.Tensor | None:
        op, slot, n, capacity = header
        if op == OP_FORWARD:
            assert tokens is not None
            cache = self.caches.get(slot)
            if cache is None:
                cache = self.caches[slot] = self.model.new_cache(capacity)
            try:
                return self.model.forward(tokens, cache)
            except RuntimeError as exc:
                raise RankFailure(f"rank {self.group.rank}: forward failed: {exc}") from exc
        if op == OP_FREE:
            self.caches.pop(slot, None)
        return None

    def tokens(self, n: int, ids: list[int] | None = None) -> torch.Tensor:
        tokens = torch.tensor(ids, dtype=torch.int64) if ids is not None else torch.zeros(n, dtype=torch.int64)
        try:
            return self.group.broadcast_tokens(tokens)
        except RuntimeError as exc:
            raise RankFailure(f"rank {self.group.rank}: lost the tensor-parallel group: {exc}") from exc


def follow(worker: Worker) -> None:
    """A follower rank's whole life after start-up: mirror the leader until it says stop."""
    while True:
        header = worker.exchange(torch.zeros(HEADER, dtype=torch.int64)).tolist()
        if header[0] == OP_STOP:
            return
        tokens = worker.tokens(header[2]) if header[0] == OP_FORWARD else None
        worker.apply(header, tokens)


class Leader:
    """Rank 0's scheduler thread: admits requests, steps them round-robin, streams events back."""

    def __init__(self, worker: Worker, tokenizer: Tokenizer, max_active: int = 8) -> None:
        self.worker = worker
        self.tokenizer = tokenizer
        self.max_active = max_active
        self.incoming: queue.Queue[Request] = queue.Queue()
        self.active: collections.deque[Request] = collections.deque()
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._next_slot = 0

    @property
    def pending(self) -> int:
        return self.incoming.qsize() + len(self.active)

    def submit(self, request: Request) -> None:
        if self.failure is not None:
            request.sink(Event("error", text=f"engine failed: {self.failure}"))
            return
        self.incoming.put(request)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        """The scheduler loop; returns after ``stop()`` (or raises RankFailure, failing every request)."""
        try:
            while not self._stop.is_set():
                self._admit()
                if not self.active:
                    self._idle()
                    continue
                request = self.active.popleft()
                if self._step(request):
                    self.active.append(request)
            self._send([OP_STOP, 0, 0, 0])
            for request in [*self.active, *self._drain_incoming()]:
                request.sink(Event("error", text="the engine stopped before this request finished"))
            self.active.clear()
        except BaseException as exc:
            self.failure = exc
            for request in [*self.active, *self._drain_incoming()]:
                request.sink(Event("error", text=f"engine failed: {exc}"))
            self.active.clear()
            raise

    def _drain_incoming(self) -> list[Request]:
        out = []
        while True:
            try:
                out.append(self.incoming.get_nowait())
            except queue.Empty:
                return out

    def _admit(self) -> None:
        block = not self.active  # nothing to compute: wait for work, but no longer than a heartbeat
        while len(self.active) < self.max_active:
            try:
                request = self.incoming.get(timeout=HEARTBEAT_S) if block else self.incoming.get_nowait()
            except queue.Empty:
                return
            block = False
            if request.cancelled:
                request.sink(Event("done", finish_reason="cancelled", prompt_tokens=len(request.prompt_ids)))
                continue
            request.slot = self._next_slot
            self._next_slot += 1
            if request.params.temperature > 0:
                request.generator = torch.Generator()
                request.generator.manual_seed(
                    request.params.seed if request.params.seed is not None else int(torch.randint(0, 2**62, (1,)))
                )
            self.active.append(request)

    def _idle(self) -> None:
        # A heartbeat: keeps followers' collective timeouts from firing and notices a dead rank.
        if self.worker.group.size > 1:
            self._send([OP_IDLE, 0, 0, 0])

    def _send(self, header: list[int]) -> None:
        self.worker.exchange(torch.tensor(header, dtype=torch.int64))

    def _step(self, request: Request) -> bool:
        """One forward for ``request``; returns whether it continues."""
        if request.cancelled:
            self._finish(request, "cancelled")
            return False
        ids = request.prompt_ids if not request.generated else request.generated[-1:]
        capacity = len(request.prompt_ids) + request.params.max_tokens
        header = [OP_FORWARD, request.slot, len(ids), capacity]
        self._send(header)
        tokens = self.worker.tokens(len(ids), ids)
        logits = self.worker.apply(header, tokens)
        assert logits is not None
        token = self._sample(logits[-1].cpu(), request)  # CPU: the request's generator lives there
        request.generated.append(token)
        if request.first_token_at is None:
            request.first_token_at = time.monotonic()
        eos = token in self.tokenizer.eos_token_ids and not request.params.ignore_eos
        at_limit = len(request.generated) >= request.params.max_tokens
        delta, stopped = self._text_delta(request, final=eos or at_limit)
        finish = "stop" if eos or stopped else "length" if at_limit else None
        event = Event(
            "token",
            text=delta,
            token_id=token,
            prompt_tokens=len(request.prompt_ids),
            completion_tokens=len(request.generated),
        )
        request.sink(event)
        if finish is not None:
            self._finish(request, finish)
            return False
        return True

    def _finish(self, request: Request, reason: str) -> None:
        log.log(
            logging.INFO if reason == "cancelled" else logging.DEBUG,
            "request finished",
            extra={
                "fields": {
                    "slot": request.slot,
                    "reason": reason,
                    "completion_tokens": len(request.generated),
                    "prompt_tokens": len(request.prompt_ids),
                    "seconds": f"{time.monotonic() - request.created:.3f}",
                }
            },
        )
        self._send([OP_FREE, request.slot, 0, 0])
        self.worker.apply([OP_FREE, request.slot, 0, 0], None)
        request.sink(
            Event(
                "done",
                finish_reason=reason,
                prompt_tokens=len(request.prompt_ids),
                completion_tokens=len(request.generated),
            )
        )

    def _text_delta(self, request: Request, final: bool) -> tuple[str, bool]:
        """New text since the last event, and whether a stop string ended it.

        A token can end in the middle of a UTF-8 character; its text is held back until the next
        token completes it, or sent as it is when this is the request's last token.
        """
        ids = [t for t in request.generated if t not in self.tokenizer.eos_token_ids]
        text = self.tokenizer.decode(ids)
        for stop in request.params.stop:
            at = text.find(stop, max(len(request.text) - len(stop), 0))
            if at >= 0:
                delta, request.text = text[len(request.text) : at], text[:at]
                return delta, True
        if text.endswith("\ufffd") and not final:
            return "", False
        delta, request.text = text[len(request.text) :], text
        return delta, False

    @staticmethod
    def _sample(logits: torch.Tensor, request: Request) -> int:
        params = request.params
        if params.temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=request.generator))

"""The kworkers sides: a ``Worker`` with default settings and a no-op handler (sync, async, and
batch once ``Worker`` has batch handlers), run by ``benchmarks.child`` in a process of its own.

The handler's whole work is ``meter.hit()``, as on every other side. The read-ahead cap goes in
through the public ``consumer_config``; ``options.commit`` picks the commit policy
(``default`` or ``never``, for the commits benchmark); ``options.rate_limit`` a rate limit (the
pace benchmark); ``options.holds`` False switches backpressure's hold off (the hot benchmark's
control); ``options.gc`` is what an application may do with the interpreter's garbage collector
before it runs the worker (``{"threshold": [700, 10, 10], "freeze": true}``: ``gc.set_threshold``,
``gc.freeze`` once the worker is built; ``benchmarks.common.tune_collector``), the ``+gc`` sides;
``options.producer_config`` the hand-off producer's librdkafka properties.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.child import Meter, Unavailable, stop_when_done
from benchmarks.common import cpu_delta, thread_cpu, tune_collector
from kworkers import CommitPolicy, Message, Worker

NEVER = CommitPolicy(interval_s=3600, max_completions=10**9)
POLICIES = {"default": CommitPolicy(), "never": NEVER}


def run_worker(spec: dict[str, Any], meter: Meter,
               register: Callable[[Worker], None], execution: str = "threads",
               **settings: Any) -> dict[str, Any]:
    """Builds the worker (``settings``: more of ``Worker``'s), lets ``register`` give it its
    handler, and runs it until ``n``."""
    options = spec.get("options", {})
    if options.get("holds") is False:  # benchmarks.hot's control: pause, never hold
        from kworkers.consumer import processor

        processor.HOLDS = False
    pace: dict[str, Any] = {}
    if options.get("rate_limit"):  # benchmarks.pace: {"per_second", "scope", "store"}
        from kworkers.pace import RateLimit, open_buckets

        rl = dict(options["rate_limit"])
        store = rl.pop("store", None)
        pace["rate_limit"] = RateLimit(**rl, name=spec["group"])
        if store:
            pace["rate_store"] = open_buckets(store)
    w = Worker(topics=[spec["topic"]], group_id=spec["group"],
               bootstrap_servers=spec["bootstrap"],
               consumer_config=dict(spec.get("consumer_config") or {}),
               producer_config=dict(options.get("producer_config") or {}),
               commit=POLICIES[options.get("commit", "default")], execution=execution,
               guarantee=options.get("guarantee", "at_least_once"), **pace, **settings)
    register(w)
    w.create_topics()  # tier and DLQ topics: set-up, before the clock starts
    tune_collector(options)
    extra: dict[str, Any] = {}

    profiler = None
    if options.get("profile_to"):  # benchmarks.profile: py-spy over the window only
        from benchmarks.profile import SelfProfiler

        profiler = SelfProfiler(options["profile_to"])

    def stop() -> None:
        # Read at the n-th record: commits so far (the stop adds a final one), CPU per thread.
        extra["commits"] = w.metrics.commits.labels(w.config.group_id)._value.get()
        if pace:
            extra["tokens"] = w.metrics.rate_tokens.labels(w.config.group_id)._value.get()
            extra["waits"] = w.metrics.rate_wait.labels(w.config.group_id)._sum.get()
        extra["threads"] = cpu_delta(before, thread_cpu())
        if profiler is not None:
            profiler.stop()
        w.stop()

    stop_when_done(meter, stop, float(spec.get("timeout", 600)))
    if profiler is not None:
        profiler.start()
    before = thread_cpu()
    meter.start()
    w.run(install_signals=False)
    meter.wait(0)
    return extra


def sync_noop(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    hit = meter.hit

    def register(w: Worker) -> None:
        @w.handler
        def handle(msg: Message) -> None:
            hit()

    return run_worker(spec, meter, register)


def inline_noop(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """The sync no-op handler on the poll thread (``execution="inline"``, opt-in)."""
    hit = meter.hit

    def register(w: Worker) -> None:
        @w.handler
        def handle(msg: Message) -> None:
            hit()

    return run_worker(spec, meter, register, execution="inline")


def async_noop(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    hit = meter.hit

    def register(w: Worker) -> None:
        @w.handler
        async def handle(msg: Message) -> None:
            hit()

    return run_worker(spec, meter, register)


def batch_noop(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """A handler given a list of records. The one place to adapt once ``Worker`` has batch
    handlers (issue #18 item 3): the registration below."""
    hit_many = meter.hit_many
    register_batch = getattr(Worker, "batch_handler", None)
    if register_batch is None:
        raise Unavailable("kworkers has no batch handlers yet (Worker.batch_handler, "
                          "issue #18 item 3)")

    def register(w: Worker) -> None:
        def handle(batch: list[Message]) -> None:
            hit_many(len(batch))

        register_batch(w, handle)

    return run_worker(spec, meter, register)


def one_output(spec: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """A handler that produces one output per record (``activity.produce``) to
    ``options.output``, under ``options.guarantee`` (the eos benchmark)."""
    from kworkers import activity

    hit = meter.hit
    out = spec["options"]["output"]

    def register(w: Worker) -> None:
        @w.handler
        def handle(msg: Message) -> None:
            activity.produce(out, msg.value, key=msg.key)
            hit()

    return run_worker(spec, meter, register)

"""Assembles a share-group loop from the worker's parts (``Worker`` calls this in share mode).

The order matters: the group's start position is set before the first member joins, and the
group's lock and delivery limit are read before any record is taken, because the deadline and
the last-delivery rule derive from them (``ShareRules``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kworkers.clock import Clock
from kworkers.config import WorkerConfig
from kworkers.consumer.ports import Invoker
from kworkers.consumer.runner import Runner
from kworkers.errors import ConfigError
from kworkers.metrics import Metrics
from kworkers.share.gate import LockGate
from kworkers.share.ports import RecordKey, SharePort
from kworkers.share.processor import ShareProcessor
from kworkers.share.rules import ShareRules
from kworkers.supervision import Supervisor

log = logging.getLogger("kworkers.share")

#: builds the runner for the share loop: (handler deadline, invoker) -> Runner
MakeRunner = Callable[[float, Invoker], Runner]


def kafka_share_port(config: WorkerConfig) -> SharePort:
    from kworkers.share.consumer import ShareConsumerAdapter

    return ShareConsumerAdapter(config.client, config.group_id, config.consumer_config)


def share_loop(config: WorkerConfig, port: SharePort, make_runner: MakeRunner, invoke: Invoker,
               is_async: bool, metrics: Metrics, clock: Clock,
               supervisor: Supervisor) -> ShareProcessor:
    from kworkers.share.consumer import offset_reset_of

    port.ensure_offset_reset(offset_reset_of(config.consumer_config))
    group = port.group_settings()
    rules = ShareRules.of(group, config.message_timeout)
    log.info("share group %s: lock %.0fs, delivery limit %d, handler deadline %.1fs",
             port.group, rules.lock_s, rules.delivery_limit, rules.deadline_s)
    if group.renew_enabled:
        log.info("share group %s allows RENEW (share.renew.acknowledge.enable) but "
                 "confluent-kafka 2.16 cannot send it: handlers stay within the lock",
                 port.group)
    held: dict[RecordKey, float] = {}
    gate = LockGate(invoke, rules, clock, held, is_async)
    runner = make_runner(rules.deadline_s, gate)
    if runner.batch is not None:
        raise ConfigError("batch handlers are not supported in share mode yet: a share group "
                          "acknowledges record by record (use @worker.handler)")
    return ShareProcessor(config, port, config.topics, runner, gate, rules, metrics, clock,
                          supervisor)

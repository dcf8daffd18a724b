"""What one router transaction costs next to an acknowledged produce and a plain commit.

    .venv/bin/python -m bench.transaction_cost

Starts its own embedded broker. For k = 1, 10, 100, 500 records of 500 bytes, the median of 60:
``PartitionTransactions.commit`` (begin, produce, send the offset, commit) against producing the
same records, waiting for Kafka's acknowledgements and committing the offset synchronously. The
figure behind the decision to keep the deliver and retry hand-offs out of transactions
(docs/decisions.md, "Kafka").
"""

from __future__ import annotations

import statistics
import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from pipeline.core.settings import Settings
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import consumer_config, create_topics, make_producer, topics_for
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.transactions import PartitionTransactions

ROUNDS = 60


def main() -> None:
    with EmbeddedBroker(port=0) as broker:
        settings = Settings(
            bootstrap_servers=broker.bootstrap_servers,
            topic_prefix=f"cost-{uuid.uuid4().hex[:6]}.",
            partitions=1,
            session_timeout=6.0,
        )
        create_topics(settings)
        topics = topics_for(settings)
        producer = make_producer(settings)
        producer.produce(topics.calls, b"call")
        producer.flush(10)
        consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}router"))
        consumer.subscribe([topics.calls])
        while not consumer.consume(1, 0.5):
            pass
        group = consumer.consumer_group_metadata()
        transactions = PartitionTransactions(settings, topics.calls, 0)
        acked = AckedProducer(settings)
        offset = [TopicPartition(topics.calls, 0, 1)]
        try:
            for k in (1, 10, 100, 500):
                records = [(topics.deliveries, b"key", b"x" * 500)] * k
                in_transaction, plain = [], []
                for _ in range(ROUNDS):
                    started = time.perf_counter()
                    transactions.commit(records, next_offset=1, group=group)
                    in_transaction.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    for record in records:
                        acked.produce(*record)
                    acked.flush()
                    consumer.commit(offsets=offset, asynchronous=False)
                    plain.append(time.perf_counter() - started)
                print(
                    f"{k:>4} records: transaction {statistics.median(in_transaction) * 1000:.1f} ms, "
                    f"acked produce + commit {statistics.median(plain) * 1000:.1f} ms"
                )
        finally:
            transactions.close()
            consumer.close()


if __name__ == "__main__":
    main()

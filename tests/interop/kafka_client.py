"""A foreign Kafka client for the interop tests: a small CLI over confluent-kafka
(librdkafka), so the Rust integration tests can check that what we write and
commit reads the same from a client that shares none of our code.

Run by `tests/it/interop.rs` with the python that `cargo xtask integration`
names in $KAFKA_RETRY_PYTHON (a venv with confluent-kafka installed).

Output is JSON on stdout: one document, or JSON lines for `consume`. Errors go
to stderr with a non-zero exit. Every operation is bounded in time, and the
script never creates topics.
"""

import argparse
import faulthandler
import json
import os
import sys
import time

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition

# How long a single broker round trip (committed offsets, a flush) may take.
REQUEST_TIMEOUT_S = 20.0

# How long one poll() blocks, so the idle timeout is checked promptly.
POLL_INTERVAL_S = 0.2


class Failure(Exception):
    """An error that ends the command with a message and exit code 1."""


def main():
    args = parse_args()
    # A watchdog thread: even a call stuck inside librdkafka cannot outlive
    # the deadline; it dumps the Python stacks to stderr and exits.
    faulthandler.dump_traceback_later(args.deadline_s, exit=True)
    try:
        args.command(args)
    except (Failure, KafkaException) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        faulthandler.cancel_dump_traceback_later()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--deadline-s", type=float, default=60.0, help="kill the whole command after this many seconds (default 60)"
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    committed = commands.add_parser("committed", help="print a group's committed offsets per partition")
    committed.add_argument("--brokers", required=True)
    committed.add_argument("--group", required=True)
    committed.add_argument("--topic", required=True)
    committed.add_argument("--partitions", type=int, required=True, help="the topic's partition count")
    committed.set_defaults(command=cmd_committed)

    consume = commands.add_parser("consume", help="join a group, print what it is assigned and reads, leave")
    consume.add_argument("--brokers", required=True)
    consume.add_argument("--group", required=True)
    consume.add_argument("--topic", required=True)
    consume.add_argument("--max-records", type=int, required=True)
    consume.add_argument(
        "--idle-timeout-s", type=float, required=True, help="stop after this many seconds without a record"
    )
    consume.add_argument("--commit", action="store_true", help="commit synchronously after each record")
    consume.set_defaults(command=cmd_consume)

    produce = commands.add_parser("produce", help="produce one record with acks=all")
    produce.add_argument("--brokers", required=True)
    produce.add_argument("--topic", required=True)
    produce.add_argument("--partition", type=int, required=True)
    produce.add_argument("--key", required=True)
    produce.add_argument("--value", required=True)
    produce.add_argument(
        "--zeros", type=int, metavar="BYTES", help="instead of --value's text, a value of this many zero bytes"
    )
    produce.add_argument(
        "--header", action="append", default=[], type=parse_header, metavar="NAME=VALUE", help="repeatable"
    )
    produce.add_argument(
        "--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"], help="batch compression"
    )
    produce.add_argument(
        "--null-header", action="append", default=[], metavar="NAME", help="a header whose value is null; repeatable"
    )
    produce.add_argument(
        "--headers-json",
        metavar="JSON",
        help='every header, in order, as a JSON list of [name, value-or-null] (instead of --header/--null-header)',
    )
    produce.add_argument(
        "--abort-transaction",
        metavar="TRANSACTIONAL_ID",
        help="produce inside a transaction with this id, then abort it",
    )
    produce.add_argument(
        "--commit-transaction",
        metavar="TRANSACTIONAL_ID",
        help="produce inside a transaction with this id, then commit it",
    )
    produce.set_defaults(command=cmd_produce)

    fill = commands.add_parser("fill", help="produce records evenly over partitions, as fast as librdkafka batches them")
    fill.add_argument("--brokers", required=True)
    fill.add_argument("--topic", required=True)
    fill.add_argument("--partitions", type=int, required=True)
    fill.add_argument("--records", type=int, required=True)
    fill.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    fill.set_defaults(command=cmd_fill)

    drain = commands.add_parser("drain", help="read every partition from the start until RECORDS records came; print the rate")
    drain.add_argument("--brokers", required=True)
    drain.add_argument("--topic", required=True)
    drain.add_argument("--partitions", type=int, required=True)
    drain.add_argument("--records", type=int, required=True)
    drain.set_defaults(command=cmd_drain)

    return parser.parse_args()


def parse_header(text):
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"header {text!r} is not NAME=VALUE")
    return name, value.encode()


def common_config(brokers):
    config = {
        "bootstrap.servers": brokers,
        "client.id": "kafka-retry-interop",
        # Tests create their topics; a typo must fail, not make a new one.
        "allow.auto.create.topics": False,
        "error_cb": report_error,
    }
    # Against a broker that requires SASL or TLS, the suite's settings.
    mechanism = os.environ.get("KAFKA_RETRY_SASL_MECHANISM")
    protocol = os.environ.get("KAFKA_RETRY_SECURITY_PROTOCOL") or ("SASL_PLAINTEXT" if mechanism else "PLAINTEXT")
    config["security.protocol"] = protocol
    if mechanism:
        config.update(
            {
                "sasl.mechanism": mechanism,
                "sasl.username": os.environ["KAFKA_RETRY_SASL_USERNAME"],
                "sasl.password": os.environ["KAFKA_RETRY_SASL_PASSWORD"],
            }
        )
    for variable, setting in [
        ("KAFKA_RETRY_SSL_CA_LOCATION", "ssl.ca.location"),
        ("KAFKA_RETRY_SSL_CERTIFICATE_LOCATION", "ssl.certificate.location"),
        ("KAFKA_RETRY_SSL_KEY_LOCATION", "ssl.key.location"),
    ]:
        if os.environ.get(variable):
            config[setting] = os.environ[variable]
    return config


def consumer_config(brokers, group):
    return {
        **common_config(brokers),
        "group.id": group,
        # tansu has no KIP-848 consumer protocol.
        "group.protocol": "classic",
        "partition.assignment.strategy": "range",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }


def report_error(error):
    # librdkafka retries transport errors by itself; they are worth seeing
    # but end the command only when fatal (the deadline bounds the rest).
    print(f"kafka: {error}", file=sys.stderr)
    if error.fatal():
        raise KafkaException(error)


def emit(document):
    print(json.dumps(document), flush=True)


def decode(data):
    return None if data is None else data.decode("utf-8", errors="replace")


def cmd_committed(args):
    consumer = Consumer(consumer_config(args.brokers, args.group))
    try:
        # No subscribe(): asking for committed offsets must not join the group.
        wanted = [TopicPartition(args.topic, p) for p in range(args.partitions)]
        offsets = consumer.committed(wanted, timeout=REQUEST_TIMEOUT_S)
    finally:
        consumer.close()
    result = {}
    for tp in offsets:
        if tp.error is not None:
            raise Failure(f"committed offset of {tp.topic}[{tp.partition}] for group {args.group}: {tp.error}")
        result[str(tp.partition)] = None if tp.offset == OFFSET_INVALID else tp.offset
    emit(result)


def cmd_consume(args):
    consumer = Consumer(consumer_config(args.brokers, args.group))

    def on_assign(_consumer, partitions):
        emit({"event": "assigned", "partitions": sorted(tp.partition for tp in partitions)})

    try:
        consumer.subscribe([args.topic], on_assign=on_assign)
        received = 0
        last_record = time.monotonic()
        while received < args.max_records and time.monotonic() - last_record < args.idle_timeout_s:
            message = consumer.poll(POLL_INTERVAL_S)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(message.error())
            emit(
                {
                    "event": "record",
                    "partition": message.partition(),
                    "offset": message.offset(),
                    "key": decode(message.key()),
                    "value": decode(message.value()),
                    "headers": {name: decode(value) for name, value in message.headers() or []},
                    # In order, repeated names and null values included.
                    "header_list": [[name, decode(value)] for name, value in message.headers() or []],
                }
            )
            if args.commit:
                for tp in consumer.commit(message=message, asynchronous=False) or []:
                    if tp.error is not None:
                        raise Failure(f"commit of {tp.topic}[{tp.partition}] at {tp.offset} failed: {tp.error}")
            received += 1
            last_record = time.monotonic()
    finally:
        # Leaves the group, so a later member is not kept waiting for a rebalance.
        consumer.close()
    emit({"event": "closed"})


def headers_of(args):
    if args.headers_json is None:
        return args.header + [(name, None) for name in args.null_header]
    return [(name, None if value is None else value.encode()) for name, value in json.loads(args.headers_json)]


def cmd_produce(args):
    config = {
        **common_config(args.brokers),
        "acks": "all",
        "compression.type": args.compression,
        # Bounds the delivery attempt, unknown-topic waits included.
        "message.timeout.ms": int(REQUEST_TIMEOUT_S * 1000),
    }
    if args.zeros:
        # librdkafka checks a record's size before compression.
        config["message.max.bytes"] = max(1_000_000, args.zeros * 2)
    transactional_id = args.abort_transaction or args.commit_transaction
    if transactional_id:
        config["transactional.id"] = transactional_id
    producer = Producer(config)
    if transactional_id:
        producer.init_transactions(REQUEST_TIMEOUT_S)
        producer.begin_transaction()
    delivered = []

    def on_delivery(error, message):
        delivered.append((error, message))

    producer.produce(
        args.topic,
        key=args.key.encode(),
        value=bytes(args.zeros) if args.zeros else args.value.encode(),
        partition=args.partition,
        headers=headers_of(args),
        on_delivery=on_delivery,
    )
    # flush() gives up at its timeout; message.timeout.ms makes delivery fail before that.
    undelivered = producer.flush(REQUEST_TIMEOUT_S + 5)
    if undelivered or not delivered:
        raise Failure(f"the record to {args.topic}[{args.partition}] was not delivered within the timeout")
    error, message = delivered[0]
    if error is not None:
        raise Failure(f"the record to {args.topic}[{args.partition}] was not delivered: {error}")
    if args.abort_transaction:
        producer.abort_transaction(REQUEST_TIMEOUT_S)
    if args.commit_transaction:
        producer.commit_transaction(REQUEST_TIMEOUT_S)
    emit({"partition": message.partition(), "offset": message.offset()})


def bench_value(n):
    """A record like an order event: some fields that repeat, some that do not."""
    return json.dumps(
        {"order_id": f"order-{n}", "customer": f"c-{n % 997}", "amount": "42.50", "currency": "EUR", "nonce": os.urandom(48).hex()}
    ).encode()


def cmd_fill(args):
    producer = Producer(
        {
            **common_config(args.brokers),
            "acks": "all",
            "compression.type": args.compression,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "message.timeout.ms": 120_000,
        }
    )
    failed = []

    def on_delivery(error, _message):
        if error is not None:
            failed.append(error)

    per_partition = args.records // args.partitions
    for p in range(args.partitions):
        for i in range(per_partition):
            while True:
                try:
                    producer.produce(args.topic, key=f"key-{p}-{i}".encode(), value=bench_value(i), partition=p, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    if producer.flush(120) or failed:
        raise Failure(f"not every record was delivered: {failed[:3]}")
    emit({"records": per_partition * args.partitions})


def cmd_drain(args):
    consumer = Consumer(
        {
            **common_config(args.brokers),
            "group.id": "kafka-retry-bench-drain",
            "enable.auto.commit": False,
            "fetch.max.bytes": 1 << 20,
            "max.partition.fetch.bytes": 1 << 20,
        }
    )
    consumer.assign([TopicPartition(args.topic, p, 0) for p in range(args.partitions)])
    received = 0
    started = None
    try:
        while received < args.records:
            batch = consumer.consume(num_messages=1000, timeout=POLL_INTERVAL_S)
            for message in batch:
                if message.error() is None:
                    if started is None:
                        started = time.monotonic()
                    received += 1
    finally:
        consumer.close()
    elapsed = time.monotonic() - started
    # Timed from the first record, as the pipeline's drain is.
    emit({"records": received, "records_per_s": round(received / elapsed)})


if __name__ == "__main__":
    main()
